"""Stan's window adaptation for blackjax kernels, per chain, inside the sampling loop.

``cr.from_blackjax(factory, logdensity_fn=..., adaptation="window")`` lands here. The chain
state carries blackjax's adaptation state and the global step number, and the step
rebuilds the kernel (``factory(logdensity_fn, step_size, inverse_mass_matrix)``) from the
current adapted values, so warmup and sampling are one compiled program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ...core._kernel import Adapter, Kernel, default_extract, default_logdensity, library_attrs
from ...core._lru import LRU
from ...layout import _distributed
from ._nuts_fsm import Adaptive, chunk_machine, nuts_spec


def strong(x: Any) -> jax.Array:
    """``x`` as a strongly typed array (scan carries reject weak types that change)."""
    x = jnp.asarray(x)
    return jnp.array(x, dtype=x.dtype)


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


def _adapt_fn(num_warmup: int, is_diagonal: bool, target: float) -> tuple[Callable, Callable]:
    """``(init(dim, step_size), adapt(a, t, position, acceptance_rate))`` of blackjax's window."""
    from blackjax.adaptation.mass_matrix import mass_matrix_adaptation
    from blackjax.adaptation.step_size import dual_averaging_adaptation
    from blackjax.adaptation.window_adaptation import WindowAdaptationState, build_schedule

    mm_init, mm_update, mm_final = mass_matrix_adaptation(is_diagonal)
    da_init, da_update, da_final = dual_averaging_adaptation(target)
    # (stage, is_window_end) per warmup step: a constant of the program, indexed by the
    # chain's step number. Stage 0: step size only; 1: step size and mass matrix.
    schedule = np.asarray(build_schedule(num_warmup), dtype=np.int32).reshape(-1, 2)

    def init(dim, step_size):
        imm_state = mm_init(dim)
        a = WindowAdaptationState(
            da_init(step_size), imm_state, step_size, imm_state.inverse_mass_matrix
        )
        return jax.tree.map(strong, a)

    def fast(a, position, acceptance_rate):
        ss = da_update(a.ss_state, acceptance_rate)
        return a._replace(ss_state=ss, step_size=jnp.exp(ss.log_step_size))

    def slow(a, position, acceptance_rate):
        a = fast(a, position, acceptance_rate)
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

    def adapt(a, t, position, acceptance_rate):
        """blackjax's window-adaptation update for step ``t`` (then ``final`` at the end)."""
        i = jnp.clip(t, 0, num_warmup - 1)
        new = jax.lax.switch(
            jnp.asarray(schedule[:, 0])[i], (fast, slow), a, position, acceptance_rate
        )
        new = jax.lax.cond(jnp.asarray(schedule[:, 1])[i] == 1, end_of_window, lambda x: x, new)
        new = jax.lax.cond(t == num_warmup - 1, final, lambda x: x, new)
        new = jax.tree.map(lambda n, o: n.astype(o.dtype), new, a)
        # Under vmap the step number is per chain, so these conds become selects: all
        # branches are cheap (scalar dual averaging, one Welford update).
        return jax.tree.map(lambda n, o: jnp.where(t < num_warmup, n, o), new, a)

    return init, adapt


class InLoop(NamedTuple):
    """An adaptation that runs inside the sampling loop, per chain.

    Attributes:
        init: ``init(state, rng_key) -> adaptation``: the adaptation state of a chain whose
            kernel state (built at ``initial``'s values) is ``state``.
        adapt: ``adapt(adaptation, t, old_state, new_state, info) -> adaptation``: the
            update after step ``t`` (the identity from step ``num_warmup`` on).
        initial: ``initial(dim, dtype) -> (step_size, inverse_mass_matrix)`` that the first
            kernel state is built at.
        jitter: the step size of every step is the adapted one times a uniform draw in
            ``[1 - jitter, 1 + jitter]`` (0: none, and the step's key goes to the kernel
            untouched).
        machine: whether NUTS with this adaptation runs as the state machine where chains
            share a vmap (``_nuts_fsm``). There ``adapt`` runs for the whole batch each
            time the machine processes ended transitions (every few ticks): worth it only
            where it is cheap, as Stan's window and the diagonal Fisher are
            (docs/batches.md has the measurements).
        metric: ``metric(inverse_mass_matrix)``: what the kernel is built with from the
            adapted matrix (``None``: the matrix itself). The low-rank Fisher metric runs
            at the width its informative directions need (``_low_rank_width``).
    """

    init: Callable
    adapt: Callable
    initial: Callable
    jitter: float = 0.0
    machine: bool = True
    metric: Callable | None = None


def _window_in_loop(num_warmup: int, options: dict) -> InLoop:
    init_adaptation, adapt = _adapt_fn(
        num_warmup, options["is_mass_matrix_diagonal"], options["target_acceptance_rate"]
    )
    step_size = options["initial_step_size"]

    def init(state, rng_key):
        flat, _ = ravel_pytree(state.position)
        return init_adaptation(flat.shape[0], jnp.asarray(step_size, dtype=flat.dtype))

    def adapt_after(a, t, old, new, info):
        return adapt(a, t, new.position, info.acceptance_rate)

    def initial(dim, dtype):
        a = init_adaptation(dim, jnp.asarray(step_size, dtype=dtype))
        return a.step_size, a.inverse_mass_matrix

    return InLoop(init, adapt_after, initial)


def jittered(step_size: jax.Array, rng_key: jax.Array, jitter: float) -> tuple:
    """``(step_size * (1 + jitter * u), key)``, ``u`` uniform in ``[-1, 1]`` from a split
    of ``rng_key`` (the other half is returned for the step); no split when ``jitter`` is 0.
    """
    if not jitter:
        return step_size, rng_key
    rng_key, jitter_key = jax.random.split(rng_key)
    u = jax.random.uniform(jitter_key, (), step_size.dtype, -1.0, 1.0)
    return step_size * (1.0 + jitter * u), rng_key


def adaptive_kernel(
    algorithm: Callable, logdensity_fn: Callable, num_warmup: int, extra: dict, spec: InLoop
) -> Kernel:
    """The ``Kernel`` that runs ``spec`` during its first ``num_warmup`` steps.

    The chain state carries the adaptation state and the global step number, and the step
    rebuilds the kernel (``algorithm(logdensity_fn, step_size, inverse_mass_matrix,
    **extra)``) from the current adapted values: one program serves every step size and
    mass matrix, with one kernel call per step, warmup or not.
    """

    def build(step_size, inverse_mass_matrix):
        if spec.metric is not None:
            inverse_mass_matrix = spec.metric(inverse_mass_matrix)
        return algorithm(logdensity_fn, step_size, inverse_mass_matrix, **extra)

    def init(position, rng_key):
        flat, _ = ravel_pytree(position)
        state = build(*spec.initial(flat.shape[0], flat.dtype)).init(position, rng_key)
        a = spec.init(state, jax.random.fold_in(rng_key, 1))
        return WindowState(build(a.step_size, a.inverse_mass_matrix).init(position, rng_key),
                           a, jnp.int32(0))  # fmt: skip

    def finish(s, state, info, step_size, adapt=True):
        a = s.adaptation
        if adapt and num_warmup > 0:
            a = spec.adapt(a, s.step, s.state, state, info)
        return WindowState(state, a, s.step + 1), (info, step_size)

    def step(rng_key, s):
        step_size, rng_key = jittered(s.adaptation.step_size, rng_key, spec.jitter)
        state, info = build(step_size, s.adaptation.inverse_mass_matrix).step(rng_key, s.state)
        return finish(s, state, info, step_size)

    def extract(s, info):
        info, step_size = info
        draw, stats = default_extract(s.state, info)
        stats["step_size"] = step_size
        return draw, stats

    def logdensity(s):
        return default_logdensity(s.state)

    machine = _machine(build, spec, finish, num_warmup) if spec.machine else None
    return Kernel(init=init, step=step, extract=extract, logdensity=logdensity, machine=machine)


def _machine(build: Callable, spec: InLoop, finish: Callable,
             num_warmup: int) -> Callable | None:  # fmt: skip
    """``Kernel.machine`` where ``build`` makes ``blackjax.nuts`` (``_nuts_fsm.nuts_spec``
    reads it) and the adapted matrix's metric can scale normals into momenta (blackjax's
    Gaussian metrics: diagonal, dense, low rank): NUTS as a state machine at each chain's
    adapted step size and matrix. Else ``None`` (the kernel's own step, vmapped)."""
    from blackjax.mcmc import metrics

    _, imm = spec.initial(2, jnp.float32)
    if not callable(getattr(metrics.default_metric(imm), "scale", None)):
        return None
    nuts = nuts_spec(build(jnp.float32(1.0), jnp.ones(2)))
    if nuts is None:
        return None
    adaptive = Adaptive(
        inner=lambda s: s.state,
        params=lambda s: (s.adaptation.step_size, s.adaptation.inverse_mass_matrix),
        finish=finish,
        adapting=lambda s: s.step < num_warmup,
        jitter=spec.jitter,
    )
    nuts = nuts._replace(step_size=None, metric=None, adaptive=adaptive)
    return functools.partial(chunk_machine, nuts)


def window_kernel(
    algorithm: Callable, logdensity_fn: Callable, num_warmup: int, options: dict
) -> Kernel:
    """The ``Kernel`` that window-adapts during its first ``num_warmup`` steps."""
    extra = {k: v for k, v in options.items() if k not in _WINDOW_KEYS}
    spec = _window_in_loop(num_warmup, options)
    return adaptive_kernel(algorithm, logdensity_fn, num_warmup, extra, spec)


_WINDOW_KEYS = ("initial_step_size", "is_mass_matrix_diagonal", "target_acceptance_rate")


class WindowAdaptation(Adapter):
    """A blackjax kernel factory with Stan's window adaptation, for ``cr.run``.

    Build it with ``cr.from_blackjax(blackjax.nuts, logdensity_fn=...,
    adaptation="window")``. ``cr.run(..., num_warmup=n)`` adapts the step size and
    inverse mass matrix of every chain on its own during its first ``n`` steps (the
    same steps, keys and programs as sampling); later steps use the adapted values.
    Stats gain ``step_size`` (the value each step used); ``cr.adapted_parameters(trace)``
    returns the adapted step size and inverse mass matrix (``adapted``: from each chain's
    ``WindowState``).

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

    needs_warmup = True  # num_warmup=0 would sample at step size 1.0, never adapted

    def __init__(
        self,
        algorithm: Callable,
        logdensity_fn: Callable,
        options: dict,
        name: str = "window",
        kernel_fn: Callable | None = None,
    ):
        self.algorithm = algorithm
        self.logdensity_fn = logdensity_fn
        self.options = dict(options)
        self.name = name
        # kernel_fn(algorithm, logdensity_fn, num_warmup, options) -> Kernel
        self.kernel_fn = window_kernel if kernel_fn is None else kernel_fn
        self._kernels = LRU(16)

    def __repr__(self) -> str:
        name = getattr(self.algorithm, "__name__", type(self.algorithm).__name__)
        return f"WindowAdaptation({name}, {self.name!r}, {self.options})"

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """Every chain's step size and inverse mass matrix, from its ``WindowState``."""
        if not isinstance(state, WindowState):
            return None
        a = _distributed.to_host(state.adaptation)
        return {
            "step_size": np.asarray(a.step_size),
            "inverse_mass_matrix": jax.tree.map(np.asarray, a.inverse_mass_matrix),
        }

    def attrs(self) -> dict[str, Any]:
        return library_attrs("blackjax")

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The ``cr.Kernel`` that adapts during the first ``num_warmup`` steps.

        Cached on ``num_warmup``: the same object gives the same functions, hence the
        same compiled programs.

        Args:
            num_warmup: the number of adaptation steps (0: no adaptation).
            previous_params: unused (the adapted values travel in the chain state).

        Returns:
            A ``cr.Kernel`` whose state is a ``WindowState``.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> w = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -jnp.sum(x**2),
            ...                      adaptation="window")
            >>> w.build_kernel(num_warmup=5) is w.build_kernel(num_warmup=5)
            True
        """
        n = int(num_warmup)
        return self._kernels.get(
            n, lambda: self.kernel_fn(self.algorithm, self.logdensity_fn, n, self.options)
        )
