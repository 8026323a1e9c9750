"""``looped``: a function whose ``vmap`` runs it on one batch member at a time.

jaxlib 0.10's CPU kernels of a batched ``eigh`` run its matrices in parallel on XLA's
intra-op threads and wait for them there. A program over several CPU devices runs each
device's work on those same threads, beside its other work in flight, and every thread
can end up waiting: measured on the 2-core machine, a vmapped ``eigh`` of 4 x 100 x 100
beside a batched matrix product, in a program over 2 CPU devices, never returned on jax
0.10 (the low-rank metric's update of a vmapped 100-d PyMC model hung the run); one
matrix at a time it took 2.2 s, and jax 0.12 ran both (2.1 and 2.3 s). A looped call is
also the unbatched call, the same as with chains one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap


def looped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (of arrays), whose ``vmap`` is ``lax.map`` over the batch.

    Args:
        fn: a function of array arguments; it must not close over traced values.

    Returns:
        The function, the same unbatched.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> eigh = looped(jnp.linalg.eigh)
        >>> a = jnp.stack([jnp.eye(3), 2 * jnp.eye(3)])
        >>> jax.vmap(eigh)(a)[0].tolist()
        [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    """

    @custom_vmap
    def call(*args: Any) -> Any:
        return fn(*args)

    @call.def_vmap
    def rule(axis_size: int, in_batched: Any, *args: Any) -> tuple:
        args = jax.tree.map(
            lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *jnp.shape(x))),
            args, tuple(in_batched),
        )  # fmt: skip
        out = jax.lax.map(lambda a: call(*a), args)
        return out, jax.tree.map(lambda _: True, out)

    return call
