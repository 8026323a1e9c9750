"""Multi-process (multi-host) helpers: global arrays in, host values out.

After ``jax.distributed.initialize(...)`` in every process, ``jax.devices()`` lists
the devices of all processes, but each process can only read and write its own
(``jax.local_devices()``). chainrunner keeps one rule: every process calls ``run``
(or ``chain_map``) with the same full host inputs; each builds the global arrays
from them (only its own shards are copied to its devices), and every process gets
the full draws back (``process_allgather``), so all of them hold the same ``Trace``.

With one process every helper here is the plain single-process operation
(``jax.device_put``, ``jax.device_get``), so nothing changes there.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding


def is_multiprocess() -> bool:
    """Whether this program runs as one of several JAX processes.

    Returns:
        ``jax.process_count() > 1``: true after ``jax.distributed.initialize`` with
        more than one process.

    Examples:
        >>> from chainrunner.layout._distributed import is_multiprocess
        >>> is_multiprocess()
        False
    """
    return jax.process_count() > 1


def is_main_process() -> bool:
    """Whether this is process 0, the one that prints progress and writes checkpoints.

    Returns:
        ``jax.process_index() == 0`` (always true with one process).

    Examples:
        >>> from chainrunner.layout._distributed import is_main_process
        >>> is_main_process()
        True
    """
    return jax.process_index() == 0


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _is_global(x: Any) -> bool:
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def global_array(value: Any, sharding: Sharding) -> jax.Array:
    """One array laid out by ``sharding``, built from the full value every process holds.

    With one process this is ``jax.device_put(value, sharding)``. With several, each
    process copies only its own shards from ``value`` (``jax.make_array_from_callback``),
    so every process must pass the same value. Typed PRNG keys travel as key data
    (``jax.random.key_data``) and are wrapped again on the devices. A value that is
    already a global array is resharded (``jax.device_put``).

    Args:
        value: an array-like (numpy, a scalar, a process-local ``jax.Array``, a key array).
        sharding: the target sharding, e.g. ``NamedSharding(mesh, P('chain'))``.

    Returns:
        A ``jax.Array`` with that sharding.

    Examples:
        >>> import numpy as np
        >>> import chainrunner as cr
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> from chainrunner.layout._distributed import global_array
        >>> mesh = cr.chain_mesh(1)
        >>> global_array(np.arange(4.0), NamedSharding(mesh, P("chain"))).tolist()
        [0.0, 1.0, 2.0, 3.0]
    """
    if not is_multiprocess() or _is_global(value):
        return jax.device_put(value, sharding)
    if _is_key(value):
        impl = jax.random.key_impl(value)
        data = global_array(np.asarray(jax.random.key_data(value)), sharding)
        return jax.random.wrap_key_data(data, impl=impl)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def put(tree: Any, sharding: Sharding) -> Any:
    """``global_array`` on every leaf of ``tree`` (``jax.device_put`` with one process).

    Args:
        tree: a pytree of array-likes.
        sharding: the sharding of every leaf.

    Returns:
        The same pytree of ``jax.Array``.

    Examples:
        >>> import numpy as np
        >>> import chainrunner as cr
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> from chainrunner.layout._distributed import put
        >>> out = put({"x": np.ones(2)}, NamedSharding(cr.chain_mesh(1), P()))
        >>> out["x"].tolist()
        [1.0, 1.0]
    """
    if not is_multiprocess():
        return jax.device_put(tree, sharding)
    return jax.tree.map(lambda x: global_array(x, sharding), tree)


def _gather(x: Any) -> Any:
    if not _is_global(x):
        return jax.device_get(x)
    from jax.experimental import multihost_utils

    if _is_key(x):
        impl = jax.random.key_impl(x)
        data = multihost_utils.process_allgather(jax.random.key_data(x), tiled=True)
        return jax.random.wrap_key_data(np.asarray(data), impl=impl)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def to_host(tree: Any) -> Any:
    """The full value of every leaf in this process's memory (``jax.device_get``).

    With several processes, leaves spread over other processes' devices are
    gathered (``multihost_utils.process_allgather``): a collective, so every
    process must call it with the same tree, in the same order. Key arrays come
    back as key arrays on this process's default device.

    Args:
        tree: a pytree of arrays.

    Returns:
        The pytree with numpy leaves (key leaves: process-local key arrays).

    Examples:
        >>> import jax.numpy as jnp
        >>> from chainrunner.layout._distributed import to_host
        >>> to_host({"a": jnp.arange(3)})["a"].tolist()
        [0, 1, 2]
    """
    if not is_multiprocess():
        return jax.device_get(tree)
    return jax.tree.map(_gather, tree)


def barrier(name: str) -> None:
    """Waits until every process gets here (nothing with one process).

    Args:
        name: a label for the barrier (the same in every process).

    Examples:
        >>> from chainrunner.layout._distributed import barrier
        >>> barrier("example")
    """
    if is_multiprocess():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def all_equal(value: int) -> bool:
    """Whether every process passes the same integer (true with one process).

    A collective: every process must call it.

    Args:
        value: an integer (e.g. how many draws a checkpoint holds).

    Returns:
        ``True`` when the values agree in all processes.

    Examples:
        >>> from chainrunner.layout._distributed import all_equal
        >>> all_equal(3)
        True
    """
    if not is_multiprocess():
        return True
    from jax.experimental import multihost_utils

    values = np.asarray(multihost_utils.process_allgather(np.int64(value)))
    return bool(np.all(values == values.reshape(-1)[0]))


def check_mesh_spans_processes(mesh: Any, where: str) -> None:
    """Raises if, with several processes, some process has no device in ``mesh``.

    Every process runs the same compiled program on its part of the mesh, so each
    must hold at least one of its devices.

    Args:
        mesh: a ``jax.sharding.Mesh``.
        where: the calling function's name, for the message.

    Raises:
        ValueError: naming the processes left out.

    Examples:
        >>> import chainrunner as cr
        >>> from chainrunner.layout._distributed import check_mesh_spans_processes
        >>> check_mesh_spans_processes(cr.chain_mesh(), "run")
    """
    if not is_multiprocess():
        return
    have = {d.process_index for d in np.asarray(mesh.devices).flat}
    missing = sorted(set(range(jax.process_count())) - have)
    if missing:
        raise ValueError(
            f"{where}: with {jax.process_count()} JAX processes the mesh must hold devices of "
            f"every process, but it has none of process(es) {missing}. Use cr.chain_mesh() "
            "(all devices of all processes)."
        )
