"""The ``initialise`` stage: every chain's initial state, and what to do with bad starts.

Chains whose log density is not finite at the start are handled as ``on_bad_init``
says: ``"raise"`` names them, ``"warn"`` runs them anyway, ``"reinit"`` gives them new
starts (the user's position jittered with their new init keys) up to ``MAX_REINIT`` times.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core._kernel import Kernel
from ..layout import _distributed, _mesh
from ..output._diagnostics import ChainrunnerWarning, caller_stacklevel
from ..programs._compile import compiled
from ..programs._programs import chain_keys, init_program, retry_key

MAX_REINIT = 10


class Initialised(NamedTuple):
    """The output of ``initialise``: placed states, compile seconds, re-initialised chains."""

    state: Any
    compile_time: float
    reinitialised: list[int]


def jitter_fn(init_jitter: float | Callable) -> Callable:
    """``(rng_key, position) -> position``: normal noise of scale ``init_jitter``."""
    if callable(init_jitter):
        return init_jitter

    def jitter(rng_key, position):
        leaves, treedef = jax.tree.flatten(position)
        keys = jax.random.split(rng_key, len(leaves))
        return jax.tree.unflatten(
            treedef,
            [
                x + init_jitter * jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
                for x, k in zip(leaves, keys, strict=True)
            ],
        )

    return jitter


def _init_once(kernel: Kernel, placed: Any, position: Any, tries: np.ndarray, on_traced) -> tuple:
    """One initialisation of every chain: ``(state, lp on the host or None, compile seconds)``."""
    layout, mesh = placed.layout, placed.mesh
    if position is not None and placed.init_chains is not placed.chains:
        leaders = np.asarray(_distributed.to_host(placed.init_chains))[: layout.num_chains]
        position = jax.tree.map(lambda x: x[leaders], position)  # a superchain's first chain's
    args = (
        _mesh.place(_mesh.pad(position, layout.num_chains, layout.padded), mesh),
        placed.init_chains,
        _placed_tries(tries, layout.num_chains, layout.padded, mesh),
        placed.key,
        placed.params,
    )
    b, n = layout.batch_size, layout.num_chains
    program = init_program(kernel, mesh, b, n)
    init, dt = compiled("init", program, args, on_traced, placed.init_options)
    state, lp = init(*args)
    if kernel.logdensity is None:
        return state, None, dt
    return state, np.asarray(_distributed.to_host(lp))[: layout.num_chains], dt


@functools.lru_cache(maxsize=16)
def _no_tries(padded: int, mesh: Any) -> jax.Array:
    """Zero re-initialisations for every chain, on the mesh (cached: the first try of
    every run, one host-to-device copy less in each call of a repeated run)."""
    return _mesh.place(np.zeros(padded, np.int32), mesh)


def _placed_tries(tries: np.ndarray, n: int, padded: int, mesh: Any) -> jax.Array:
    """The re-initialisations per chain (``n``, padded to ``padded``), on the mesh."""
    if not tries.any():
        return _no_tries(padded, mesh)
    return _mesh.place(tries[_mesh.chain_ids(n, padded)], mesh)


def _bad_start(bad: np.ndarray, lp: np.ndarray, how: str, hint: str | None, last: bool) -> None:
    """Raises or warns about chains ``bad`` that start at a non-finite log density."""
    message = (
        f"run: initial_position: the log density is not finite at the start of "
        f"chain(s) {bad.tolist()} (values {lp[bad].tolist()[:8]})."
    )
    hint = f" {hint}" if hint else ""
    if how == "raise":
        raise ValueError(
            f"{message} Start those chains inside the support of the target, or pass "
            f'on_bad_init="reinit".{hint}'
        )
    if how == "warn":
        warnings.warn(
            f"{message} Running them anyway (on_bad_init='warn').",
            ChainrunnerWarning,
            stacklevel=caller_stacklevel(),
        )
    elif last:
        raise ValueError(
            f"{message} Still not finite after {MAX_REINIT} re-initialisations "
            f"(on_bad_init='reinit'); start those chains inside the support of the target.{hint}"
        )


def initialise(
    kernel: Kernel, plan: Any, placed: Any, position: Any, hint: str | None, on_traced=None
) -> Initialised:
    """Initialises every chain from ``position``; handles non-finite starts as the plan says.

    ``on_traced`` is passed to ``compiled`` for the init program (the first try only).
    """
    n = placed.layout.num_chains
    compile_time, reinit = 0.0, []
    origin = position  # every retry jitters the user's start afresh (no random walk)
    tries = np.zeros(n, np.int32)  # re-initialisations per chain (they change its init key)
    for attempt in range(MAX_REINIT + 1):
        state, lp, dt = _init_once(kernel, placed, position, tries, on_traced)
        on_traced, compile_time = None, compile_time + dt
        bad = np.flatnonzero(~np.isfinite(lp)) if lp is not None else np.zeros(0, int)
        if not bad.size:
            break
        _bad_start(bad, lp, plan.on_bad_init, hint, attempt == MAX_REINIT)
        if plan.on_bad_init == "warn":
            break
        reinit = sorted(set(reinit) | set(bad.tolist()))
        tries[bad] += 1
        position = _reinit(position, origin, plan, bad, tries)
    if reinit:
        _reinit_warning(tries)
    return Initialised(state, compile_time, reinit)


def _reinit_warning(tries: np.ndarray) -> None:
    """One warning for every re-initialisation of a run, with the counts (not one per try)."""
    chains = np.flatnonzero(tries)
    shown = chains.tolist()[:8] + (["..."] if chains.size > 8 else [])
    per_chain = ", ".join(str(int(tries[c])) for c in chains[:8])
    warnings.warn(
        f"run: re-initialised chain(s) {shown}, {int(tries.sum())} time(s) in all "
        f"({per_chain}{', ...' if chains.size > 8 else ''} per chain), after a non-finite "
        "log density at the start (on_bad_init='reinit').",
        ChainrunnerWarning,
        stacklevel=caller_stacklevel(),
    )


def _reinit(position: Any, origin: Any, plan: Any, bad: np.ndarray, tries: np.ndarray) -> Any:
    """New starts for the chains ``bad``: ``origin`` jittered with their new init keys.

    A chain's init key after ``t`` re-initialisations is its init key folded with
    1, 2, ..., ``t`` (``retry_key``, as the init program derives it); its jitter uses
    ``fold_in(that key, 0)``. So the keys of a try derive from the chain's key only.
    """
    if position is None:  # the kernel initialises itself: the new init keys suffice
        return None
    jitter = jitter_fn(plan.init_jitter)
    mask = np.zeros(len(tries), bool)
    mask[bad] = True
    init_keys = jax.vmap(retry_key)(chain_keys(plan.rng_key, len(tries))[0], jnp.asarray(tries))

    def one(pos, org, key, is_bad):
        new = jitter(jax.random.fold_in(key, 0), org)
        return jax.tree.map(lambda a, b: jnp.where(is_bad, a, b), new, pos)

    return jax.vmap(one)(position, origin, init_keys, jnp.asarray(mask))
