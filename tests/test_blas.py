"""One BLAS thread while a run's programs execute on CPU devices, and the user's setting
restored after (``layout/_blas.py``)."""

import contextlib

import blackjax
import jax
import jax.numpy as jnp
import pytest
from threadpoolctl import threadpool_info

import chainrunner as cr
from chainrunner.layout import _blas
from chainrunner.pipeline import _run


def _blas_threads():
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_limits_inside_and_restores_after():
    before = _blas_threads()
    assert before  # jaxlib's LAPACK is scipy's OpenBLAS: loaded
    with _blas.blas_threads(cr.chain_mesh(2)):
        assert set(_blas_threads()) == {1}
    assert _blas_threads() == before
    with pytest.raises(ZeroDivisionError), _blas.blas_threads(cr.chain_mesh(1)):
        raise ZeroDivisionError
    assert _blas_threads() == before


def test_run_executes_inside_the_limit(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def spy(mesh):
        with _blas.blas_threads(mesh):
            seen.append((mesh.shape["chain"], _blas_threads()))
            yield

    monkeypatch.setattr(_run, "blas_threads", spy)
    nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
    cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 5, mesh=cr.chain_mesh(2), progress=False)
    assert len(seen) == 1 and seen[0][0] == 2 and set(seen[0][1]) == {1}
    assert _blas.runs_on_cpu(cr.chain_mesh(2))
