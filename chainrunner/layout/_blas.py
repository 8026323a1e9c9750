"""One BLAS thread while chains run on CPU devices, scoped to the run.

On CPU, XLA's linear algebra (``eigh``, ``qr``, ``cholesky``, ``svd``, ``solve``) calls
the LAPACK of the process (for jaxlib, scipy's OpenBLAS), whose every call starts as many
threads as the machine has cores. Each simulated CPU device already runs on its own
thread, so with several devices (and with XLA's own thread pool on one) those threads
oversubscribe the cores and spin: measured on 2 cores, 4 devices, a radon-like 89-d model
whose Fisher adaptation keeps every direction (three ``89 x 89`` eigendecompositions per
chain every tenth warmup draw) took 13.5 s with OpenBLAS's default threads and 2.0 s with
one; with 10 directions (QR only) 0.95 s and 0.72 s; on one device 4.9 s and 4.0 s.

``blas_threads(mesh)`` limits the BLAS libraries that are loaded to one thread
(threadpoolctl's ``threadpool_limits``) while a run's programs execute on a mesh of CPU
devices, and restores the user's setting when the run returns or raises. It changes no
result: one thread is also the setting whose results do not depend on the machine's core
count. Other Python threads that call numpy's BLAS during a run share the limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def runs_on_cpu(mesh: Any) -> bool:
    """Whether every device of ``mesh`` is a CPU device."""
    return all(d.platform == "cpu" for d in mesh.devices.flat)


@contextlib.contextmanager
def blas_threads(mesh: Any) -> Iterator[None]:
    """One BLAS thread inside the block when ``mesh`` is made of CPU devices.

    Examples:
        >>> import chainrunner as cr
        >>> with blas_threads(cr.chain_mesh(2)):
        ...     pass
    """
    if not runs_on_cpu(mesh):
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
