"""The kernel interface: ``Kernel`` (one chain's pure functions) and ``Adapter``.

A front end (blackjax, numpyro, PyMC, a hand-written kernel) reaches ``run`` through one
declared interface, ``Adapter``: the ``Kernel`` to run for a given warmup length, and the
optional extras a front end may add (cross-chain warmup, ArviZ groups, a hint for
chains that start at a non-finite log density). This module depends on no other
chainrunner module but ``_naming``: adapters, warmup and ``run`` build on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from ._naming import info_stats


def default_extract(state: Any, info: Any) -> tuple[Any, dict[str, jax.Array]]:
    """Draw = ``state.position``; stats = the ``info`` fields in ``STAT_NAMES``, and ``lp``.

    ``lp`` is ``state.logdensity`` when the state has it.
    """
    stats = info_stats(info)
    if hasattr(state, "logdensity") and jnp.ndim(state.logdensity) == 0:
        stats["lp"] = state.logdensity
    if not hasattr(state, "position") and hasattr(state, "_fields"):
        raise TypeError(
            f"run: this kernel's state ({type(state).__name__}, fields {list(state._fields)}) "
            "has no `position`, which the default extract stores as the draws. Pass "
            "cr.Kernel(init=..., step=..., extract=lambda state, info: (draws, stats)) with "
            "the draws you want (blackjax.orbital_hmc: state.positions and state.weights)."
        )
    return getattr(state, "position", state), stats


def default_logdensity(state: Any, params: Any = None) -> jax.Array | None:
    """``state.logdensity`` if the state carries it, else ``None``."""
    value = getattr(state, "logdensity", None)
    return None if value is None or jnp.ndim(value) != 0 else value


class Kernel(NamedTuple):
    """A Markov kernel as chainrunner runs it: pure functions of one chain.

    Attributes:
        init: ``init(position, rng_key) -> state`` for one chain.
        step: ``step(rng_key, state) -> (state, info)`` for one chain.
        extract: ``extract(state, info) -> (draw, stats)``: what is stored per draw.
            ``draw`` is any pytree of arrays; ``stats`` a dict of scalars in ArviZ
            names (``diverging``, ``lp``, ``acceptance_rate``, ...). The default
            stores ``state.position`` and the known ``info`` fields.
        logdensity: ``logdensity(state) -> scalar`` used to reject non-finite
            starting points; ``None`` to skip that check. The default reads
            ``state.logdensity`` if present.
        params: ``None``, or a pytree of arrays (e.g. a model's data) that enters the
            compiled program as an argument instead of a constant: then every function
            above takes it as a last argument (``init(position, rng_key, params)``,
            ``step(rng_key, state, params)``, ``extract(state, info, params)``,
            ``logdensity(state, params)``), and new values of the same shapes reuse
            the compiled program. They are shared by every chain (replicated on each
            device). Parameters of each chain's own (a per-chain step size or mass
            matrix) travel in the chain state instead, with a leading chain axis across
            chains: that is how window adaptation and blackjax's per-chain adaptations
            carry them (``cr.adapted_parameters`` reads them).
        needs_position: ``False`` if ``init`` can start a chain from its key alone
            (``position`` is then ``None`` when ``run`` gets no initial position).
        ensemble: ``None`` for independent chains; an ``Ensemble`` for walkers that move
            together (numpyro's ``AIES``, ``ESS``). ``init`` and ``step`` are then the
            ensemble's whole-ensemble functions, and ``extract`` and ``logdensity`` take
            one walker's row of ``Ensemble.rows(state)`` (and its row of the step's info).
        machine: ``None``, or the same kernel as a state machine for chains that share
            a device: ``machine(extract, chunk_len)`` gives ``loop(states, step_keys,
            start, n_valid) -> (states, (draws, stats))`` for a batch of chains (leading
            axis), which runs draws ``start .. start + n_valid - 1`` of each chain with
            the keys ``step`` would get, without a chain waiting for the batch's
            longest transition (``cr.from_blackjax`` sets it for ``blackjax.nuts``, fixed,
            window- or diagonal-Fisher-adapted).
            Used where chains are vmapped and ``thinning`` is 1.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> def step(rng_key, state):  # an AR(1) chain, stationary N(0, 1)
        ...     x = 0.5 * state + jnp.sqrt(0.75) * jax.random.normal(rng_key, state.shape)
        ...     return x, {}
        >>> kernel = cr.Kernel(init=lambda position, rng_key: position, step=step)
        >>> trace = cr.run(kernel, jax.random.key(0), jnp.zeros((4, 2)), 100, progress=False)
        >>> trace.draws.shape
        (4, 100, 2)
    """

    init: Callable[[Any, jax.Array], Any]
    step: Callable[[jax.Array, Any], tuple[Any, Any]]
    extract: Callable[[Any, Any], tuple[Any, dict[str, jax.Array]]] = default_extract
    logdensity: Callable[[Any], jax.Array | None] | None = default_logdensity
    params: Any = None
    needs_position: bool = True
    ensemble: Any = None
    machine: Callable | None = None

    @property
    def functions(self) -> tuple:
        """The kernel's four functions, in order: ``(init, step, extract, logdensity)``."""
        return (self.init, self.step, self.extract, self.logdensity)

    def bind(self, params: Any) -> Kernel:
        """A parameter-free Kernel with ``params`` (possibly traced) applied."""
        if self.params is None:
            return self
        init, step, extract, logdensity = self.functions
        return Kernel(
            init=lambda position, rng_key: init(position, rng_key, params),
            step=lambda rng_key, state: step(rng_key, state, params),
            extract=lambda state, info: extract(state, info, params),
            logdensity=None if logdensity is None else (lambda state: logdensity(state, params)),
            needs_position=self.needs_position,
            ensemble=self.ensemble,
        )


class Ensemble(NamedTuple):
    """The whole-ensemble functions of a kernel whose walkers move together.

    Every device holds the whole ensemble (``_collective``): ``init`` and ``step`` run
    replicated, and hand their per-walker work (log densities) to ``evaluate(fn, xs)``,
    which maps ``fn`` over the rows of ``xs`` spread over the devices and returns every
    row's result to every device. Between chunks the state is stored as one row per
    walker (``rows``), sharded like any chain state, so padding, continuing a trace,
    checkpoints and ``final_state`` work as for independent chains.

    Attributes:
        init: ``init(positions, rng_key, num_walkers, params, evaluate) -> state``;
            ``positions`` has a leading walker axis (or is ``None``).
        step: ``step(state, params, evaluate) -> (state, info)``; ``info`` has one row per
            walker (what ``Kernel.extract`` gets with that walker's row of the state).
        rows: ``rows(state) -> per-walker rows`` (leading walker axis; the ensemble's
            shared values repeated on every row).
        whole: ``whole(rows) -> state``, the inverse of ``rows``.
        prepare: ``prepare(state, params, evaluate)`` or ``None``: called once at the top
            of every compiled program that steps the ensemble, before the steps (numpyro
            kernels build their closures there, once per program rather than per step).

    Examples:
        >>> import jax.numpy as jnp
        >>> import chainrunner as cr
        >>> e = cr.Ensemble(init=lambda p, k, n, params, evaluate: p,
        ...                 step=lambda s, params, evaluate: (s, {}),
        ...                 rows=lambda s: s, whole=lambda r: r)
        >>> e.whole(e.rows(jnp.zeros(4))).shape
        (4,)
    """

    init: Callable
    step: Callable
    rows: Callable
    whole: Callable
    prepare: Callable | None = None


class CrossChainWarmup(NamedTuple):
    """What a cross-chain warmup ends with (``WarmupChunks.finish``).

    Attributes:
        state: the adapted, padded, sharded kernel state to start sampling from.
        kernel: the ``Kernel`` to sample with (adapted shared parameters as ``params``).
        draws: warmup draws ``(chain, draw, ...)`` (numpy), when kept, else ``None``.
        stats: warmup stats, when kept, else ``None``.
        attrs: adapted parameters to record in the trace's ``attrs``.

    Examples:
        >>> import chainrunner as cr
        >>> kernel = cr.Kernel(init=lambda p, k: p, step=lambda k, x: (x, {}), params={"a": 1.0})
        >>> cr.CrossChainWarmup(state=None, kernel=kernel, attrs={"adapted_a": 1.0}).draws is None
        True
    """

    state: Any
    kernel: Kernel
    draws: Any = None
    stats: dict | None = None
    attrs: dict | None = None


class WarmupChunks(NamedTuple):
    """A cross-chain warmup as ``run`` drives it, chunk by chunk: what
    ``Adapter.cross_chain_warmup`` returns.

    ``run`` calls ``start`` once, then ``step`` over the warmup's steps ``chunk`` at a
    time (the last chunk may be shorter), moving the progress bar after each chunk
    and stopping between two on Ctrl-C; then ``finish``.

    Attributes:
        chunk: steps per ``step`` call; the warmup's whole length for a warmup that runs
            as one step (blackjax's tuners: the bar moves once, when it is done).
        start: ``start() -> carry``: the warmup before its first step.
        step: ``step(carry, first, count) -> (carry, draws, stats)``: runs warmup steps
            ``first .. first + count - 1``; ``draws`` and ``stats`` are theirs when the
            warmup draws are kept (numpy, ``(chain, draw, ...)``, the real chains only),
            else ``None``.
        finish: ``finish(carry) -> CrossChainWarmup``: the chains' states and the
            sampling kernel with the parameters adapted so far (its ``draws`` and
            ``stats`` are not used: ``run`` joins the chunks').
        fingerprint: ``None``, or ``fingerprint() -> str``: a digest of what the warmup
            computes (its compiled chunk program's text). With it, a run with a
            ``checkpoint`` writes the carry after every chunk (a pytree of arrays, the
            same structure as ``start()``'s, whose leaves have a leading axis that the
            mesh's ``'chain'`` axis splits) and resumes a warmup of the same fingerprint
            from it, bit for bit; its kept draws have the structure of the sampling
            kernel's.
        length: ``None`` (the warmup's steps are ``num_warmup``), or how many steps the
            warmup runs where that differs (blackjax's MCLMC tuners round their phases'
            lengths); the bar then moves by ``num_warmup / length`` per step.
        label: what the progress bar says while the warmup runs.

    Examples:
        >>> import chainrunner as cr
        >>> kernel = cr.Kernel(init=lambda p, k: p, step=lambda k, x: (x, {}))
        >>> w = cr.WarmupChunks(chunk=10, start=lambda: 0,
        ...                     step=lambda c, first, count: (c + count, None, None),
        ...                     finish=lambda c: cr.CrossChainWarmup(c, kernel))
        >>> c = w.start()
        >>> for first in range(0, 25, w.chunk):
        ...     c, _, _ = w.step(c, first, min(w.chunk, 25 - first))
        >>> w.finish(c).state
        25
    """

    chunk: int
    start: Callable[[], Any]
    step: Callable[[Any, int, int], tuple[Any, Any, Any]]
    finish: Callable[[Any], CrossChainWarmup]
    fingerprint: Callable[[], str] | None = None
    length: int | None = None
    label: str = "warmup (across chains)"

    @classmethod
    def whole(cls, num_warmup: int, warmup: Callable[[], CrossChainWarmup],
              label: str = "warmup (across chains)") -> WarmupChunks:  # fmt: skip
        """A warmup that runs as one step: ``warmup()``, called by the one ``step``.

        Examples:
            >>> import chainrunner as cr
            >>> kernel = cr.Kernel(init=lambda p, k: p, step=lambda k, x: (x, {}))
            >>> w = cr.WarmupChunks.whole(50, lambda: cr.CrossChainWarmup(1, kernel))
            >>> w.chunk, w.finish(w.step(w.start(), 0, 50)[0]).state
            (50, 1)
        """

        def step(carry: Any, first: int, count: int) -> tuple:
            out = warmup()
            return out, out.draws, out.stats

        return cls(num_warmup, lambda: None, step, lambda out: out, label=label)


class WarmupRequest(NamedTuple):
    """What ``run`` hands a cross-chain warmup.

    Attributes:
        rng_key: the run's key; the warmup's keys derive from it alone.
        state: padded chain states (chains ``>= num_chains`` repeat the last one),
            sharded ``P('chain')`` over ``mesh``.
        num_chains: the real chains (the rest are padding, left out of every statistic).
        num_warmup: warmup steps.
        mesh: the run's mesh.
        keep_warmup: also return the warmup draws and stats.
        batch_size: the run's ``batch_size`` option as given (a number, ``None`` or
            ``"auto"``); a warmup that spreads per-chain work over the devices
            (``_collective.spread``) takes its batch width from it, so that its results
            do not depend on the device count.
        chunk_size: warmup steps per chunk (``WarmupChunks.chunk``) for a warmup that
            can stop between steps; ``None``: all of them in one chunk.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> request = cr.WarmupRequest(jax.random.key(0), jnp.zeros((8, 2)), num_chains=6,
        ...                            num_warmup=100, mesh=cr.chain_mesh(1), keep_warmup=False)
        >>> request.num_chains, request.state.shape  # 2 padding chains left out of statistics
        (6, (8, 2))
    """

    rng_key: jax.Array
    state: Any
    num_chains: int
    num_warmup: int
    mesh: Mesh
    keep_warmup: bool
    batch_size: int | str | None = "auto"
    chunk_size: int | None = None


class Adapter:
    """How a front end plugs into ``run``: subclass it and override what applies.

    ``run`` asks an adapter for nothing else (no attribute probing): ``build_kernel`` is the
    one required method; the rest have defaults that add nothing.

    Attributes:
        has_cross_chain_warmup: ``True`` if ``cross_chain_warmup`` adapts over all chains
            before sampling (ChEES, MEADS); ``run`` then calls it after initialising.
        init_error_hint: a sentence added to the error for chains that start at a
            non-finite log density.
        needs_warmup: ``True`` if a fresh run with ``num_warmup=0`` would sample with
            values that were never adapted (a step size of 1.0): ``run`` then raises
            before any work, naming what to pass. A continued trace needs none.
        x64: ``True`` if the kernel's functions trace and run with 64-bit types only (a
            PyMC model of float64): ``run`` then runs under ``jax.enable_x64(True)``, for
            this call only.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> class Noise(cr.Adapter):  # a front end whose chains are white noise
        ...     def build_kernel(self, *, num_warmup, previous_params=None):
        ...         return cr.Kernel(init=lambda x, k: x,
        ...                          step=lambda k, x: (jax.random.normal(k, x.shape), {}))
        >>> cr.run(Noise(), jax.random.key(0), jnp.zeros((2, 3)), 5, progress=False).draws.shape
        (2, 5, 3)
    """

    has_cross_chain_warmup: bool = False
    init_error_hint: str | None = None
    needs_warmup: bool = False
    x64: bool = False

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The ``Kernel`` to run ``num_warmup`` warmup steps and then sample with.

        ``previous_params`` are the ``kernel_params`` of a trace being continued (``None``
        for a fresh run): an adapter whose parameters come from its warmup samples on
        with them.
        """
        raise NotImplementedError

    def cross_chain_warmup(self, request: WarmupRequest) -> WarmupChunks:
        """Adapts over all chains before sampling (only if ``has_cross_chain_warmup``),
        in chunks that ``run`` drives."""
        raise NotImplementedError

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """The parameters the warmup adapted, ``{name: numpy array}`` (or a NamedTuple of
        them), with a leading chain axis where each chain adapts its own; ``None`` (the
        default): the kernel adapts nothing.

        ``run`` asks once, after the run, with the final ``state`` (real chains, on the
        mesh) and the kernel's ``params`` (on the host), and keeps the answer in
        ``Trace.adapted_parameters``, the one place ``cr.adapted_parameters`` reads.
        """
        return None

    def groups(self, draws: Any, *, complete: bool) -> dict[str, dict[str, Any]]:
        """Further ArviZ groups for these draws (``observed_data``, ``log_likelihood``, ...).

        ``complete`` is ``False`` for an interrupted run (skip costly groups then).
        """
        return {}

    def dims(self) -> dict[str, list[str]]:
        """The model's own dimension names per variable (numpyro plates, PyMC dims, ...).

        ``Trace.to_arviz`` uses them unless its ``dims`` says otherwise.
        """
        return {}

    def coords(self) -> dict[str, Any]:
        """The model's own coordinates per dimension name (PyMC ``coords``, ...).

        ``Trace.to_arviz`` uses them unless its ``coords`` says otherwise.
        """
        return {}

    def attrs(self) -> dict[str, Any]:
        """Attributes for the trace, as ArviZ's converters write them
        (``inference_library``, ``inference_library_version``)."""
        return {}


class FixedKernel(Adapter):
    """The adapter of a ready ``Kernel``: the same kernel whatever the warmup."""

    def __init__(self, kernel: Kernel, library: str | None = None):
        self._kernel = kernel
        self._library = library

    def __repr__(self) -> str:
        return f"FixedKernel({self._kernel!r})"

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        return self._kernel

    def attrs(self) -> dict[str, Any]:
        return library_attrs(self._library) if self._library else {}


def library_attrs(name: str) -> dict[str, str]:
    """``{"inference_library": name, "inference_library_version": its version}``."""
    from importlib import metadata

    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"inference_library": name, "inference_library_version": version}
