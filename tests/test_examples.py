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


def test_a_warning_of_the_demo_names_the_demos_line_not_runpy():
    """``python -m chainrunner`` is the user's script: its diagnostics warning (20 draws of
    2 chains: too few) points at the demo's line, not at ``<frozen runpy>``."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-m", "chainrunner", "--chains", "2", "--devices", "1", "--samples",
         "20", "--warmup", "10", "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ChainrunnerWarning" in out.stderr, out.stderr[-2000:]
    assert "_demo.py:" in out.stderr and "runpy" not in out.stderr, out.stderr[-2000:]


def test_demo_quiet_draws_no_bar(monkeypatch, capsys):
    import types

    import chainrunner.pipeline._run as run_stage
    from chainrunner import _demo

    calls = []

    def fake_run(*args, **kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(attrs={"layout": "L"})

    monkeypatch.setattr(run_stage, "run", fake_run)
    _demo.main(["--chains", "2", "--devices", "1", "--quiet"])
    assert calls[0]["progress"] is False
    assert capsys.readouterr().out == "layout: L\n"


def test_demo_bad_counts_are_usage_errors():
    for flag, value, says in (
        ("--chains", "0", "expected an integer >= 1, got 0"),
        ("--devices", "0", "expected an integer >= 1, got 0"),
        ("--samples", "0", "expected an integer >= 1, got 0"),
        ("--batch-size", "0", "expected an integer >= 1, got 0, 'auto' or 'all'"),
        ("--step-size", "-1", "expected a finite number > 0, got -1.0"),
    ):
        done = subprocess.run([sys.executable, "-m", "chainrunner", flag, value],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2, (flag, done.stderr[-500:])
        assert f"argument {flag}: {says}" in done.stderr, done.stderr[-500:]
