"""``chain_map``: a ``pmap`` replacement for per-chain work."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh

from ..core._checks import check_batch_size, check_mesh, leading_size
from ..layout import _distributed, _mesh
from ._compile import compiled, signature


def chain_map(
    fn: Callable[..., Any], *, mesh: Mesh | None = None, batch_size: int | str | None = None
) -> Callable[..., Any]:
    """Maps ``fn`` over a leading chain axis, spread over the devices of a mesh.

    ``chain_map(fn)(*args, **kwargs)`` has the values of ``jax.vmap(fn)(*args, **kwargs)``
    (keyword arguments are mapped over their leading axis too). It runs
    ``fn`` under ``jax.jit`` + ``jax.shard_map`` over the mesh's ``'chain'`` axis;
    inside each device ``batch_size=None`` vmaps over all local chains, and an
    integer loops over batches of that many (``lax.map``), which bounds memory and
    can be faster for samplers with data-dependent loops. Any number of chains
    works: they are padded on the host by repeating the last chain and the outputs
    are sliced back.

    Compiled once: the first call with arguments of new shapes traces ``fn`` and finds
    its compiled program by what it computes ([what is compiled when](compilation.md)), so a new
    ``chain_map`` of the same function (a notebook cell run again, numpyro's ``MCMC``
    with ``chain_method=cr.chain_map``) or a new process compiles nothing again. Later
    calls of the same mapped function with arguments of those shapes run that program
    without tracing, as ``jax.jit`` does.

    Args:
        fn: a function of per-chain arguments (no chain axis).
        mesh: a mesh with a ``'chain'`` axis; ``None``: as ``run`` builds it, over
            as many devices as there are chains, at most all (4 chains on 8 devices
            take 4 devices, none padded); with several processes, all devices.
        batch_size: chains computed together within one device, ``None`` for all, or
            ``"auto"``: 1 on CPU devices, ``None`` on accelerators (a fixed rule;
            ``run`` decides its own from the call's facts, see
            [choosing batch_size](batch-size.md)).

    Returns:
        A function of the same arguments, each leaf with a leading chain axis. Its
        outputs have that leading axis too, sharded ``NamedSharding(mesh, P('chain'))``
        when the chain count is a multiple of the device count (otherwise no such
        sharding exists and they are replicated over the mesh). With several JAX
        processes (``jax.distributed``) every process calls it with the same full
        arguments and gets global arrays back (read them whole with
        ``jax.experimental.multihost_utils.process_allgather(out, tiled=True)``).

    Examples:
        >>> import jax.numpy as jnp
        >>> import chainrunner as cr
        >>> g = cr.chain_map(lambda x, y: x * y + 1.0)
        >>> g(jnp.arange(3.0), jnp.ones(3)).tolist()
        [1.0, 2.0, 3.0]
    """
    if not callable(fn):
        raise TypeError(f"chain_map: fn must be callable, got {type(fn).__name__}.")
    if mesh is not None:
        check_mesh(mesh, "chain_map")
    batch_size = check_batch_size(batch_size, "chain_map")
    programs: dict[tuple, Callable] = {}  # (layout, signature) -> compiled program

    @functools.wraps(fn)
    def mapped(*args, **kwargs):
        names = tuple(sorted(kwargs))  # keyword arguments are mapped too, as by jax.vmap
        flat = (*args, *(kwargs[k] for k in names))
        # errors name a keyword argument by its name (mapped like jax.vmap's: a value to
        # broadcast goes in with functools.partial)
        n = (
            leading_size(args, "args", "chain_map")
            if not kwargs
            else leading_size({"args": args, "kwargs": kwargs}, "", "chain_map")
        )
        m = mesh if mesh is not None else _default_mesh(n)
        _distributed.check_mesh_spans_processes(m, "chain_map")
        layout = _mesh.make_layout(n, m, _mesh.auto_batch_size(batch_size, m, n)[0])
        placed = _mesh.place(_mesh.pad(flat, n, layout.padded), m)
        key = (m, len(args), names, layout.batch_size, signature(placed))
        if key not in programs:
            local = _mesh.local_map(_positional(fn, len(args), names), layout.batch_size)
            program = _mesh.shard_chains(lambda *a: local(a), m, len(flat))
            programs[key] = compiled("chain_map", program, placed)[0]
        out = programs[key](*placed)
        return _mesh.unpad(out, n, layout.padded, m)

    return mapped


def _positional(fn: Callable[..., Any], num_args: int, names: tuple) -> Callable[[tuple], Any]:
    """``fn`` of one tuple: ``num_args`` positional arguments, then ``names``' values."""

    def call(flat: tuple) -> Any:
        return fn(*flat[:num_args], **dict(zip(names, flat[num_args:], strict=True)))

    return call


def _default_mesh(num_chains: int) -> Mesh:
    """``run``'s default mesh: one device per chain up to all of them (all with several
    processes, each of which must hold part of the mesh)."""
    if _distributed.is_multiprocess():
        return _mesh.chain_mesh()
    return _mesh.chain_mesh(min(num_chains, len(jax.devices())))
