"""Draws and stats of a fixed set of runs equal, bit for bit, those recorded before the
pipeline redesign of ``run`` (see ``tests/bitwise_runs.py``)."""

import os

import bitwise_runs
import numpy as np
import pytest

RUNS = bitwise_runs.runs()


def _fixture():
    """``(arrays, exact)``: this machine's fixture (compared bit for bit), else the first
    one recorded for this jax, on a CPU of another class (compared within rounding)."""
    for path, exact in (
        (bitwise_runs.fixture_path(), True),
        (bitwise_runs.fixture_path(None), False),
    ):
        if os.path.exists(path):
            with np.load(path) as f:
                return {k: f[k] for k in f.files}, exact
    pytest.skip(
        f"no bitwise fixture for this jax ({os.path.basename(path)}): numerics may change "
        "between jax releases; record one with `python tests/bitwise_runs.py --write`."
    )


def _equal(got, value, exact):
    if exact or not np.issubdtype(value.dtype, np.floating):
        return np.array_equal(got, value, equal_nan=True)
    # XLA's code for another CPU model: the last bits of float32, grown over the steps of
    # a run (seen: 5e-6 at most, on draws of order 1)
    return np.allclose(got, value, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_bitwise_equal_to_the_recorded_draws(name):
    fixture, exact = _fixture()
    expected = {k.split(":", 1)[1]: v for k, v in fixture.items() if k.startswith(name + ":")}
    assert expected, f"the fixture has no arrays for {name}"
    got = RUNS[name]()
    # Every recorded array is there and equal; stats added since may be there too.
    assert set(expected) <= set(got), sorted(set(expected) - set(got))
    how = "bit for bit" if exact else f"within rounding (no fixture for {bitwise_runs.cpu_class()})"
    for key, value in expected.items():
        assert got[key].dtype == value.dtype, key
        assert _equal(got[key], value, exact), f"{key}: not equal {how}"
