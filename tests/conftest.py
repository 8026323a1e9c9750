"""Test setup: 8 simulated CPU devices, asked for before JAX starts."""

import os

import jax

# Before any JAX computation: the backend fixes its device count when it starts.
jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "data", "posteriordb")


@pytest.fixture(scope="session", autouse=True)
def _eight_devices():
    assert len(jax.devices()) == 8, "tests expect 8 simulated CPU devices"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# A script the multi-host tests run in subprocesses, not a test module (it would run on
# import under --doctest-modules).
collect_ignore = ["multihost_worker.py"]
