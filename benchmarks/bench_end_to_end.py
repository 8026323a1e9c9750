"""End to end, compile included: eight schools, 4 chains, 1000 warmup + 1000 draws.

What a user waits for after the imports: each measurement is a fresh process that
builds the model and samples once (``first call``: compile included), then samples
again with a new seed (``repeat``). Methods: chainrunner (``batch_size="auto"``, and
``None``; with its default diagnostics, and without: ``warn=False``), numpyro ``MCMC``
with ``chain_method`` vectorized / parallel / sequential, and chainrunner in a second
process with the persistent compilation cache (``cr.enable_compilation_cache``) warm.
Processes of the methods are interleaved, the
figures are medians over ``--reps`` processes, and the target ratio is chainrunner's
first call over the best numpyro method's first call.

Usage: ``python benchmarks/bench_end_to_end.py [--reps N] [--devices D]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = (
    "chainrunner",
    "chainrunner[vmap]",
    "chainrunner[warn=False]",
    "chainrunner[cache warm]",
    "numpyro_vectorized",
    "numpyro_parallel",
    "numpyro_sequential",
)

CHILD = r"""
import json, os, sys, time, warnings
os.environ["TQDM_DISABLE"] = "1"
import jax
jax.config.update("jax_num_cpu_devices", int(sys.argv[2]))
sys.path.insert(0, sys.argv[3])
from bench_suite import make_problem
from numpyro.infer import MCMC, NUTS
import chainrunner as cr
method, cache = sys.argv[1], sys.argv[4]
model, args, kwargs = make_problem("eight_schools")
warnings.simplefilter("ignore")
if cache != "-":
    cr.enable_compilation_cache(cache, min_compile_time_secs=0)
times = []
for seed in (0, 1):
    t0 = time.perf_counter()
    if method.startswith("chainrunner"):
        if seed == 0:
            kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)
        trace = cr.run(kernel, jax.random.key(seed), None, 1000, num_warmup=1000, num_chains=4,
                       batch_size=None if method == "chainrunner[vmap]" else "auto",
                       warn=method != "chainrunner[warn=False]", progress=False)
        draws = trace.draws
    else:
        if seed == 0:
            mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=1000, num_chains=4,
                        chain_method=method.split("_")[1], progress_bar=False)
        mcmc.run(jax.random.PRNGKey(seed), *args, **kwargs)
        draws = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    times.append(time.perf_counter() - t0)
print(json.dumps({"first": times[0], "repeat": times[1]}))
"""


def child(method: str, devices: int, cache: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, method, str(devices), HERE, cache],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="processes per method")
    parser.add_argument("--devices", type=int, default=2, help="simulated CPU devices")
    parser.add_argument("--quick", action="store_true", help="one process per method")
    opts = parser.parse_args()
    if opts.quick:
        opts.reps = 1
    got: dict[str, list[dict]] = {m: [] for m in METHODS}
    for _ in range(opts.reps):
        for m in METHODS:
            if m == "chainrunner[cache warm]":
                with tempfile.TemporaryDirectory() as folder:
                    child("chainrunner", opts.devices, folder)  # fills the cache
                    got[m].append(child("chainrunner", opts.devices, folder))
            else:
                got[m].append(child(m, opts.devices, "-"))
    med = {
        m: {k: statistics.median(r[k] for r in runs) for k in ("first", "repeat")}
        for m, runs in got.items()
    }
    best = min((m for m in METHODS if m.startswith("numpyro")), key=lambda m: med[m]["first"])
    ratio = med["chainrunner"]["first"] / med[best]["first"]
    print(json.dumps({"devices": opts.devices, "reps": opts.reps, "median_s": med,
                      "best_numpyro": best, "ratio_first_call": ratio}, indent=1))  # fmt: skip
    print()
    print("| method | first call s (compile included) | repeated call s | vs best numpyro |")
    print("|---|---|---|---|")
    for m in METHODS:
        r = med[m]
        print(
            f"| {m} | {r['first']:.2f} | {r['repeat']:.2f} | "
            f"{r['first'] / med[best]['first']:.2f} |"
        )


if __name__ == "__main__":
    main()
