"""Draws and stats of a fixed set of runs equal, bit for bit, those recorded before the
pipeline redesign of ``run`` (see ``tests/bitwise_runs.py``)."""

import os

import bitwise_runs
import numpy as np
import pytest

RUNS = bitwise_runs.runs()


def _fixture():
    path = bitwise_runs.fixture_path()
    if not os.path.exists(path):
        pytest.skip(
            f"no bitwise fixture for this jax ({os.path.basename(path)}): numerics may change "
            "between jax releases; record one with `python tests/bitwise_runs.py --write`."
        )
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_bitwise_equal_to_the_recorded_draws(name):
    expected = {k.split(":", 1)[1]: v for k, v in _fixture().items() if k.startswith(name + ":")}
    assert expected, f"the fixture has no arrays for {name}"
    got = RUNS[name]()
    # Every recorded array is there and equal; stats added since may be there too.
    assert set(expected) <= set(got), sorted(set(expected) - set(got))
    for key, value in expected.items():
        assert got[key].dtype == value.dtype, key
        assert np.array_equal(got[key], value, equal_nan=True), key
