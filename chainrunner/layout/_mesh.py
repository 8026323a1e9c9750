"""The device mesh, chain layout, padding and placement.

This is the only module that touches ``Mesh``, ``PartitionSpec`` and ``shard_map``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..core._checks import check_int
from . import _distributed

AXIS = "chain"
"""The name of the mesh axis that chains are spread over."""


def chain_mesh(
    num_devices: int | None = None, *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """Builds a one-dimensional device mesh whose only axis is named ``'chain'``.

    Chains are spread over this axis: each device holds a contiguous block of chains.

    Args:
        num_devices: use the first ``num_devices`` devices of ``jax.devices()``.
            ``None`` (and no ``devices``) means all of them.
        devices: an explicit list of devices; exclusive with ``num_devices``.

    Returns:
        A ``jax.sharding.Mesh`` with axis names ``('chain',)``.

    Raises:
        ValueError: for a device count below 1 or above the number of devices, or
            both arguments given.

    Examples:
        >>> import chainrunner as cr
        >>> mesh = cr.chain_mesh(num_devices=1)
        >>> mesh.axis_names
        ('chain',)
    """
    if devices is not None and num_devices is not None:
        raise ValueError(
            "chain_mesh: give num_devices or devices, not both "
            f"(got num_devices={num_devices!r} and {len(devices)} devices)."
        )
    if devices is None:
        available = jax.devices()
        if num_devices is None:
            devices = available
        else:
            check_int("num_devices", num_devices, minimum=1, where="chain_mesh")
            if num_devices > len(available):
                raise ValueError(
                    f"chain_mesh: num_devices={num_devices} but only {len(available)} "
                    f"{available[0].platform} device(s) are available. On CPU, ask for "
                    "more with cr.request_cpu_devices(n) before any JAX work."
                )
            devices = available[:num_devices]
    else:
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
            raise TypeError(f"chain_mesh: devices must be a list of jax devices, got {devices!r}.")
        devices = list(devices)
        if not devices:
            raise ValueError("chain_mesh: devices is empty; expected at least one device.")
        bad = [d for d in devices if not isinstance(d, jax.Device)]
        if bad:
            raise TypeError(
                f"chain_mesh: devices must be jax devices (e.g. jax.devices()[:4]), got {bad[0]!r}."
            )
        if len(set(devices)) != len(devices):
            raise ValueError(f"chain_mesh: devices has duplicates: {devices}.")
    return Mesh(np.asarray(devices, dtype=object), (AXIS,))


def request_cpu_devices(n: int) -> None:
    """Asks JAX for ``n`` simulated CPU devices; call before any JAX computation.

    This sets the ``jax_num_cpu_devices`` option. chainrunner never does so on import:
    it is the application's decision. Once JAX's backends are up the number of
    devices can no longer change, and this raises instead of silently doing nothing.

    Args:
        n: the number of CPU devices wanted (at least 1).

    Raises:
        RuntimeError: if JAX's backends are already initialised with another count.

    Examples:
        >>> import chainrunner as cr
        >>> import jax
        >>> cr.request_cpu_devices(len(jax.devices("cpu")))  # already up: same count is fine
    """
    check_int("n", n, minimum=1, where="request_cpu_devices")
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:  # JAX refuses once its backends are up
        have = len(jax.devices("cpu"))
        if have == n:
            return
        raise RuntimeError(
            f"request_cpu_devices({n}): JAX's backends are already initialised with {have} "
            "CPU device(s). Call it right after `import jax`, before any array is created "
            "and before importing libraries that create arrays when imported (blackjax "
            "does: `import chainrunner as cr; cr.request_cpu_devices(n)`, then `import "
            "blackjax`), or set JAX_NUM_CPU_DEVICES in the environment."
        ) from e


@dataclasses.dataclass(frozen=True)
class Layout:
    """How ``num_chains`` chains sit on a mesh.

    Attributes:
        num_chains: chains the user asked for.
        num_devices: devices along the ``'chain'`` axis.
        per_device: chains held by each device (after padding).
        batch_size: chains advanced together inside a device (``None``: all of them).
    """

    num_chains: int
    num_devices: int
    per_device: int
    batch_size: int | None

    @property
    def padded(self) -> int:
        """Total chains after padding (a multiple of the device count)."""
        return self.num_devices * self.per_device

    def describe(self) -> str:
        b = "None" if self.batch_size is None else self.batch_size
        return (
            f"{self.num_chains} chains on {self.num_devices} device(s), "
            f"{self.per_device} per device, batch_size={b}"
            + (
                f" ({self.padded - self.num_chains} padded)"
                if self.padded > self.num_chains
                else ""
            )
        )


def auto_batch_size(
    batch_size: int | str | None, mesh: Mesh, num_chains: int
) -> tuple[int | None, str]:
    """Resolves ``batch_size="auto"`` by a fixed rule; returns the batch size and why.

    ``cr.chain_map``'s rule (``run`` also weighs the step's cost and the run's length, see
    ``_choose``):

    - **CPU devices: 1.** Each device computes its chains one after another, without
      ``vmap``: a ``vmap`` turns a function's loops into loops until the slowest chain
      of the batch is done, and compiles about twice as long (``docs/batch-size.md``).
    - **Accelerators (GPU, TPU): None.** One ``vmap`` over a device's chains: the width
      is what keeps an accelerator busy. With one chain per device there is nothing to
      batch: 1, the pmap recipe's unbatched chain.

    Any other value is returned unchanged.
    """
    if batch_size != "auto":
        return batch_size, "given"  # type: ignore[return-value]
    platform = mesh.devices.flat[0].platform
    if platform == "cpu":
        return 1, "auto: 1 on CPU devices (chains one after another, no vmap)"
    if math.ceil(num_chains / mesh.shape[AXIS]) == 1:
        return 1, f"auto: one chain per device on {platform}, not vmapped"
    return None, f"auto: one vmap over a device's chains on {platform}"


def make_layout(num_chains: int, mesh: Mesh, batch_size: int | None) -> Layout:
    """Pads ``num_chains`` to ``devices * ceil(ceil(n / devices) / b) * b``.

    A ``batch_size`` of at least the chains per device is one ``vmap`` over them
    (``batch_size=None``), so a large ``batch_size`` never adds padded chains.
    ``batch_size=1`` stays 1 (no ``vmap``) even with one chain per device.
    """
    d = mesh.shape[AXIS]
    local = math.ceil(num_chains / d)
    if batch_size is None or (batch_size != 1 and batch_size >= local):
        b = None  # one batch holding every local chain is a plain vmap
        per_device = local
    else:
        b = batch_size
        per_device = math.ceil(local / b) * b
    return Layout(num_chains, d, per_device, b)


def pad(tree: Any, n: int, padded: int) -> Any:
    """Pads every leaf's leading axis from ``n`` to ``padded`` by repeating the last row."""
    if padded == n:
        return tree

    def _pad(x):
        x = jnp.asarray(x)
        extra = jnp.broadcast_to(x[-1:], (padded - n, *x.shape[1:]))
        return jnp.concatenate([x, extra], axis=0)

    return jax.tree.map(_pad, tree)


def chain_ids(n: int, padded: int) -> np.ndarray:
    """Chain indices ``0..n-1``, padded by repeating the last (as ``pad``)."""
    return np.minimum(np.arange(padded), n - 1).astype(np.uint32)


def chain_sharding(mesh: Mesh) -> NamedSharding:
    """``NamedSharding(mesh, P('chain'))``: how per-chain arrays are laid out."""
    return NamedSharding(mesh, P(AXIS))


def place(tree: Any, mesh: Mesh) -> Any:
    """Places every leaf with ``NamedSharding(mesh, P('chain'))``.

    With several JAX processes the leaves become global arrays, built from the full
    host value that every process holds (see ``_distributed.global_array``).
    """
    return _distributed.put(tree, chain_sharding(mesh))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Places every leaf replicated over the mesh (``P()``); global arrays likewise."""
    return _distributed.put(tree, NamedSharding(mesh, P()))


def unpad(tree: Any, n: int, padded: int, mesh: Mesh) -> Any:
    """Slices every leaf's leading axis back to ``n``, on the devices.

    When ``n`` is a multiple of the device count the result keeps
    ``NamedSharding(mesh, P('chain'))``; otherwise no such sharding exists (JAX
    needs even blocks) and the result is replicated over the mesh.
    """
    if padded == n:
        return tree
    d = mesh.shape[AXIS]
    spec = P(AXIS) if n % d == 0 else P()
    return _slicer(n, NamedSharding(mesh, spec))(tree)


@functools.lru_cache(maxsize=64)
def _slicer(n: int, sharding: NamedSharding) -> Callable:
    return jax.jit(lambda tree: jax.tree.map(lambda x: x[:n], tree), out_shardings=sharding)


def local_map(fn: Callable, batch_size: int | None) -> Callable:
    """Maps ``fn`` over the chains held by one device.

    ``batch_size=1`` is not vmapped at all: a plain loop over the chains, whose while
    loops (NUTS's tree building) stay unbatched. That compiles to about half the code of
    a vmapped loop and never advances a chain in lockstep with another. Every other
    batch size vmaps: ``None`` (or one at least the local chains) is one ``vmap`` over
    them, even a single chain; otherwise ``lax.map`` with that batch size (a sequential
    loop over vmapped batches). A ``vmap`` of one chain is the same computation batched,
    and XLA may lay it out differently: it sampled a model whose step is a matrix
    product 1.6x faster on CPU (``docs/batch-size.md``).
    """

    def mapped(xs: Any) -> Any:
        width = jax.tree.leaves(xs)[0].shape[0]
        if batch_size == 1:
            return jax.lax.map(fn, xs)
        if batch_size is None or batch_size >= width:
            return jax.vmap(fn)(xs)
        return jax.lax.map(fn, xs, batch_size=batch_size)

    return mapped


def shard_chains(fn: Callable, mesh: Mesh, num_chained: int, num_replicated: int = 0) -> Callable:
    """``jit(shard_map(fn))``: the first ``num_chained`` args split over ``'chain'``.

    The remaining ``num_replicated`` args are replicated. Every output is split over
    ``'chain'``: ``out_specs=P('chain')`` always (``P()`` with ``check_vma=False``
    would silently return device 0's block only).
    """
    in_specs = (P(AXIS),) * num_chained + (P(),) * num_replicated
    # out_shardings as well: jit otherwise gave a zero-size output (the low-rank Fisher
    # basis with every direction kept, (chains, 2, d, 0)) the sharding P(), so the state
    # the init program returned differed from what the loop was compiled for ahead of it,
    # and the loop compiled a second time (3.6 s on eight schools).
    # check_vma=False: blackjax and numpyro NUTS fail shard_map's varying-axes check
    # (their U-turn buffers and while-loop carries start from replicated constants).
    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P(AXIS), check_vma=False),
        out_shardings=NamedSharding(mesh, P(AXIS)),
    )
