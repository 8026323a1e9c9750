"""The first call: whole processes, compile time, and what is compiled again (issue 34).

Eight schools as numpyro's docs write it, 4 chains x (1000 warmup + 1000 draws), 4
simulated CPU devices, ``az.summary`` at the end. Each figure from fresh processes,
methods interleaved within each repetition:

- ``chainrunner, empty cache``: ``cr.sample(cr.from_numpyro(NUTS(model), ...), ...)`` in a
  process whose cache folder is empty (``CHAINRUNNER_CACHE_DIR`` a new folder);
- ``chainrunner, second process``: the same script again, with the folder the first left;
- ``numpyro parallel`` / ``numpyro vectorized``: numpyro's ``MCMC`` with that
  ``chain_method`` (+ ``az.from_numpyro``), the peer a numpyro user would pick;
- ``hand-written floor``: one ``jit(shard_map(lax.map(chain)))`` of numpyro's own NUTS
  (init, then a ``lax.scan`` of its ``sample`` over 2000 steps), compiled and run: what
  compiling that kernel costs at least;
- ``notebook cell again``: in one process, the same ``cr.from_numpyro(NUTS(model), ...)``
  cell run twice (a new kernel object each time): the second call's ``compile_time`` and
  its seconds before the first draw (the call's wall time less its sampling);
- ``chain_map``: numpyro's ``MCMC(..., chain_method=cr.chain_map)`` run twice in one
  process (a new mapped function each run), in a process with an empty cache folder and
  in a second one: the seconds XLA compiles (``backend_compile_duration``) and the wall
  time of each ``mcmc.run``.

    python benchmarks/bench_first_call.py [--reps 5] [--quick] [--json out]
    python benchmarks/bench_first_call.py --breakdown  # where the compile goes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

PREAMBLE = r"""
import json, os, sys, time
t0 = time.perf_counter()
import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
import arviz as az

J = 8
y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)
"""

CHAINRUNNER = (
    PREAMBLE
    + r"""
import chainrunner as cr
t1 = time.perf_counter()
idata = cr.sample(cr.from_numpyro(NUTS(eight_schools), model_args=(J, sigma),
                                  model_kwargs={"y": y}),
                  jax.random.key(0), None, 1000, num_warmup=1000, num_chains=4)
t2 = time.perf_counter()
az.summary(idata)
t3 = time.perf_counter()
attrs = idata.posterior.attrs
print(json.dumps({"total": t3 - t0, "imports": t1 - t0, "sample": t2 - t1, "summary": t3 - t2,
                  "compile_time": attrs["compile_time"], "sampling_time": attrs["sampling_time"]}))
"""
)

NUMPYRO = (
    PREAMBLE
    + r"""
t1 = time.perf_counter()
mcmc = MCMC(NUTS(eight_schools), num_warmup=1000, num_samples=1000, num_chains=4,
            chain_method=sys.argv[1], progress_bar=False)
mcmc.run(jax.random.key(0), J, sigma, y=y)
idata = az.from_numpyro(mcmc)
t2 = time.perf_counter()
az.summary(idata)
t3 = time.perf_counter()
print(json.dumps({"total": t3 - t0, "imports": t1 - t0, "sample": t2 - t1, "summary": t3 - t2}))
"""
)

FLOOR = (
    PREAMBLE
    + r"""
from jax.sharding import PartitionSpec as P
t1 = time.perf_counter()
mesh = jax.make_mesh((4,), ("chain",))
kernel = NUTS(eight_schools)

def chain(key):
    init_key, run_key = jax.random.split(key)
    state = kernel.init(init_key, 1000, None, (J, sigma), {"y": y})

    def step(state, _):
        state = kernel.sample(state, (J, sigma), {"y": y})
        return state, state.z

    return jax.lax.scan(step, state, None, length=2000)[1]

program = jax.jit(jax.shard_map(lambda keys: jax.lax.map(chain, keys), mesh=mesh,
                                in_specs=P("chain"), out_specs=P("chain"), check_vma=False))
keys = jax.device_put(jax.random.split(jax.random.key(0), 4),
                      jax.sharding.NamedSharding(mesh, P("chain")))
t2 = time.perf_counter()
compiled = program.lower(keys).compile()
t3 = time.perf_counter()
jax.block_until_ready(compiled(keys))
t4 = time.perf_counter()
print(json.dumps({"total": t4 - t0, "imports": t1 - t0, "compile_time": t3 - t2,
                  "sampling_time": t4 - t3}))
"""
)

CELL = (
    PREAMBLE
    + r"""
import chainrunner as cr
times = []
for _ in range(2):  # the cell, run twice
    t_run = time.perf_counter()
    kernel = cr.from_numpyro(NUTS(eight_schools), model_args=(J, sigma), model_kwargs={"y": y})
    trace = cr.run(kernel, jax.random.key(0), None, 1000, num_warmup=1000, num_chains=4,
                   progress=False, warn=False)
    times.append(trace.attrs["compile_time"])
before = time.perf_counter() - t_run - trace.attrs["sampling_time"]
print(json.dumps({"compile_time": times[1], "first_compile_time": times[0],
                  "before_first_draw": before}))
"""
)

CHAIN_MAP = (
    PREAMBLE
    + r"""
import chainrunner as cr
compiling = [0.0]


def listen(event, seconds, **_):
    if event.endswith("backend_compile_duration"):
        compiling[0] += seconds


jax.monitoring.register_event_duration_secs_listener(listen)
runs = []
for _ in range(2):  # the cell, run twice: numpyro hands chain_map a new function each run
    compiling[0], t = 0.0, time.perf_counter()
    mcmc = MCMC(NUTS(eight_schools), num_warmup=1000, num_samples=1000, num_chains=4,
                chain_method=cr.chain_map, progress_bar=False)
    mcmc.run(jax.random.key(0), J, sigma, y=y)
    jax.block_until_ready(mcmc.get_samples())
    runs.append({"run": time.perf_counter() - t, "compile": compiling[0]})
print(json.dumps({"first_run": runs[0]["run"], "compile_time": runs[0]["compile"],
                  "again_run": runs[1]["run"], "again_compile": runs[1]["compile"]}))
"""
)

BREAKDOWN = (
    PREAMBLE
    + r"""
import collections
import chainrunner as cr
if sys.argv[1] == "serial":  # the loop compiled after the initialisation, not alongside
    import chainrunner.pipeline._loop as loop
    loop.in_this_context = lambda fn: None
durations = collections.defaultdict(float)  # (stage, program) -> seconds
STAGES = {"jaxpr_trace_duration": "trace", "jaxpr_to_mlir_module_duration": "lower",
          "backend_compile_duration": "backend"}
PROGRAMS = {"init_chains": "init", "sample_chunk": "chunk"}  # the programs' function names


def listen(event, seconds, fun_name="", **_):
    stage, name = STAGES.get(event.rsplit("/", 1)[-1]), fun_name.removeprefix("jit(")
    if stage and name.rstrip(")") in PROGRAMS:
        durations[f"{PROGRAMS[name.rstrip(')')]} {stage}"] += seconds


jax.monitoring.register_event_duration_secs_listener(listen)
trace = cr.run(cr.from_numpyro(NUTS(eight_schools), model_args=(J, sigma), model_kwargs={"y": y}),
               jax.random.key(0), None, 1000, num_warmup=1000, num_chains=4, progress=False,
               warn=False)
print(json.dumps({"compile_time": trace.attrs["compile_time"], **durations}))
"""
)

METHODS = ("chainrunner, empty cache", "chainrunner, second process", "numpyro parallel",
           "numpyro vectorized", "hand-written floor", "notebook cell again",
           "chain_map, empty cache", "chain_map, second process")  # fmt: skip


def child(script: str, *args: str, cache: str | None = None) -> dict:
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "4", "TQDM_DISABLE": "1"}
    env.pop("CHAINRUNNER_CACHE", None)
    if cache is None:
        env["CHAINRUNNER_CACHE"] = "off"
    else:
        env["CHAINRUNNER_CACHE_DIR"] = cache
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {**out, "process": wall}


def one_rep(folder: str) -> dict[str, dict]:
    """Every method once, in the order of ``METHODS`` (the two chainrunner processes share
    a fresh folder)."""
    cache, mapped = tempfile.mkdtemp(dir=folder), tempfile.mkdtemp(dir=folder)
    return {
        METHODS[0]: child(CHAINRUNNER, cache=cache),
        METHODS[1]: child(CHAINRUNNER, cache=cache),
        METHODS[2]: child(NUMPYRO, "parallel"),
        METHODS[3]: child(NUMPYRO, "vectorized"),
        METHODS[4]: child(FLOOR),
        METHODS[5]: child(CELL, cache=tempfile.mkdtemp(dir=folder)),
        METHODS[6]: child(CHAIN_MAP, cache=mapped),
        METHODS[7]: child(CHAIN_MAP, cache=mapped),
    }


def summarise(reps: list[dict[str, dict]]) -> dict:
    """Medians per method and figure, and the issue's ratios."""

    def median(method: str, figure: str) -> float:
        return float(np.median([r[method][figure] for r in reps if figure in r[method]]))

    first, second = METHODS[0], METHODS[1]
    best_numpyro = min(median(METHODS[2], "process"), median(METHODS[3], "process"))
    return {
        "process_s": {m: median(m, "process") for m in METHODS[:5]},
        "compile_time_s": {m: median(m, "compile_time") for m in (first, second, *METHODS[4:])},
        "first_process_vs_best_numpyro": median(first, "process") / best_numpyro,
        "second_process_compile_vs_first": median(second, "compile_time")
        / median(first, "compile_time"),
        "first_compile_vs_floor": median(first, "compile_time")
        / median(METHODS[4], "compile_time"),
        "notebook_cell_again_compile_s": median(METHODS[5], "compile_time"),
        "notebook_cell_again_before_first_draw_s": median(METHODS[5], "before_first_draw"),
        "chain_map_first_compile_s": median(METHODS[6], "compile_time"),
        "chain_map_cell_again_compile_s": median(METHODS[6], "again_compile"),
        "chain_map_cell_again_run_vs_first": median(METHODS[6], "again_run")
        / median(METHODS[6], "first_run"),
        "chain_map_second_process_compile_vs_first": median(METHODS[7], "compile_time")
        / median(METHODS[6], "compile_time"),
        "first_stages_s": {k: median(first, k) for k in ("imports", "sample", "summary",
                                                         "compile_time", "sampling_time")},
    }  # fmt: skip


def breakdown(reps: int) -> dict:
    """Where a first call's compile goes: tracing, lowering and XLA's compile of the chunk
    and init programs (``jax.monitoring``'s durations, the two longest of each), with the
    loop compiled alongside the initialisation (the default) and after it; fresh
    processes, cache off, the two modes in alternating order. Medians."""
    rows: dict[str, list[dict]] = {"alongside": [], "serial": []}
    for i in range(reps):
        for mode in list(rows)[:: 1 if i % 2 == 0 else -1]:
            rows[mode].append(child(BREAKDOWN, mode))
    out = {}
    for mode, found in rows.items():
        names = ["compile_time"] + [f"{p} {s}" for s in ("backend", "trace", "lower")
                                    for p in ("chunk", "init")]  # fmt: skip
        out[mode] = {n: float(np.median([r.get(n, 0.0) for r in found])) for n in names}
    print(json.dumps(out, indent=1))
    print("\n| stage | " + " | ".join(rows) + " |\n|---|" + "---:|" * len(rows))
    for name in out["alongside"]:
        print(f"| {name} | " + " | ".join(f"{out[m][name]:.2f}" for m in rows) + " |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--json")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="only where the first call's compile goes (see breakdown)",
    )
    args = parser.parse_args()
    if args.breakdown:
        out = breakdown(1 if args.quick else args.reps)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    reps = []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(1 if args.quick else args.reps):
            reps.append(one_rep(folder))
            print(json.dumps({"rep": i, **reps[-1]}), flush=True)
    summary = summarise(reps)
    print(json.dumps(summary, indent=1))
    print("\n| method | whole process (s) | compile_time (s) |\n|---|---:|---:|")
    for m in METHODS[:5]:
        ct = summary["compile_time_s"].get(m)
        print(f"| {m} | {summary['process_s'][m]:.2f} | {'-' if ct is None else f'{ct:.2f}'} |")
    print(f"| {METHODS[5]} | - | {summary['notebook_cell_again_compile_s']:.3f} |")
    print(
        f"\nnotebook cell again: {summary['notebook_cell_again_before_first_draw_s']:.2f} s "
        f"before its first draw; chain_map: XLA compiles {summary['chain_map_first_compile_s']:.2f}"
        f" s in a first process, {summary['chain_map_cell_again_compile_s']:.2f} s in the cell "
        f"again, second process / first: {summary['chain_map_second_process_compile_vs_first']:.3f}"
    )
    print(
        f"\nfirst process / numpyro's better: {summary['first_process_vs_best_numpyro']:.2f}; "
        f"second process's compile / first's: {summary['second_process_compile_vs_first']:.3f}; "
        f"first compile / hand-written floor: {summary['first_compile_vs_floor']:.2f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"reps": reps, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
