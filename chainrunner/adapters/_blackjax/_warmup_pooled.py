"""The Fisher adaptation pooled over all chains, before sampling.

``cr.from_blackjax(factory, logdensity_fn=..., adaptation="fisher" | "fisher_low_rank",
pooled=True)`` lands here. It is ``_warmup_fisher``'s adaptation (nutpie's schedule,
estimators and metric) with one estimate for the whole run instead of one per chain:
at every warmup step each real chain's draw and gradient enter the same running
(co-)moments, so ``n`` chains adapt one mass matrix from ``n`` times the draws, and the
step size follows dual averaging of the mean acceptance rate over the chains. The mass
matrix is computed once per update for the run, not once per chain.

It runs as ChEES and MEADS do (``_warmup_sharded.program``): under ``shard_map``, the
ensemble replicated, each step's kernel calls spread over the devices at the run's batch
width (``_collective.spread``), the estimate updated on every device from the gathered
draws of the real chains (padding never enters). So it is bitwise the same on any device
count for the same batch width, with no host round trip. Sampling then runs the factory
with the adapted step size (jittered by ``±step_size_jitter`` per step, as nutpie does)
and mass matrix as ``Kernel.params``, shared by every chain.

It runs in chunks (``_warmup_sharded.run_chunks``): the bar moves after each, Ctrl-C
keeps the warmup done, and a checkpoint resumes it (``pipeline/_warmup``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ...core._kernel import (
    Adapter,
    CrossChainWarmup,
    Kernel,
    WarmupChunks,
    WarmupRequest,
    default_extract,
    default_logdensity,
    library_attrs,
)
from ...layout import _mesh
from ._warmup_fisher import (
    LOW_RANK_OPTIONS,
    OPTIONS,
    FisherAdaptation,
    find_step_size,
    first_metric,
    fisher_adapt_fn,
    start,
)
from ._warmup_sharded import Record, Rows, Shape, Steps, run_chunks
from ._warmup_sharded import program as sharded_program
from ._warmup_window import jittered

# Chain-independent salt for the pooled warmup's keys (from the run's key only).
_POOLED_SALT = 0xF15E


def _initial(dim: int, dtype: Any, low_rank: bool, options: dict) -> tuple:
    """The step size and inverse mass matrix the chains are initialised at."""
    imm = first_metric(jnp.ones(dim, dtype), low_rank, options)
    return jnp.asarray(options["initial_step_size"], dtype), imm


def _flat_rows(tree: Any) -> jax.Array:
    return jax.vmap(lambda t: ravel_pytree(t)[0])(tree)


def row_sum(x: jax.Array) -> jax.Array:
    """The sum of the rows of ``x`` in row order (see ``_warmup_fisher._one_by_one``:
    a ``jnp.sum`` over gathered rows can round differently on another device count)."""
    return jax.lax.fori_loop(1, x.shape[0], lambda i, s: s + x[i], x[0])


def pooled_start(states: Any, keys: jax.Array, logdensity_fn: Callable,
                 low_rank: bool, options: dict, rows: Rows) -> FisherAdaptation:  # fmt: skip
    """nutpie's start, pooled: ``M⁻¹ = 1/mean|∇log p(x₀)|`` over the chains whose
    gradient is finite, and the median over the chains of the step size each finds."""
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    x, g = _flat_rows(states.position), _flat_rows(states.logdensity_grad)
    ok = jnp.all(jnp.isfinite(g), axis=1)
    count = jnp.maximum(row_sum(ok.astype(g.dtype)), 1.0)
    mean_abs = row_sum(jnp.where(ok[:, None], jnp.abs(g), 0.0)) / count
    imm = first_metric(mean_abs, low_rank, options)
    eps0 = jnp.asarray(options["initial_step_size"], x.dtype)
    target = float(options["target_acceptance_rate"])

    def find(args):
        state, key = args
        return find_step_size(logdensity_fn, state, imm, eps0, target, key)

    eps = jnp.median(rows(find, (states, keys)))
    da_init = dual_averaging_adaptation(target)[0]
    return start(x, g, ok, imm, eps, low_rank, options, da_init)


def pooled_method(algorithm: Callable, extra: dict, low_rank: bool) -> Callable:
    """The pooled warmup as a ``_warmup_sharded`` method: ``(logdensity_fn, options, n,
    num_warmup, key, positions, rows) -> Steps``."""

    def method(logdensity_fn, o, n, num_warmup, key, positions, rows):
        _, adapt = fisher_adapt_fn(num_warmup, low_rank, o, logdensity_fn, pooled=True)
        jitter = float(o["step_size_jitter"])

        def build(step_size, imm):
            return algorithm(logdensity_fn, step_size, imm, **extra)

        flat0 = ravel_pytree(jax.tree.map(lambda x: x[0], positions))[0]
        eps0, imm0 = _initial(flat0.shape[0], flat0.dtype, low_rank, o)
        key_init, key_start, key_steps = jax.random.split(key, 3)
        states = rows(
            lambda a: build(eps0, imm0).init(a[0], a[1]), (positions, jax.random.split(key_init, n))
        )
        a = pooled_start(states, jax.random.split(key_start, n), logdensity_fn, low_rank, o, rows)

        def one_step(carry, step_key):
            states, a, t = carry

            def one_chain(args):
                k, s = args
                eps, k = jittered(a.step_size, k, jitter)
                new, info = build(eps, a.inverse_mass_matrix).step(k, s)
                steps = getattr(info, "num_integration_steps", jnp.int32(0))
                return new, (info.acceptance_rate, info.is_divergent, steps, eps)

            new, (acc, div, steps, eps) = rows(one_chain, (jax.random.split(step_key, n), states))
            # The update between barriers: XLA compiles it alike whatever surrounds it (on
            # one device the gather is no op, and fusing across it changed the round-off).
            old, fresh, acc_in = jax.lax.optimization_barrier((states, new, acc))
            mean_acc = row_sum(acc_in) / acc_in.shape[0]
            a = adapt(a, t, old, fresh, SimpleNamespace(acceptance_rate=mean_acc))
            a = jax.lax.optimization_barrier(a)
            record = Record(new.position, new.logdensity, acc, div, eps, steps)
            return (new, a, t + 1), record

        def params(carry):
            a = carry[1]
            return {"step_size": a.step_size, "inverse_mass_matrix": a.inverse_mass_matrix}

        carry = (states, a, jnp.int32(0))
        return Steps(carry, one_step, jax.random.split(key_steps, num_warmup), params)

    return method


def _sampling_functions(algorithm: Callable, logdensity_fn: Callable, extra: dict,
                        low_rank: bool, options: dict) -> tuple:  # fmt: skip
    """``(init, step, extract, logdensity)`` of the sampling kernel (``Kernel.params``:
    the adapted ``step_size`` and ``inverse_mass_matrix``)."""
    jitter = float(options["step_size_jitter"])

    def init(position, rng_key, params=None):
        flat, _ = ravel_pytree(position)
        eps, imm = _initial(flat.shape[0], flat.dtype, low_rank, options)
        return algorithm(logdensity_fn, eps, imm, **extra).init(position, rng_key)

    def step(rng_key, state, params):
        eps, rng_key = jittered(params["step_size"], rng_key, jitter)
        kernel = algorithm(logdensity_fn, eps, params["inverse_mass_matrix"], **extra)
        state, info = kernel.step(rng_key, state)
        return state, (info, eps)

    def extract(state, info, params=None):
        info, eps = info
        draw, stats = default_extract(state, info)
        stats["step_size"] = eps
        return draw, stats

    return init, step, extract, default_logdensity


class PooledFisherAdaptation(Adapter):
    """A blackjax factory with the Fisher adaptation pooled over all chains, for ``cr.run``.

    Build it with ``cr.from_blackjax(blackjax.nuts, logdensity_fn=...,
    adaptation="fisher_low_rank", pooled=True)`` (or ``"fisher"``). ``cr.run`` initialises
    the chains, calls ``cross_chain_warmup`` (one estimate from every chain's warmup
    draws, ``pooled_method``), then samples with the adapted step size and inverse mass
    matrix, shared by all chains, as the kernel's ``params``.

    Attributes:
        algorithm: the blackjax factory.
        adaptation: ``"fisher"`` or ``"fisher_low_rank"``.
        logdensity_fn: the log density.
        options: the adaptation's options and the factory's own.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> obj = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                        adaptation="fisher", pooled=True)
        >>> obj.adaptation, obj.has_cross_chain_warmup
        ('fisher', True)
    """

    has_cross_chain_warmup = True

    def __init__(self, algorithm: Callable, adaptation: str, logdensity_fn: Callable,
                 options: dict):  # fmt: skip
        self.algorithm = algorithm
        self.adaptation = adaptation
        self.logdensity_fn = logdensity_fn
        self.options = dict(options)
        self._low_rank = adaptation == "fisher_low_rank"
        own = {**OPTIONS, **(LOW_RANK_OPTIONS if self._low_rank else {})}
        self._extra = {k: v for k, v in self.options.items() if k not in own}
        self._functions = _sampling_functions(
            algorithm, logdensity_fn, self._extra, self._low_rank, self.options
        )

    def __repr__(self) -> str:
        name = getattr(self.algorithm, "__name__", type(self.algorithm).__name__)
        return f"PooledFisherAdaptation({name}, {self.adaptation!r}, {self.options})"

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """The adapted parameters, shared by every chain: the sampling kernel's ``params``."""
        return None if params is None else jax.tree.map(np.asarray, dict(params))

    def attrs(self) -> dict[str, Any]:
        return library_attrs("blackjax")

    def sampling_kernel(self, params: Any = None) -> Kernel:
        """The sampling ``Kernel`` (the same functions always) with ``params``.

        Args:
            params: ``{"step_size": ..., "inverse_mass_matrix": ...}``, or None.

        Returns:
            A ``cr.Kernel``.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.nuts, adaptation="fisher", pooled=True,
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> k = obj.sampling_kernel({"step_size": 0.5, "inverse_mass_matrix": jnp.ones(2)})
            >>> k.step is obj.sampling_kernel().step
            True
        """
        init, step, extract, logdensity = self._functions
        return Kernel(init=init, step=step, extract=extract, logdensity=logdensity, params=params)

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The kernel ``run`` initialises the chains with, or samples on with.

        Args:
            num_warmup: the warmup length; must be positive for a fresh run.
            previous_params: the adapted parameters of a trace being continued.

        Returns:
            A ``cr.Kernel``: without ``params`` for a fresh run, with ``previous_params``
            for a continued one.

        Raises:
            ValueError: if ``num_warmup`` is 0 and there are no ``previous_params``.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.nuts, adaptation="fisher", pooled=True,
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> obj.build_kernel(num_warmup=100).params is None
            True
        """
        if previous_params is not None:
            return self.sampling_kernel(previous_params)
        if num_warmup <= 0:
            raise ValueError(
                f"run: adaptation={self.adaptation!r} with pooled=True needs num_warmup > 0 "
                f"(its step size and mass matrix come from the pooled warmup); got "
                f"num_warmup={num_warmup}. To sample on from an adapted run, pass its trace "
                "(cr.run(kernel, key, trace, n))."
            )
        return self.sampling_kernel(None)

    def cross_chain_warmup(self, request: WarmupRequest) -> WarmupChunks:
        """The pooled warmup over the real chains, in chunks; ``run`` drives it.

        Args:
            request: the run's key, padded sharded states, chain count, warmup length,
                mesh, batch size, chunk length, and whether to keep the warmup draws.

        Returns:
            ``WarmupChunks``, whose ``finish`` gives ``CrossChainWarmup(state, kernel,
            attrs=...)``, the adapted parameters as the kernel's ``params``.

        Examples:
            >>> import blackjax, jax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.nuts, adaptation="fisher", pooled=True,
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> k = obj.build_kernel(num_warmup=50)
            >>> state = jax.vmap(k.init)(jnp.ones((4, 2)), jax.random.split(jax.random.key(0), 4))
            >>> w = obj.cross_chain_warmup(cr.WarmupRequest(jax.random.key(1), state,
            ...     num_chains=4, num_warmup=50, mesh=cr.chain_mesh(1), keep_warmup=False))
            >>> out = w.finish(w.step(w.start(), 0, 50)[0])
            >>> sorted(out.kernel.params)
            ['inverse_mass_matrix', 'step_size']
        """
        r = request
        padded = int(jax.tree.leaves(r.state)[0].shape[0])
        chunk = min(r.chunk_size or r.num_warmup, r.num_warmup)
        shape = Shape(r.num_chains, padded, r.num_warmup, bool(r.keep_warmup), r.mesh,
                      r.batch_size)  # fmt: skip
        method = pooled_method(self.algorithm, self._extra, self._low_rank)
        program = sharded_program(method, self.logdensity_fn, self.options, shape, _POOLED_SALT)
        chunks = run_chunks(program, r.rng_key, r.state, r.num_chains, r.mesh, chunk)

        def finish(carry: Any) -> CrossChainWarmup:
            new_state, params = chunks.last(carry)
            attrs = {"adaptation": self.adaptation, "adaptation_pooled": 1,
                     "adapted_step_size": float(params["step_size"])}  # fmt: skip
            kernel = self.sampling_kernel(params)
            return CrossChainWarmup(_mesh.place(new_state, r.mesh), kernel, attrs=attrs)

        return WarmupChunks(chunk, chunks.start, chunks.step, finish, chunks.fingerprint)
