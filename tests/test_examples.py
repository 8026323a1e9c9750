"""The examples and the demo run (at small sizes), so they never rot."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
EXAMPLES = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))


def run(*args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs(example):
    stdout = run(os.path.join("examples", example), "--quick")
    assert "chains on 8 device(s)" in stdout


def test_demo_runs_with_flags():
    stdout = run("-m", "chainrunner", "--chains", "12", "--devices", "4", "--batch-size", "2",
                 "--samples", "50", "--warmup", "50", "--no-progress")  # fmt: skip
    assert "layout: 12 chains on 4 device(s), 4 per device, batch_size=2 (4 padded)" in stdout
    assert "compile:" in stdout and "sampling:" in stdout
    assert "theta_trans[H]" in stdout and "r_hat" in stdout


def test_demo_quiet_prints_the_layout_only_and_bad_counts_are_usage_errors():
    stdout = run("-m", "chainrunner", "--chains", "4", "--devices", "2", "--samples", "20",
                 "--warmup", "0", "--quiet")  # fmt: skip
    assert stdout.strip() == "layout: 4 chains on 2 device(s), 2 per device, batch_size=1"
    for flag in ("--chains", "--devices", "--samples", "--batch-size"):
        done = subprocess.run([sys.executable, "-m", "chainrunner", flag, "0"],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2, (flag, done.stderr[-500:])
        assert f"argument {flag}: expected an integer >= 1, got 0" in done.stderr
