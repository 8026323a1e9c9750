"""The persistent compilation cache: a second process loads what the first compiled."""

import json
import os
import subprocess
import sys

import pytest

import chainrunner as cr

SCRIPT = r"""
import json, sys
import jax
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
import blackjax, jax.numpy as jnp
import chainrunner as cr
cr.enable_compilation_cache(sys.argv[1], min_compile_time_secs=0)
nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
trace = cr.run(nuts, jax.random.key(0), jnp.zeros((2, 2)), 20, progress=False, warn=False)
print(json.dumps({"hits": len(hits), "compile_time": trace.attrs["compile_time"],
                  "x": trace.draws[:, -1].tolist()}))
"""


def test_second_process_loads_the_compiled_programs(tmp_path):
    folder = tmp_path / "cache"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "CHAINRUNNER_CACHE": "off"}  # JAX's only
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(folder)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            timeout=300,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["hits"] == 0 and os.listdir(folder)
    assert runs[1]["hits"] >= 2  # the init and chunk programs, at least
    assert runs[1]["x"] == runs[0]["x"]  # same program, same draws


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="min_compile_time_secs must be a number"):
        cr.enable_compilation_cache(tmp_path, min_compile_time_secs="1")
    with pytest.raises(ValueError, match="min_compile_time_secs must be >= 0"):
        cr.enable_compilation_cache(tmp_path, min_compile_time_secs=-1)
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        cr.enable_compilation_cache(tmp_path / "f")
