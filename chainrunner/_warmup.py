"""Warmup (adaptation) for blackjax kernels: per-chain window adaptation, cross-chain ChEES/MEADS.

``cr.from_blackjax(factory, logdensity_fn=..., adaptation=...)`` lands here.

- ``"window"`` (Stan's windowed adaptation of the step size and a diagonal or dense
  inverse mass matrix, per chain) runs *inside* chainrunner's sampling loop: the chain
  state carries blackjax's adaptation state and the global step number, and the step
  rebuilds the kernel (``factory(logdensity_fn, step_size, inverse_mass_matrix)``) from the
  current adapted values, so warmup and sampling are one compiled program.
- ``"chees"`` and ``"meads"`` need statistics over all chains. They run before sampling,
  under plain ``jax.jit`` on the sharded chain states (the compiler inserts the
  cross-device reductions), over the real chains only: the padding chains that
  chainrunner adds to fill the devices are sliced off first, so they never enter a
  statistic. Sampling then runs under ``shard_map`` with the adapted shared parameters
  as ``Kernel.params``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _distributed, _mesh
from ._kernel import Kernel, default_extract

__all__ = ["ADAPTATIONS", "WindowState", "adapted_parameters", "from_blackjax_adaptive"]

ADAPTATIONS = ("window", "chees", "meads")
"""The values of ``from_blackjax(..., adaptation=...)``."""

# Chain-independent salt for the keys of the cross-chain warmup: those keys come from
# (rng_key, salt) only, never from the layout.
_CROSS_CHAIN_SALT = 0x57A2


def _strong(x: Any) -> jax.Array:
    """``x`` as a strongly typed array (scan carries reject weak types that change)."""
    x = jnp.asarray(x)
    return jnp.array(x, dtype=x.dtype)


# -- window adaptation (per chain, inside the sampling loop) ----------------------------


class WindowState(NamedTuple):
    """The chain state of a window-adapted kernel.

    Attributes:
        state: the blackjax kernel state (``state.position`` is the draw).
        adaptation: blackjax's ``WindowAdaptationState``: dual-averaging state, Welford
            state, and the current ``step_size`` and ``inverse_mass_matrix``. After
            warmup these two hold the final adapted values (blackjax's ``final``).
        step: the global number of the next step (chainrunner's step numbering).
    """

    state: Any
    adaptation: Any
    step: jax.Array


def _window_functions(
    algorithm: Callable,
    logdensity_fn: Callable,
    num_warmup: int,
    is_mass_matrix_diagonal: bool,
    initial_step_size: float,
    target_acceptance_rate: float,
    extra: tuple,
) -> tuple:
    from blackjax.adaptation.mass_matrix import mass_matrix_adaptation
    from blackjax.adaptation.step_size import dual_averaging_adaptation
    from blackjax.adaptation.window_adaptation import WindowAdaptationState, build_schedule

    extra_parameters = dict(extra)
    mm_init, mm_update, mm_final = mass_matrix_adaptation(is_mass_matrix_diagonal)
    da_init, da_update, da_final = dual_averaging_adaptation(target_acceptance_rate)
    # (stage, is_window_end) per warmup step: a constant of the program, indexed by the
    # chain's step number. Stage 0: step size only; 1: step size and mass matrix.
    schedule = np.asarray(build_schedule(num_warmup), dtype=np.int32).reshape(-1, 2)

    def build(step_size, inverse_mass_matrix):
        return algorithm(logdensity_fn, step_size, inverse_mass_matrix, **extra_parameters)

    def init(position, rng_key):
        flat, _ = ravel_pytree(position)
        imm_state = mm_init(flat.shape[0])
        step_size = jnp.asarray(initial_step_size, dtype=flat.dtype)
        adaptation = WindowAdaptationState(
            da_init(step_size), imm_state, step_size, imm_state.inverse_mass_matrix
        )
        adaptation = jax.tree.map(_strong, adaptation)
        state = build(adaptation.step_size, adaptation.inverse_mass_matrix).init(position, rng_key)
        return WindowState(state, adaptation, jnp.int32(0))

    def adapt(a, t, position, acceptance_rate):
        """blackjax's window-adaptation update for step ``t`` (then ``final`` at the end)."""
        stage, window_end = schedule[:, 0], schedule[:, 1]
        i = jnp.clip(t, 0, num_warmup - 1)

        def fast(a):
            ss = da_update(a.ss_state, acceptance_rate)
            return a._replace(ss_state=ss, step_size=jnp.exp(ss.log_step_size))

        def slow(a):
            a = fast(a)
            return a._replace(imm_state=mm_update(a.imm_state, position))

        def end_of_window(a):
            imm_state = mm_final(a.imm_state)
            ss = da_init(da_final(a.ss_state))
            return WindowAdaptationState(
                ss, imm_state, jnp.exp(ss.log_step_size), imm_state.inverse_mass_matrix
            )

        def final(a):  # blackjax's final: averaged step size, last mass matrix
            return a._replace(
                step_size=jnp.exp(a.ss_state.log_step_size_avg),
                inverse_mass_matrix=a.imm_state.inverse_mass_matrix,
            )

        new = jax.lax.switch(jnp.asarray(stage)[i], (fast, slow), a)
        new = jax.lax.cond(jnp.asarray(window_end)[i] == 1, end_of_window, lambda x: x, new)
        new = jax.lax.cond(t == num_warmup - 1, final, lambda x: x, new)
        new = jax.tree.map(lambda n, o: n.astype(o.dtype), new, a)
        # Under vmap the step number is per chain, so these conds become selects: all
        # branches are cheap (scalar dual averaging, one Welford update).
        return jax.tree.map(lambda n, o: jnp.where(t < num_warmup, n, o), new, a)

    def step(rng_key, s):
        a = s.adaptation
        # The kernel is rebuilt from the current values inside the trace: one program
        # serves every step size and mass matrix. One kernel call per step, warmup or not.
        state, info = build(a.step_size, a.inverse_mass_matrix).step(rng_key, s.state)
        if num_warmup > 0:
            a = adapt(a, s.step, state.position, info.acceptance_rate)
        return WindowState(state, a, s.step + 1), (info, s.adaptation.step_size)

    def extract(s, info):
        info, step_size = info
        draw, stats = default_extract(s.state, info)
        stats["step_size"] = step_size
        return draw, stats

    def logdensity(s):
        value = getattr(s.state, "logdensity", None)
        return None if value is None or jnp.ndim(value) != 0 else value

    return init, step, extract, logdensity


# -- cross-chain adaptation (ChEES, MEADS), before sampling -----------------------------


def _ghmc_functions(logdensity_fn: Callable, divergence_threshold: float) -> tuple:
    import blackjax.mcmc.ghmc as ghmc

    kernel = ghmc.build_kernel(divergence_threshold=divergence_threshold)

    def init(position, rng_key, params=None):
        return ghmc.init(position, logdensity_fn, rng_key)

    def step(rng_key, state, params):
        return kernel(
            rng_key,
            state,
            logdensity_fn,
            params["step_size"],
            params["momentum_inverse_scale"],
            params["alpha"],
            params["delta"],
        )

    return init, step


def _chees_jitter(jitter_amount: float) -> Callable:
    import blackjax.mcmc.dynamic_hmc as dynamic_hmc

    # blackjax's chees_adaptation uses halton_sequence(i, ceil(log2(num_warmup +
    # max_sampling_steps))); we make that 20 bits (see _cross_chain_program), so the
    # sampling kernel continues the same quasi-random sequence.
    max_bits = np.float64(20.0)

    def jitter(i):
        return dynamic_hmc.halton_sequence(i, max_bits) * jitter_amount + (1.0 - jitter_amount)

    return jitter


def _dhmc_functions(logdensity_fn: Callable, jitter_amount: float) -> tuple:
    import blackjax.mcmc.dynamic_hmc as dynamic_hmc

    jitter = _chees_jitter(jitter_amount)

    def integration_steps_fn(random_generator_arg, num_leapfrog_steps):
        return jnp.asarray(jnp.ceil(jitter(random_generator_arg) * num_leapfrog_steps), dtype=int)

    kernel = dynamic_hmc.build_kernel(
        next_random_arg_fn=lambda i: i + 1, integration_steps_fn=integration_steps_fn
    )

    def init(position, rng_key, params=None):
        return dynamic_hmc.init(position, logdensity_fn, jnp.int32(0))

    def step(rng_key, state, params):
        flat, _ = ravel_pytree(state.position)
        return kernel(
            rng_key,
            state,
            logdensity_fn,
            params["step_size"],
            jnp.ones(flat.shape, flat.dtype),
            integration_steps_params=(params["num_leapfrog_steps"],),
        )

    return init, step


def _extract(state, info, params=None):
    return default_extract(state, info)


def _logdensity(state, params=None):
    value = getattr(state, "logdensity", None)
    return None if value is None or jnp.ndim(value) != 0 else value


def _meads_folds(num_chains: int, num_folds: int | None) -> int:
    if num_folds is None:
        # The largest fold count <= 4 (the paper's) that divides the chains with >= 4
        # chains per fold (fewer give degenerate cross-chain standard deviations).
        fits = [k for k in (4, 3, 2, 1) if num_chains % k == 0 and num_chains // k >= 4]
        fits = fits or [1]
        if not fits:
            raise ValueError(
                f"from_blackjax(adaptation='meads'): needs at least 2 chains, got {num_chains}."
            )
        return fits[0]
    if num_chains % num_folds or num_chains // num_folds < 2:
        raise ValueError(
            f"from_blackjax(adaptation='meads'): num_folds={num_folds} must divide "
            f"num_chains={num_chains} with at least 2 chains per fold."
        )
    return num_folds


class CrossChainAdaptation:
    """A blackjax kernel with cross-chain warmup (ChEES or MEADS), for ``cr.run``.

    Build it with ``cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=...,
    adaptation="chees")`` or ``cr.from_blackjax(blackjax.ghmc, logdensity_fn=...,
    adaptation="meads")``. ``cr.run`` initialises the chains with
    ``chainrunner_kernel``'s ``init``, calls ``chainrunner_cross_chain_warmup`` (the
    adaptation over all chains, under plain ``jit``), then samples with the returned
    kernel, whose adapted shared parameters are its ``params``.

    Attributes:
        adaptation: ``"chees"`` or ``"meads"``.
        logdensity_fn: the log density.
        options: the adaptation's options.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> obj = cr.from_blackjax(blackjax.ghmc, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                        adaptation="meads")
        >>> obj.adaptation, obj.chainrunner_kernel(num_warmup=10).needs_position
        ('meads', True)
    """

    def __init__(self, adaptation: str, logdensity_fn: Callable, options: dict):
        self.adaptation = adaptation
        self.logdensity_fn = logdensity_fn
        self.options = dict(options)
        if adaptation == "chees":
            init, step = _dhmc_functions(logdensity_fn, self.options["jitter_amount"])
        else:
            init, step = _ghmc_functions(logdensity_fn, self.options["divergence_threshold"])
        self._functions = (init, step, _extract, _logdensity)
        self._programs: OrderedDict[tuple, Callable] = OrderedDict()

    def __repr__(self) -> str:
        return f"CrossChainAdaptation({self.adaptation!r}, {self.options})"

    def kernel(self, params: Any = None) -> Kernel:
        """The sampling ``Kernel`` (the same functions always) with ``params``.

        Args:
            params: the adapted shared parameters (a dict of arrays), or None.

        Returns:
            A ``cr.Kernel``.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.dynamic_hmc, adaptation="chees",
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> obj.kernel().step is obj.kernel({"step_size": 0.1}).step
            True
        """
        init, step, extract, logdensity = self._functions
        return Kernel(init=init, step=step, extract=extract, logdensity=logdensity, params=params)

    def chainrunner_kernel(self, *, num_warmup: int) -> Kernel:
        """The kernel ``run`` initialises the chains with (its ``step`` needs ``params``).

        Args:
            num_warmup: the warmup length; must be positive (the shared parameters come
                from the cross-chain warmup).

        Returns:
            A ``cr.Kernel`` without ``params``.

        Raises:
            ValueError: if ``num_warmup`` is 0.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.ghmc, adaptation="meads",
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> obj.chainrunner_kernel(num_warmup=100).params is None
            True
        """
        if num_warmup <= 0:
            raise ValueError(
                f"run: adaptation={self.adaptation!r} needs num_warmup > 0 (its step size "
                "and other shared parameters come from the cross-chain warmup); got "
                f"num_warmup={num_warmup}. To sample on from an adapted run, pass its trace "
                "(cr.run(kernel, key, trace, n)); or use .kernel(params) with known values."
            )
        return self.kernel(None)

    def _program(self, num_chains: int, padded: int, num_warmup: int, keep: bool, mesh: Mesh):
        key = (num_chains, padded, num_warmup, keep, mesh)
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        import blackjax
        from blackjax.adaptation.base import get_filter_adapt_info_fn, return_all_adapt_info

        o = self.options
        chained = NamedSharding(mesh, P(_mesh.AXIS))
        replicated = NamedSharding(mesh, P())
        info_fn = return_all_adapt_info if keep else get_filter_adapt_info_fn()
        logdensity_fn = self.logdensity_fn

        def body(rng_key, state):
            # The padding chains are dropped: every statistic is over the real chains.
            real = jax.tree.map(lambda x: x[:num_chains], state)
            # "replicated": every device advances all real chains, so the result does not
            # depend on the device count or padding (bitwise); "sharded": the chains are
            # split over the devices, results agree to round-off, which adaptation can grow.
            if o["layout"] == "sharded":
                real = jax.lax.with_sharding_constraint(real, chained)
            key = jax.random.fold_in(rng_key, _CROSS_CHAIN_SALT)
            if self.adaptation == "chees":
                import optax

                warmup = blackjax.chees_adaptation(
                    logdensity_fn,
                    num_chains,
                    jitter_amount=o["jitter_amount"],
                    target_acceptance_rate=o["target_acceptance_rate"],
                    decay_rate=o["decay_rate"],
                    max_leapfrog_steps=o["max_leapfrog_steps"],
                    adaptation_info_fn=info_fn,
                )
                (last, p), info = warmup.run(
                    key,
                    real.position,
                    o["step_size"],
                    optax.adam(o["learning_rate"]),
                    num_warmup,
                    max_sampling_steps=2**20 - num_warmup,  # 20 Halton bits, as sampling
                )
                params = {
                    "step_size": p["step_size"],
                    "num_leapfrog_steps": p["integration_steps_params"][0],
                }
                step_size = info.adaptation_state.step_size if keep else None
            else:
                warmup = blackjax.meads_adaptation(
                    logdensity_fn,
                    num_chains,
                    num_folds=_meads_folds(num_chains, o["num_folds"]),
                    step_size_multiplier=o["step_size_multiplier"],
                    damping_slowdown=o["damping_slowdown"],
                    adaptation_info_fn=info_fn,
                )
                (last, p), info = warmup.run(key, real.position, num_warmup)
                params = {
                    k: p[k] for k in ("step_size", "momentum_inverse_scale", "alpha", "delta")
                }
                step_size = info.adaptation_state.step_size.mean(axis=-1) if keep else None
            params = jax.tree.map(_strong, params)
            last = jax.tree.map(lambda new, old: new.astype(old.dtype), last, real)
            out = _mesh.pad(last, num_chains, padded)
            if not keep:
                return out, params, None, None
            draws = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), info.state.position)
            stats = {
                "lp": info.state.logdensity.T,
                "acceptance_rate": info.info.acceptance_rate.T,
                "diverging": info.info.is_divergent.T,
                "step_size": jnp.broadcast_to(step_size, (num_chains, num_warmup)),
            }
            return out, params, draws, stats

        # "replicated": inputs and outputs replicated, so the partitioner has no reason to
        # split the chains: every device runs the same whole-ensemble program.
        state_out = replicated if o["layout"] == "replicated" else chained
        program = jax.jit(body, out_shardings=(state_out, replicated, replicated, replicated))
        self._programs[key] = program
        while len(self._programs) > 16:
            self._programs.popitem(last=False)
        return program

    def chainrunner_cross_chain_warmup(
        self,
        *,
        rng_key: jax.Array,
        state: Any,
        num_chains: int,
        num_warmup: int,
        mesh: Mesh,
        keep_warmup: bool,
    ) -> Any:
        """Runs the cross-chain warmup over the real chains; called by ``run``.

        Args:
            rng_key: the run's key; the warmup's keys derive from it alone.
            state: padded chain states (leading axis a multiple of the device count;
                chains ``>= num_chains`` repeat the last one), ``P('chain')`` sharded.
            num_chains: the real chains (the rest are padding and are left out).
            num_warmup: warmup steps.
            mesh: the run's mesh.
            keep_warmup: also return the warmup draws and stats.

        Returns:
            ``CrossChainWarmup(state, kernel, draws, stats, attrs)``.

        Examples:
            >>> import blackjax, jax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.ghmc, adaptation="meads",
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> mesh = cr.chain_mesh(1)
            >>> k = obj.chainrunner_kernel(num_warmup=20)
            >>> keys = jax.random.split(jax.random.key(0), 4)
            >>> state = jax.vmap(k.init)(jnp.ones((4, 2)), keys)
            >>> out = obj.chainrunner_cross_chain_warmup(rng_key=jax.random.key(1), state=state,
            ...     num_chains=4, num_warmup=20, mesh=mesh, keep_warmup=False)
            >>> sorted(out.kernel.params)
            ['alpha', 'delta', 'momentum_inverse_scale', 'step_size']
        """
        padded = int(jax.tree.leaves(state)[0].shape[0])
        if self.adaptation == "meads":
            _meads_folds(num_chains, self.options["num_folds"])  # eager error
        program = self._program(num_chains, padded, num_warmup, bool(keep_warmup), mesh)
        if self.options["layout"] == "replicated":
            state = _mesh.replicate(state, mesh)
            rng_key = _mesh.replicate(rng_key, mesh)
        else:
            state = _mesh.place(state, mesh)
        new_state, params, draws, stats = program(rng_key, state)
        new_state = _mesh.place(new_state, mesh)
        attrs = {"adaptation": self.adaptation}
        for name, value in _distributed.to_host(params).items():
            value = np.asarray(jax.tree.leaves(value)[0]) if name != "step_size" else value
            attrs[f"adapted_{name}"] = (
                float(value) if np.ndim(value) == 0 else np.asarray(value).tolist()
            )
        if draws is not None:
            draws, stats = _distributed.to_host((draws, stats))
        from ._run import CrossChainWarmup  # run imports this module lazily: no cycle

        return CrossChainWarmup(new_state, self.kernel(params), draws, stats, attrs)


# -- window adaptation object -------------------------------------------------------------


class WindowAdaptation:
    """A blackjax kernel factory with Stan's window adaptation, for ``cr.run``.

    Build it with ``cr.from_blackjax(blackjax.nuts, logdensity_fn=...,
    adaptation="window")``. ``cr.run(..., num_warmup=n)`` adapts the step size and
    inverse mass matrix of every chain on its own during its first ``n`` steps (the
    same steps, keys and programs as sampling); later steps use the adapted values.
    Stats gain ``step_size`` (the value each step used); ``adapted_parameters(trace)``
    reads the adapted step size and inverse mass matrix from ``trace.final_state``.

    Attributes:
        algorithm: the blackjax factory, ``algorithm(logdensity_fn, step_size,
            inverse_mass_matrix, **extra)``.
        logdensity_fn: the log density.
        options: the adaptation's options and the extra parameters of the factory.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                         adaptation="window")
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 20, num_warmup=30,
        ...                progress=False)
        >>> trace.stats["step_size"].shape
        (4, 20)
    """

    def __init__(self, algorithm: Callable, logdensity_fn: Callable, options: dict):
        self.algorithm = algorithm
        self.logdensity_fn = logdensity_fn
        self.options = dict(options)
        self._kernels: OrderedDict[int, Kernel] = OrderedDict()

    def __repr__(self) -> str:
        name = getattr(self.algorithm, "__name__", type(self.algorithm).__name__)
        return f"WindowAdaptation({name}, {self.options})"

    def chainrunner_kernel(self, *, num_warmup: int) -> Kernel:
        """The ``cr.Kernel`` that adapts during the first ``num_warmup`` steps.

        Cached on ``num_warmup``: the same object gives the same functions, hence the
        same compiled programs.

        Args:
            num_warmup: the number of adaptation steps (0: no adaptation).

        Returns:
            A ``cr.Kernel`` whose state is a ``WindowState``.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> w = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -jnp.sum(x**2),
            ...                      adaptation="window")
            >>> w.chainrunner_kernel(num_warmup=5) is w.chainrunner_kernel(num_warmup=5)
            True
        """
        num_warmup = int(num_warmup)
        if num_warmup in self._kernels:
            self._kernels.move_to_end(num_warmup)
            return self._kernels[num_warmup]
        o = dict(self.options)
        init, step, extract, logdensity = _window_functions(
            self.algorithm,
            self.logdensity_fn,
            num_warmup,
            o.pop("is_mass_matrix_diagonal"),
            o.pop("initial_step_size"),
            o.pop("target_acceptance_rate"),
            tuple(sorted(o.items())),
        )
        kernel = Kernel(init=init, step=step, extract=extract, logdensity=logdensity)
        self._kernels[num_warmup] = kernel
        while len(self._kernels) > 16:
            self._kernels.popitem(last=False)
        return kernel


_DEFAULTS = {
    "window": {
        "is_mass_matrix_diagonal": True,
        "initial_step_size": 1.0,
        "target_acceptance_rate": 0.8,
    },
    "chees": {
        "step_size": 0.1,
        "learning_rate": 0.025,
        "jitter_amount": 1.0,
        "target_acceptance_rate": 0.651,
        "decay_rate": 0.5,
        "max_leapfrog_steps": 1000,
        "layout": "replicated",
    },
    "meads": {
        "num_folds": None,
        "step_size_multiplier": 0.5,
        "damping_slowdown": 1.0,
        "divergence_threshold": 1000,
        "layout": "replicated",
    },
}

_FACTORY = {"chees": "dynamic_hmc", "meads": "ghmc"}

_OBJECTS: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()


def _options_key(options: dict) -> tuple:
    items = []
    for k, v in sorted(options.items()):
        try:
            hash(v)
            items.append((k, "v", v))
        except TypeError:
            items.append((k, "id", id(v)))
    return tuple(items)


def from_blackjax_adaptive(
    algorithm: Any, *, logdensity_fn: Callable | None, adaptation: str, **options: Any
) -> WindowAdaptation | CrossChainAdaptation:
    """``from_blackjax(algorithm, logdensity_fn=..., adaptation=...)``: see there.

    Args:
        algorithm: the blackjax factory (``blackjax.nuts``, ``blackjax.hmc``, ... for
            ``"window"``; ``blackjax.dynamic_hmc`` for ``"chees"``; ``blackjax.ghmc`` for
            ``"meads"``).
        logdensity_fn: the log density of one chain's position.
        adaptation: ``"window"``, ``"chees"`` or ``"meads"``.
        **options: the adaptation's options (see ``from_blackjax``); for ``"window"``
            others are passed to the factory (e.g. ``num_integration_steps``).

    Returns:
        A ``WindowAdaptation`` or ``CrossChainAdaptation``; the same object for the
        same arguments, so repeated runs reuse the compiled programs.

    Raises:
        ValueError, TypeError: for an unknown adaptation, a missing ``logdensity_fn``,
            a factory that does not fit the adaptation, or unknown options.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> from chainrunner._warmup import from_blackjax_adaptive
        >>> f = lambda x: -0.5 * jnp.sum(x**2)
        >>> a = from_blackjax_adaptive(blackjax.nuts, logdensity_fn=f, adaptation="window")
        >>> a is from_blackjax_adaptive(blackjax.nuts, logdensity_fn=f, adaptation="window")
        True
    """
    where = "from_blackjax"
    if adaptation not in ADAPTATIONS:
        raise ValueError(
            f"{where}: adaptation must be None or one of {ADAPTATIONS}, got {adaptation!r}."
        )
    if logdensity_fn is None or not callable(logdensity_fn):
        raise TypeError(
            f"{where}: adaptation={adaptation!r} needs logdensity_fn=<callable> (the log "
            f"density of one chain's position), got {logdensity_fn!r}."
        )
    if adaptation == "window":
        if not callable(algorithm) or not hasattr(algorithm, "build_kernel"):
            raise TypeError(
                f"{where}: adaptation='window' takes a blackjax algorithm factory called as "
                "algorithm(logdensity_fn, step_size, inverse_mass_matrix) (e.g. blackjax.nuts "
                f"or blackjax.hmc), got {type(algorithm).__name__}."
            )
    else:
        import blackjax

        expected = getattr(blackjax, _FACTORY[adaptation])
        if algorithm is not expected:
            raise TypeError(
                f"{where}: adaptation={adaptation!r} samples with "
                f"blackjax.{_FACTORY[adaptation]}; pass algorithm=blackjax."
                f"{_FACTORY[adaptation]}, got {algorithm!r}."
            )
        if options.get("layout", "replicated") not in ("replicated", "sharded"):
            raise ValueError(
                f"{where}: layout must be 'replicated' or 'sharded', got {options['layout']!r}."
            )
        unknown = sorted(set(options) - set(_DEFAULTS[adaptation]))
        if unknown:
            raise TypeError(
                f"{where}: unknown option(s) {unknown} for adaptation={adaptation!r}; "
                f"known: {sorted(_DEFAULTS[adaptation])}."
            )
    opts = {**_DEFAULTS[adaptation], **options}
    key = (id(algorithm), id(logdensity_fn), adaptation, _options_key(opts))
    hit = _OBJECTS.get(key)
    if hit is not None and hit[0] == (algorithm, logdensity_fn):
        _OBJECTS.move_to_end(key)
        return hit[1]
    if adaptation == "window":
        obj: Any = WindowAdaptation(algorithm, logdensity_fn, opts)
    else:
        obj = CrossChainAdaptation(adaptation, logdensity_fn, opts)
    _OBJECTS[key] = ((algorithm, logdensity_fn), obj)
    while len(_OBJECTS) > 64:
        _OBJECTS.popitem(last=False)
    return obj


def adapted_parameters(trace: Any) -> dict[str, np.ndarray]:
    """The adapted step size and inverse mass matrix of a run with warmup.

    For ``adaptation="window"`` they are per chain, read from ``trace.final_state``:
    ``step_size`` ``(chain,)`` and ``inverse_mass_matrix`` ``(chain, d)`` (or
    ``(chain, d, d)`` for a dense matrix). For ``"chees"``/``"meads"`` they are shared
    and read from ``trace.attrs`` (``adapted_*`` entries).

    Args:
        trace: a ``cr.Trace``.

    Returns:
        ``{name: numpy array}``.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> from chainrunner._warmup import adapted_parameters
        >>> nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                         adaptation="window")
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 3)), 10, num_warmup=30,
        ...                progress=False)
        >>> {k: v.shape for k, v in adapted_parameters(trace).items()}
        {'step_size': (4,), 'inverse_mass_matrix': (4, 3)}
    """
    state = trace.final_state
    if isinstance(state, WindowState):
        a = _distributed.to_host(state.adaptation)
        return {
            "step_size": np.asarray(a.step_size),
            "inverse_mass_matrix": np.asarray(a.inverse_mass_matrix),
        }
    found = {
        k[len("adapted_") :]: np.asarray(v)
        for k, v in trace.attrs.items()
        if k.startswith("adapted_")
    }
    if not found:
        raise ValueError(
            "adapted_parameters: this trace has no adapted parameters (run a kernel from "
            "cr.from_blackjax(..., adaptation=...) with num_warmup > 0)."
        )
    return found
