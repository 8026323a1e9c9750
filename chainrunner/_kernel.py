"""The kernel interface and the per-chain inference loop."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

# One table of sample-stat names: sampler field -> ArviZ name (as arviz-base's io_numpyro).
STAT_NAMES: Mapping[str, str] = {
    # blackjax
    "is_divergent": "diverging",
    "acceptance_rate": "acceptance_rate",
    "energy": "energy",
    "num_integration_steps": "n_steps",
    "num_trajectory_expansions": "tree_depth",
    "step_size": "step_size",
    # numpyro
    "diverging": "diverging",
    "accept_prob": "acceptance_rate",
    "num_steps": "n_steps",
    "tree_depth": "tree_depth",
    "n_steps": "n_steps",
    "lp": "lp",
}


def _position(state: Any) -> Any:
    return getattr(state, "position", state)


def default_extract(state: Any, info: Any) -> tuple[Any, dict[str, jax.Array]]:
    """Draw = ``state.position``; stats = the ``info`` fields in ``STAT_NAMES``, and ``lp``.

    ``lp`` is ``state.logdensity`` when the state has it.
    """
    stats = {}
    fields = (
        info._asdict() if hasattr(info, "_asdict") else (info if isinstance(info, Mapping) else {})
    )
    for field, value in fields.items():
        name = STAT_NAMES.get(field)
        if name is not None and name not in stats and jnp.ndim(value) == 0:
            stats[name] = value
    if hasattr(state, "logdensity") and jnp.ndim(state.logdensity) == 0:
        stats["lp"] = state.logdensity
    return _position(state), stats


def default_logdensity(state: Any) -> jax.Array | None:
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
            the compiled program.
        needs_position: ``False`` if ``init`` can start a chain from its key alone
            (``position`` is then ``None`` when ``run`` gets no initial position).

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

    @property
    def functions(self) -> tuple:
        """The kernel's functions: what identifies its compiled programs."""
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
        )


# Adapted kernels are cached on the identity of what they wrap, so that passing the same
# blackjax algorithm twice reuses the same Kernel and hence the same compiled program.
_ADAPTED: OrderedDict[int, tuple[Any, Kernel]] = OrderedDict()
_ADAPTED_MAX = 64


def _memo(obj: Any, build: Callable[[Any], Kernel]) -> Kernel:
    hit = _ADAPTED.get(id(obj))
    if hit is not None and hit[0] is obj:
        _ADAPTED.move_to_end(id(obj))
        return hit[1]
    kernel = build(obj)
    _ADAPTED[id(obj)] = (obj, kernel)
    while len(_ADAPTED) > _ADAPTED_MAX:
        _ADAPTED.popitem(last=False)
    return kernel


def _is_sampling_algorithm(obj: Any) -> bool:
    """A blackjax ``SamplingAlgorithm`` (or any NamedTuple with callable init/step)."""
    return (
        isinstance(obj, tuple)
        and hasattr(obj, "_fields")
        and callable(getattr(obj, "init", None))
        and callable(getattr(obj, "step", None))
    )


def from_blackjax(
    algorithm: Any,
    *,
    logdensity_fn: Callable | None = None,
    adaptation: str | None = None,
    **options: Any,
) -> Any:
    """Wraps a blackjax ``SamplingAlgorithm`` (``init``/``step``) as a chainrunner Kernel.

    The algorithm's parameters (step size, mass matrix, ...) are fixed: they are
    closed over by its functions. Draws are ``state.position``; sample stats are
    the info fields chainrunner knows, in ArviZ names (``is_divergent`` ->
    ``diverging``, ``num_integration_steps`` -> ``n_steps``,
    ``num_trajectory_expansions`` -> ``tree_depth``, ``acceptance_rate``,
    ``energy``) plus ``lp`` from ``state.logdensity``.

    With ``adaptation`` the parameters are adapted during ``cr.run``'s
    ``num_warmup`` steps instead (see docs/warmup.md); ``algorithm`` is then the
    blackjax *factory* and ``logdensity_fn`` is required:

    - ``"window"``: Stan's window adaptation of the step size and inverse mass
      matrix, per chain, inside the sampling program. ``algorithm`` is called as
      ``algorithm(logdensity_fn, step_size, inverse_mass_matrix, **extra)``
      (``blackjax.nuts``, ``blackjax.hmc``, ...). Options:
      ``is_mass_matrix_diagonal=True``, ``initial_step_size=1.0``,
      ``target_acceptance_rate=0.8``; other options go to the factory (e.g.
      ``num_integration_steps`` for HMC).
    - ``"chees"``: ChEES over all chains, then jittered HMC
      (``algorithm=blackjax.dynamic_hmc``). Options: ``step_size=0.1`` (initial),
      ``learning_rate=0.025`` (Adam), ``jitter_amount=1.0``,
      ``target_acceptance_rate=0.651``, ``decay_rate=0.5``, ``max_leapfrog_steps=1000``.
    - ``"meads"``: MEADS over all chains, then generalised HMC
      (``algorithm=blackjax.ghmc``). Options: ``num_folds=None`` (the largest of
      4, 3, 2, 1 dividing the chains with four per fold, else 1), ``step_size_multiplier=0.5``,
      ``damping_slowdown=1.0``, ``divergence_threshold=1000``.

    Args:
        algorithm: e.g. ``blackjax.nuts(logdensity_fn, step_size, inverse_mass_matrix)``;
            with ``adaptation``, the factory (``blackjax.nuts``, ``blackjax.dynamic_hmc``,
            ``blackjax.ghmc``).
        logdensity_fn: the log density of one chain's position (with ``adaptation`` only).
        adaptation: ``None`` (fixed parameters), ``"window"``, ``"chees"`` or ``"meads"``.
        **options: the adaptation's options (above).

    Returns:
        A ``Kernel``; the same one for the same algorithm object, so repeated runs
        reuse the compiled program. With ``adaptation``: an object ``cr.run`` accepts
        as a kernel, the same one for the same arguments.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
        >>> kernel = cr.from_blackjax(nuts)
        >>> kernel is cr.from_blackjax(nuts)
        True
        >>> import jax
        >>> adaptive = cr.from_blackjax(blackjax.nuts, adaptation="window",
        ...                             logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
        >>> trace = cr.run(adaptive, jax.random.key(0), jnp.zeros((4, 2)), 20, num_warmup=30,
        ...                progress=False)
        >>> trace.stats["step_size"].shape
        (4, 20)
    """
    if adaptation is not None:
        from ._warmup import from_blackjax_adaptive

        return from_blackjax_adaptive(
            algorithm, logdensity_fn=logdensity_fn, adaptation=adaptation, **options
        )
    if logdensity_fn is not None or options:
        given = sorted(options) + (["logdensity_fn"] if logdensity_fn is not None else [])
        raise TypeError(
            f"from_blackjax: {given} apply only with adaptation='window'|'chees'|'meads'; "
            "without adaptation pass a built algorithm, e.g. blackjax.nuts(logdensity_fn, "
            "step_size, inverse_mass_matrix)."
        )
    if isinstance(algorithm, Kernel):
        return algorithm
    if not _is_sampling_algorithm(algorithm):
        raise TypeError(
            "from_blackjax: algorithm must be a blackjax SamplingAlgorithm with init and "
            f"step (e.g. blackjax.nuts(logdensity_fn, step_size, inverse_mass_matrix)), got "
            f"{type(algorithm).__name__}."
        )

    def build(alg):
        def init(position, rng_key):
            return alg.init(position, rng_key)

        return Kernel(init=init, step=alg.step)

    return _memo(algorithm, build)


def as_kernel(kernel: Any, where: str) -> Kernel:
    """Turns anything ``run`` accepts into a ``Kernel``, or raises ``TypeError``."""
    if isinstance(kernel, Kernel):
        return kernel
    if _is_sampling_algorithm(kernel):
        return from_blackjax(kernel)
    raise TypeError(
        f"{where}: kernel must be a blackjax SamplingAlgorithm, a numpyro MCMCKernel, or a "
        f"cr.Kernel (from cr.from_blackjax / cr.from_numpyro), got {type(kernel).__name__}."
    )


def chunk_loop(
    kernel: Kernel, chunk_len: int, thinning: int
) -> Callable[[Any, jax.Array, jax.Array, jax.Array], tuple[Any, tuple[Any, dict]]]:
    """The inference loop of one chain for one chunk of at most ``chunk_len`` draws.

    Returns ``loop(state, step_key, start, n_valid) -> (state, (draws, stats))``.
    Draw ``i`` runs kernel steps ``start + i * thinning + j`` (``j < thinning``); step
    ``t`` uses the key ``fold_in(step_key, t)``, so neither the chunking nor the
    layout changes which random numbers a chain sees. Only the first ``n_valid``
    draws are run (a loop with a run-time trip count that does not depend on the
    chain, so under ``vmap`` it stays one loop); the outputs keep ``chunk_len`` rows
    and the rest are zeros. One compiled program thus serves every chunk, including
    a shorter last one, with no per-step branch (a ``lax.cond`` per draw measured
    ~17% slower for NUTS on CPU).
    """

    def step_keys(step_key, first, n):
        # Keys of steps first .. first + n - 1, derived in one vectorised call: the same
        # bits as one fold_in per step, without a hash (a small loop on CPU) in every step.
        return jax.vmap(jax.random.fold_in, (None, 0))(step_key, first + jnp.arange(n))

    def advance(state, keys):
        def one(j, s):
            return kernel.step(keys[j], s)[0]

        if thinning > 1:
            state = jax.lax.fori_loop(0, thinning - 1, one, state)
        state, info = kernel.step(keys[thinning - 1], state)
        return state, kernel.extract(state, info)

    def loop(state, step_key, start, n_valid):
        # Without thinning, the chunk's keys at once (chunk_len keys: less memory than
        # its draws); with thinning, each draw's keys.
        chunk_keys = step_keys(step_key, start, chunk_len) if thinning == 1 else None

        def keys_of(i):
            if chunk_keys is not None:
                return jax.lax.dynamic_slice_in_dim(chunk_keys, i, 1)
            return step_keys(step_key, start + i * thinning, thinning)

        out_shape = jax.eval_shape(advance, state, keys_of(0))[1]
        buffers = jax.tree.map(lambda s: jnp.zeros((chunk_len, *s.shape), s.dtype), out_shape)

        def body(i, carry):
            state, buffers = carry
            state, out = advance(state, keys_of(i))
            buffers = jax.tree.map(
                lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, i, 0), buffers, out
            )
            return state, buffers

        return jax.lax.fori_loop(0, n_valid, body, (state, buffers))

    return loop
