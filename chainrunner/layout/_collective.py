"""Chains that see each other, inside ``shard_map``: the whole ensemble on every device.

Ensemble samplers (numpyro's ``AIES``, ``ESS``) and cross-chain warmup (ChEES, MEADS)
need, at every step, small quantities of all chains: positions, directions, acceptance
rates. One mechanism serves both, inside the ``shard_map`` over the ``'chain'`` axis:

- the ensemble's small state is **replicated**: every device holds every chain's
  position (and the ensemble's own key and statistics), the same bits on every device;
- the **per-chain work** (log densities, kernel steps) is **spread**: ``spread`` pads
  the rows, each device runs the function over its block of rows in a loop over
  batches of exactly ``width`` rows, and ``all_gather`` hands every row's result back
  to every device, in chain order;
- every statistic over the chains is then computed by each device from the same full
  arrays, in the same order: no ``psum``, whose summation order depends on the device
  count.

So a run gives the same draws on 1, 2, 3 or 8 devices as long as ``width`` is the same
(a row's result depends on its own inputs and the batch width only), and the padding
rows, copies of the last real row, are dropped before any statistic sees them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from . import _mesh

AXIS = _mesh.AXIS


def rows(tree: Any) -> int:
    """The leading size shared by every leaf of ``tree``."""
    return int(jax.tree.leaves(tree)[0].shape[0])


def mine(tree: Any, per: int) -> Any:
    """This device's ``per`` rows of a replicated, padded ``tree`` (inside ``shard_map``)."""
    start = jax.lax.axis_index(AXIS) * per
    return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, per), tree)


def gather(tree: Any, m: int) -> Any:
    """Every device's rows of ``tree``, in device order, cut to the first ``m`` rows.

    Inside ``shard_map``: the inverse of ``mine`` (the padding rows are dropped).
    """
    return jax.tree.map(lambda x: jax.lax.all_gather(x, AXIS, tiled=True)[:m], tree)


def auto_width(m: int) -> int:
    """The default batch width for ``m`` rows: an eighth of them, rounded up.

    Eight batches to share out, so that up to 8 devices each get at least one; the
    width depends on ``m`` alone, never on the device count, so a run gives the same
    bits on any number of devices.
    """
    return max(1, math.ceil(m / 8))


def _batches(fn: Callable, xs: Any, width: int, count: int) -> Any:
    """``fn`` over the first ``count * width`` rows of ``xs``, ``width`` rows at a time.

    Always a loop, whose trip count XLA cannot see (``optimization_barrier``): a loop
    of one trip would be removed and its body compiled with the code around it, and a
    row would then come out with other round-off on a device that runs one batch than
    on one that runs several (measured with ChEES). Width 1 calls ``fn`` on single
    rows, without ``vmap``.
    """
    one = fn if width == 1 else jax.vmap(fn)

    def batch(i):
        rows_i = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * width, width), xs)
        if width == 1:
            return jax.tree.map(
                lambda y: jnp.asarray(y)[None], one(jax.tree.map(lambda x: x[0], rows_i))
            )
        return one(rows_i)

    shapes = jax.eval_shape(batch, 0)
    out = jax.tree.map(lambda s: jnp.zeros((count * width, *s.shape[1:]), s.dtype), shapes)

    def body(i, out):
        return jax.tree.map(
            lambda o, y: jax.lax.dynamic_update_slice_in_dim(o, y, i * width, 0), out, batch(i)
        )

    trips = jax.lax.optimization_barrier(jnp.int32(count))  # XLA cannot fold it
    return jax.lax.fori_loop(0, trips, body, out)


def spread(fn: Callable, xs: Any, *, devices: int, width: int | None) -> Any:
    """``fn`` on every row of ``xs`` (replicated), the rows split over the devices.

    Inside ``shard_map`` over ``'chain'`` with ``devices`` devices. ``xs``' leaves
    share a leading axis of ``m`` rows; the result is ``fn``'s output for all ``m``
    rows, on every device. ``width`` is the batch width: each device runs ``fn`` over
    its block of rows that many at a time (one ``vmap`` per batch; 1: no ``vmap``), so
    a row's result depends on its inputs and the width only, never on the device
    count; ``None``: one batch per device (then the width, hence round-off, depends on
    the device count).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> from jax.sharding import PartitionSpec as P
        >>> from chainrunner.layout._collective import spread
        >>> mesh = cr.chain_mesh(1)
        >>> f = jax.shard_map(lambda x: spread(jnp.sin, x, devices=1, width=2), mesh=mesh,
        ...                   in_specs=P(), out_specs=P(), check_vma=False)
        >>> bool(jnp.allclose(f(jnp.arange(5.0)), jnp.sin(jnp.arange(5.0))))
        True
    """
    m = rows(xs)
    w = width if width is not None else math.ceil(m / devices)
    count = math.ceil(m / (devices * w))  # batches per device
    # A device reads its batches from a block of at least two: slicing one batch out of
    # a block of one is no slice at all, and XLA then compiles the loop's body (hence
    # its round-off) otherwise than on a device that runs several batches.
    size = max(count, 2) * w
    padded = _mesh.pad(xs, m, (devices - 1) * count * w + size)
    start = jax.lax.axis_index(AXIS) * count * w
    block = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), padded)
    return gather(_batches(fn, block, w, count), m)
