"""Multi-process runs (jax.distributed on 127.0.0.1) against one process.

Every process is a subprocess running tests/multihost_worker.py: 2 processes x 2 CPU
devices must give the draws of 1 process x 4 devices bitwise; a process that dies
must make the other fail (JAX's heartbeat timeout), not hang.
"""

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("numpyro")
pytest.importorskip("blackjax")

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
TIMEOUT = 240  # seconds for any one subprocess; the runs take ~20 s


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(scenario, out, num_processes, process_id, devices, port):
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["JAX_PLATFORMS"] = "cpu"
    args = [scenario, str(out), str(num_processes), str(process_id), str(devices), str(port)]
    return subprocess.Popen(
        [sys.executable, WORKER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs, timeout):
    """Waits for every process (a shared deadline); kills leftovers; returns outputs."""
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    single = tmp_path_factory.mktemp("single")
    multi = tmp_path_factory.mktemp("multi")
    port = free_port()
    procs = [spawn("sample", single, 1, 0, 4, 0)]
    procs += [spawn("sample", multi, 2, i, 2, port) for i in range(2)]
    outs = finish(procs, TIMEOUT)
    for p, (stdout, stderr) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"worker failed ({p.returncode}):\n{stdout}\n{stderr[-4000:]}"
    with np.load(single / "draws.npz") as a, np.load(multi / "draws.npz") as b:
        return dict(a), dict(b), single, multi


def test_two_processes_match_one_bitwise(runs):
    one, two, _, _ = runs
    assert sorted(one) == sorted(two)
    for name in one:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    assert one["nuts_draws"].shape == (5, 60, 3)
    assert one["more_draws"].shape == (5, 20, 3)
    assert one["np_posterior_theta"].shape == (4, 40, 4)
    # the numpyro ArviZ output on process 0 holds every chain, draw and statistic
    assert {"np_posterior_mu", "np_posterior_tau", "np_sample_stats_lp"} <= set(two)
    assert np.all(np.isfinite(two["np_posterior_mu"]))


def test_process_zero_writes_one_complete_checkpoint(runs):
    import xarray as xr

    _, two, _, multi = runs
    files = sorted(os.listdir(multi / "ckpt"))
    assert "manifest.json" in files
    chunks = [f for f in files if f.startswith("chunk_")]
    assert len(chunks) == 3
    draws = []
    for f in chunks:
        with xr.open_dataset(multi / "ckpt" / f, group="posterior", engine="h5netcdf") as ds:
            draws.append(ds["x"].values)
    np.testing.assert_array_equal(np.concatenate(draws, axis=1), two["nuts_draws"])


def test_a_dying_process_stops_the_other(tmp_path):
    port = free_port()
    procs = [spawn("die", tmp_path, 2, i, 2, port) for i in range(2)]
    t0 = time.monotonic()
    (out0, err0), (out1, _) = finish(procs, TIMEOUT)
    elapsed = time.monotonic() - t0
    assert "process 1: first run done" in out1
    assert procs[1].returncode == 3
    assert "finished without process 1" not in out0
    assert procs[0].returncode != 0, out0 + err0[-3000:]
    # heartbeat_timeout_seconds=5 in the worker: the survivor stops well within the limit
    assert elapsed < 120, elapsed
    assert "distributed service" in err0 or "heartbeat" in err0.lower(), err0[-3000:]
