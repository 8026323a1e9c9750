"""ChEES and MEADS: warmup over all chains for blackjax kernels, before sampling.

``cr.from_blackjax(blackjax.dynamic_hmc | blackjax.ghmc, logdensity_fn=...,
adaptation="chees" | "meads")`` lands here. The adaptation needs statistics over all
chains, so it runs before sampling, over the real chains only (the padding chains that
fill the devices never enter a statistic), in one of two layouts:

- ``layout="sharded"`` (the default, ``_warmup_sharded``): under ``shard_map``, the
  ensemble replicated, each step's kernel calls spread over the devices at the run's
  batch width, the adaptation updated on every device from the gathered chains.
  Bitwise the same on any device count for the same batch width, and faster with more
  devices.
- ``layout="replicated"``: the same program, every device stepping all chains in one
  ``vmap``: bitwise blackjax's own ``run``, and the same on any device count, no faster
  with more.

One implementation serves both layouts (``_warmup_sharded.program``). It runs in chunks
of steps, each a call of one compiled program (``_warmup_sharded.run_chunks``): the bar
moves after each, Ctrl-C keeps the warmup done, and a checkpoint resumes it
(``pipeline/_warmup``); chunked or not, the same bits.

Sampling then runs under ``shard_map`` with the adapted shared parameters as
``Kernel.params``.
"""

from __future__ import annotations

from collections.abc import Callable
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
from ...layout import _distributed, _mesh
from ._warmup_sharded import METHODS, Shape, chees_jitter, run_chunks
from ._warmup_sharded import program as sharded_program

# Chain-independent salt for the keys of the cross-chain warmup: those keys come from
# (rng_key, salt) only, never from the layout.
_CROSS_CHAIN_SALT = 0x57A2


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


def _dhmc_functions(logdensity_fn: Callable, jitter_amount: float) -> tuple:
    import blackjax.mcmc.dynamic_hmc as dynamic_hmc

    jitter = chees_jitter(jitter_amount)

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


def meads_folds(num_chains: int, num_folds: int | None) -> int:
    """The number of MEADS folds; a clear error when the chains cannot be folded."""
    if num_chains < 2:
        raise ValueError(
            f"from_blackjax(adaptation='meads'): needs at least 2 chains, got {num_chains}."
        )
    if num_folds is None:
        # The largest fold count <= 4 (the paper's) that divides the chains with >= 4
        # chains per fold (fewer give degenerate cross-chain standard deviations); else 1.
        fits = [k for k in (4, 3, 2) if num_chains % k == 0 and num_chains // k >= 4]
        return fits[0] if fits else 1
    if num_chains % num_folds or num_chains // num_folds < 2:
        raise ValueError(
            f"from_blackjax(adaptation='meads'): num_folds={num_folds} must divide "
            f"num_chains={num_chains} with at least 2 chains per fold."
        )
    return num_folds


class CrossChainAdaptation(Adapter):
    """A blackjax kernel with cross-chain warmup (ChEES or MEADS), for ``cr.run``.

    Build it with ``cr.from_blackjax(blackjax.dynamic_hmc, logdensity_fn=...,
    adaptation="chees")`` or ``cr.from_blackjax(blackjax.ghmc, logdensity_fn=...,
    adaptation="meads")``. ``cr.run`` initialises the chains with ``build_kernel``'s ``init``,
    calls ``cross_chain_warmup`` (the adaptation over all chains, ``_warmup_sharded``),
    then samples with the returned kernel, whose adapted shared parameters are its
    ``params``.

    Attributes:
        adaptation: ``"chees"`` or ``"meads"``.
        logdensity_fn: the log density.
        options: the adaptation's options.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> obj = cr.from_blackjax(blackjax.ghmc, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                        adaptation="meads")
        >>> obj.adaptation, obj.build_kernel(num_warmup=10).needs_position
        ('meads', True)
    """

    has_cross_chain_warmup = True

    def __init__(self, adaptation: str, logdensity_fn: Callable, options: dict):
        self.adaptation = adaptation
        self.logdensity_fn = logdensity_fn
        self.options = dict(options)
        if adaptation == "chees":
            init, step = _dhmc_functions(logdensity_fn, self.options["jitter_amount"])
        else:
            init, step = _ghmc_functions(logdensity_fn, self.options["divergence_threshold"])
        self._functions = (init, step, _extract, default_logdensity)

    def __repr__(self) -> str:
        return f"CrossChainAdaptation({self.adaptation!r}, {self.options})"

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """The adapted parameters, shared by every chain: the sampling kernel's ``params``."""
        return None if params is None else jax.tree.map(np.asarray, dict(params))

    def attrs(self) -> dict[str, Any]:
        return library_attrs("blackjax")

    def sampling_kernel(self, params: Any = None) -> Kernel:
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
            >>> obj.sampling_kernel().step is obj.sampling_kernel({"step_size": 0.1}).step
            True
        """
        init, step, extract, logdensity = self._functions
        return Kernel(init=init, step=step, extract=extract, logdensity=logdensity, params=params)

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The kernel ``run`` initialises the chains with, or samples on with.

        Args:
            num_warmup: the warmup length; must be positive for a fresh run (the shared
                parameters come from the cross-chain warmup).
            previous_params: the adapted parameters of a trace being continued.

        Returns:
            A ``cr.Kernel``: without ``params`` for a fresh run, with ``previous_params``
            for a continued one.

        Raises:
            ValueError: if ``num_warmup`` is 0 and there are no ``previous_params``.

        Examples:
            >>> import blackjax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.ghmc, adaptation="meads",
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> obj.build_kernel(num_warmup=100).params is None
            True
        """
        if previous_params is not None:
            return self.sampling_kernel(previous_params)
        if num_warmup <= 0:
            raise ValueError(
                f"run: adaptation={self.adaptation!r} needs num_warmup > 0 (its step size "
                "and other shared parameters come from the cross-chain warmup); got "
                f"num_warmup={num_warmup}. To sample on from an adapted run, pass its trace "
                "(cr.run(kernel, key, trace, n)); or use .sampling_kernel(params) with known "
                "values."
            )
        return self.sampling_kernel(None)

    def cross_chain_warmup(self, request: WarmupRequest) -> WarmupChunks:
        """The cross-chain warmup over the real chains, in chunks; ``run`` drives it.

        Args:
            request: the run's key, padded sharded states, chain count, warmup length,
                mesh, batch size, chunk length, and whether to keep the warmup draws.

        Returns:
            ``WarmupChunks``, whose ``finish`` gives ``CrossChainWarmup(state, kernel,
            attrs=...)``, the adapted parameters as the kernel's ``params``.

        Examples:
            >>> import blackjax, jax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> obj = cr.from_blackjax(blackjax.ghmc, adaptation="meads",
            ...                        logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
            >>> k = obj.build_kernel(num_warmup=20)
            >>> keys = jax.random.split(jax.random.key(0), 4)
            >>> state = jax.vmap(k.init)(jnp.ones((4, 2)), keys)
            >>> w = obj.cross_chain_warmup(cr.WarmupRequest(jax.random.key(1), state,
            ...     num_chains=4, num_warmup=20, mesh=cr.chain_mesh(1), keep_warmup=False))
            >>> out = w.finish(w.step(w.start(), 0, 20)[0])
            >>> sorted(out.kernel.params)
            ['alpha', 'delta', 'momentum_inverse_scale', 'step_size']
        """
        r = request
        padded = int(jax.tree.leaves(r.state)[0].shape[0])
        if self.adaptation == "meads":
            meads_folds(r.num_chains, self.options["num_folds"])  # eager error
        chunk = min(r.chunk_size or r.num_warmup, r.num_warmup)
        replicated = self.options["layout"] == "replicated"
        shape = Shape(r.num_chains, padded, r.num_warmup, bool(r.keep_warmup), r.mesh,
                      None if replicated else r.batch_size, replicated)  # fmt: skip
        o = dict(self.options)
        if self.adaptation == "meads":
            o["num_folds"] = meads_folds(r.num_chains, o["num_folds"])
        program = sharded_program(METHODS[self.adaptation], self.logdensity_fn, o, shape,
                                  _CROSS_CHAIN_SALT)  # fmt: skip
        chunks = run_chunks(program, r.rng_key, r.state, r.num_chains, r.mesh, chunk)

        def finish(carry: Any) -> CrossChainWarmup:
            new_state, params = chunks.last(carry)
            kernel = self.sampling_kernel(params)
            attrs = _adapted_attrs(self.adaptation, params)
            return CrossChainWarmup(_mesh.place(new_state, r.mesh), kernel, attrs=attrs)

        return WarmupChunks(chunk, chunks.start, chunks.step, finish, chunks.fingerprint)


def _adapted_attrs(adaptation: str, params: dict) -> dict[str, Any]:
    """``{"adaptation": ..., "adapted_<name>": value}`` for the trace's attrs."""
    attrs: dict[str, Any] = {"adaptation": adaptation}
    for name, value in _distributed.to_host(params).items():
        value = np.asarray(jax.tree.leaves(value)[0]) if name != "step_size" else value
        attrs[f"adapted_{name}"] = (
            float(value) if np.ndim(value) == 0 else np.asarray(value).tolist()
        )
    return attrs
