"""The ``start`` and ``place`` stages: where a run starts, and how its chains sit on the mesh.

A run starts fresh (from initial positions, or from the kernel's own init) or continues a
``Trace`` (from its final state, step numbering carried on). Placement builds the mesh
(when none is given), the layout (padding, ``batch_size``), and puts the chain indices,
the run's key and the kernel's parameters on the mesh.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from ..core._checks import leading_size
from ..core._kernel import Adapter, Kernel
from ..core._lru import LRU
from ..layout import _distributed, _mesh
from ..output._trace import Trace
from ..programs import _choose, _ensemble
from . import _diagnose
from ._plan import Plan

# Parameters replicated on a mesh, while their leaves live (``replicate_params``).
_REPLICATED = LRU(8)


class Start(NamedTuple):
    """Where a run starts.

    Attributes:
        kernel: the kernel to initialise (and, without cross-chain warmup, to sample) with.
        num_chains: the chains of the run.
        position: initial positions (leading chain axis), or ``None``.
        state: the final state of a continued trace (leading chain axis), else ``None``.
        first_step: global number of the run's first step (a continued trace's ``num_steps``).
        cross_chain: the adapter's cross-chain warmup runs before sampling.
        previous_batch_size: a continued trace's ``attrs["batch_size"]`` (``"all"`` or
            a number), else ``None``.
        previous_chunk_size: a continued trace's ``attrs["chunk_size"]``, else ``None``.
    """

    kernel: Kernel
    num_chains: int
    position: Any
    state: Any
    first_step: int
    cross_chain: bool
    previous_batch_size: Any = None
    previous_chunk_size: int | None = None


def starting_point(plan: Plan, adapter: Adapter, initial_position: Any) -> Start:
    """Resolves the kernel and checks the initial position (or continued trace) against it."""
    where = "run"
    if isinstance(initial_position, Trace):
        previous = initial_position
        kernel = _this_call(
            adapter.build_kernel(num_warmup=plan.num_warmup, previous_params=previous.kernel_params)
        )
        if plan.warmup_until is not None:
            raise ValueError(
                "run: warmup_until applies to a fresh run; the chains of a continued trace "
                "are past their warmup (pass warmup_until=None to continue)."
            )
        state = previous.final_state
        n = leading_size(state, "initial_position.final_state", where)
        chunk = previous.attrs.get("chunk_size")
        chunk = None if chunk is None else int(chunk)
        start = Start(kernel, n, None, state, previous.num_steps, False,
                      previous.attrs.get("batch_size"), chunk)  # fmt: skip
    else:
        if adapter.needs_warmup and plan.num_warmup == 0:
            name = getattr(getattr(adapter, "sampler", adapter), "name", "window")
            raise ValueError(
                "run: num_warmup=0, but this kernel adapts its parameters (step size, mass "
                f"matrix, ...) during warmup (adaptation={name!r}): with no warmup they "
                "would never be adapted. Pass num_warmup > 0 (e.g. 1000); to sample at "
                "fixed values, pass the algorithm itself (blackjax.nuts(logdensity_fn, "
                "step_size, inverse_mass_matrix))."
            )
        kernel = _this_call(adapter.build_kernel(num_warmup=plan.num_warmup))
        if initial_position is not None:
            n = leading_size(initial_position, "initial_position", where)
            if _diagnose.as_states(kernel, initial_position):  # the pmap recipe's states
                return _checked(plan, Start(kernel, n, None, initial_position, 0, False))
        elif kernel.needs_position:
            raise ValueError(
                "run: initial_position is None, but this kernel needs initial positions "
                "(a pytree whose leaves have a leading chain axis)."
            )
        elif plan.num_chains is None:
            raise ValueError("run: num_chains is required when initial_position is None.")
        else:
            n = plan.num_chains
        cross = adapter.has_cross_chain_warmup and plan.num_warmup > 0
        if cross and plan.warmup_until is not None and plan.keep_warmup and plan.keep is not None:
            raise ValueError(
                "run: warmup_until with keep_warmup=True and keep= is not supported after a "
                "cross-chain warmup (its kept draws are whole positions, the added windows' "
                "what keep= stores); drop keep_warmup or keep."
            )
        start = Start(kernel, n, initial_position, None, 0, cross)
    return _checked(plan, start)


def _this_call(kernel: Kernel) -> Kernel:
    """A new ``Kernel`` object for this call (the same functions): the trace of its step
    that the call's stages share (``_programs.kernel_step``, cached per kernel object) is
    never replayed in another call's program, which traces what the kernel computes then."""
    return kernel._replace()


def _checked(plan: Plan, start: Start) -> Start:
    """``start``, checked against the plan's chain count, ensemble and superchains."""
    if plan.num_chains is not None and plan.num_chains != start.num_chains:
        raise ValueError(
            f"run: num_chains={plan.num_chains} but initial_position has {start.num_chains} "
            "chains (leading axis)."
        )
    if start.kernel.ensemble is not None:
        _ensemble.check(plan, start.num_chains)
    k = plan.superchains
    if k is not None and (start.num_chains % k or start.num_chains // k < 1):
        raise ValueError(
            f"run: superchains={k} must divide the number of chains ({start.num_chains}): "
            "every superchain has the same number of chains."
        )
    return start


def one_chain_note(start: Start) -> str:
    """What the kernel got for one chain: a note for an error it raised on it, which
    ``_diagnose.diagnose`` did not explain."""
    what, tree = (
        ("the final state of the continued trace", start.state)
        if start.state is not None
        else ("initial_position", start.position)
    )
    if tree is None:
        return "chainrunner: the kernel initialised each chain itself (initial_position=None)."
    shapes = jax.tree.map(lambda x: tuple(np.shape(x)[1:]), tree)
    return (
        f"chainrunner: the kernel ran on one chain's values at a time ({start.num_chains} "
        f"chains): {what}, each chain's shapes {shapes}."
    )


class Placement(NamedTuple):
    """The chains on the mesh.

    Attributes:
        mesh: the mesh (one axis ``'chain'``).
        layout: chains per device, padding and ``batch_size``.
        batch_choice: why this ``batch_size`` (``"given"`` or what ``"auto"`` found).
        chains: chain indices ``0..n-1``, padded, sharded ``P('chain')``.
        init_chains: the chain whose init key (and initial position) each chain starts
            from: itself, or the first chain of its superchain; padded, sharded.
        key: the run's key, replicated.
        params: the kernel's parameters, replicated (or ``None``).
        options: XLA's options for the chunk program (``_choose.compile_options``).
        init_options: XLA's options for the init program (``_choose.init_compile_options``).
    """

    mesh: Mesh
    layout: _mesh.Layout
    batch_choice: str
    chains: jax.Array
    init_chains: jax.Array
    key: jax.Array
    params: Any
    options: tuple = ()
    init_options: tuple = ()


@functools.lru_cache(maxsize=16)
def _placed_ids(n: int, padded: int, mesh: Mesh, superchains: int | None) -> jax.Array:
    """Chain indices on the mesh (a run's, or each chain's superchain leader's).

    Cached: the same layout's indices are the same immutable array, placed once (a
    host-to-device copy less in every call of a run that is repeated).
    """
    ids = _mesh.chain_ids(n, padded)
    if superchains is not None:
        ids = (ids - ids % (n // superchains)).astype(ids.dtype)
    return _mesh.place(ids, mesh)


def replicate_params(kernel: Kernel, mesh: Mesh) -> Any:
    """The kernel's parameters replicated over the mesh (``None`` stays ``None``).

    Where every leaf is a ``jax.Array`` (immutable: the adapters turn a model's data
    into them once), the same leaves on the same mesh give the same replicated arrays,
    kept while those leaves live: a repeated run skips a host-to-device copy of its
    data (a measurable part of a short run's fixed cost). numpy leaves, which can change
    in place, are copied every time.
    """
    if kernel.params is None:
        return None
    leaves, treedef = jax.tree.flatten(kernel.params)
    if (
        not leaves
        or _distributed.is_multiprocess()
        or not all(isinstance(x, jax.Array) for x in leaves)
    ):
        return _mesh.replicate(kernel.params, mesh)
    key = (mesh, treedef, *map(id, leaves))
    found, hit = _REPLICATED.lookup(key)
    if found and all(ref() is x for ref, x in zip(hit[0], leaves, strict=True)):
        return hit[1]
    placed = _mesh.replicate(kernel.params, mesh)

    def drop(_: Any, cache: LRU = _REPLICATED) -> None:  # a leaf died: its id may be reused
        cache.discard(key)  # (bound: at exit the module's globals may be gone first)

    _REPLICATED.put(key, ([weakref.ref(x, drop) for x in leaves], placed))
    return placed


def place(plan: Plan, start: Start) -> Placement:
    """Builds the mesh and layout (``batch_size="auto"`` decided here, once: ``_choose``),
    and places chain indices, key and parameters on it."""
    n = start.num_chains
    mesh = plan.mesh
    if mesh is None:
        # Several processes: every process must hold part of the mesh: all devices.
        multi = _distributed.is_multiprocess()
        mesh = _mesh.chain_mesh(None if multi else min(n, len(jax.devices())))
    _distributed.check_mesh_spans_processes(mesh, "run")
    choice = _choose.choose(plan, start, mesh)
    layout = _mesh.make_layout(n, mesh, choice.batch_size)
    chains = _placed_ids(n, layout.padded, mesh, None)
    options = _choose.compile_options(start, mesh, choice.batch_size)
    return Placement(
        mesh=mesh,
        layout=layout,
        batch_choice=choice.reason,
        chains=chains,
        init_chains=_placed_ids(n, layout.padded, mesh, plan.superchains),
        key=_mesh.replicate(plan.rng_key, mesh),
        params=replicate_params(start.kernel, mesh),
        options=options,
        init_options=_choose.init_compile_options(options, mesh),
    )
