"""The benchmark suite: chainrunner side by side with every way to run many chains in JAX.

Every method runs the same kernel (numpyro's NUTS with its default adaptation: step
size and diagonal mass matrix), on the same model, chains, devices, warmup and draws:

- ``chainrunner``: ``cr.run`` with the default ``batch_size="auto"``, and with
  ``batch_size=None`` (one vmap over a device's chains) and ``batch_size=1``
  (``lax.map``, one chain at a time on each device);
- ``numpyro_parallel`` / ``numpyro_vectorized`` / ``numpyro_sequential``: numpyro's
  ``MCMC`` with that ``chain_method`` (parallel only where chains <= devices: with more
  chains numpyro falls back to sequential);
- ``blackjax_pmap``: the blackjax docs' multiple-chains recipe, ``jax.pmap`` over devices
  of the ``lax.scan`` inference loop (``vmap`` over the chains of a device);
- ``floor``: the hand-written ``jit(shard_map(vmap(scan)))``, the runner overhead floor
  of ``batch_size=None``; ``floor[map]``: ``jit(shard_map(lax.map(scan)))``, the floor of
  ``batch_size=1`` (chains one after another on each device, no ``vmap``);
- ``single_chain``: one chain on one device (``jit(scan)``), the per-chain cost floor.

The floor, pmap and single-chain loops keep the unconstrained position of every step
(the blackjax recipe's loop); chainrunner and numpyro keep the constrained draws and
sample statistics after warmup.

Figures, per method: compile s (first call minus a warm call), compilations (XLA
backend compilations in the first call, and in a repeated call with a new seed),
sampling s (median of the interleaved warm repetitions), end-to-end s (the first call,
compile included), draws/s, min bulk ESS/s (minimum bulk ESS over scalar parameters
per warm second; ArviZ), peak RSS (growth of the process' resident memory during the
method's calls, sampled every 5 ms), and the ratio of sampling time to the floor's.

Each device count runs in its own process (``jax_num_cpu_devices`` is fixed at start);
within one, repetitions of the methods are interleaved and ratios are of medians.

Usage::

    python benchmarks/bench_suite.py                 # the full grid (about an hour on 2 cores)
    python benchmarks/bench_suite.py --quick         # a small smoke run
    python benchmarks/bench_suite.py --gpu           # 1,000 to 100,000 chains on the GPU(s)
    python benchmarks/bench_suite.py --write-docs    # also updates docs/benchmarks.md

Writes ``benchmarks/results/suite.json`` (or ``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import warnings
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
METHODS = (
    "chainrunner",
    "chainrunner[vmap]",
    "chainrunner[batch=1]",
    "numpyro_parallel",
    "numpyro_vectorized",
    "numpyro_sequential",
    "blackjax_pmap",
    "floor",
    "floor[map]",
    "single_chain",
)
MODELS = ("gaussian_50d", "logistic_5000x20", "eight_schools")
# (warmup, draws) per chain count: the grid's rows must fit in an hour on 2 CPU cores.
SIZES = {8: (500, 500), 64: (200, 200), 512: (100, 100)}
DOCS_START = "<!-- suite:start -->"
DOCS_END = "<!-- suite:end -->"


# -- models (numpyro) -------------------------------------------------------------------


def make_problem(name):
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    if name == "gaussian_50d":
        rng = np.random.default_rng(0)
        a = rng.normal(size=(50, 50))
        cov = a @ a.T / 50 + np.eye(50)
        precision = np.linalg.inv(cov).astype(np.float32)

        def gaussian(precision):
            # The density written out (as bench_runner.py's): numpyro's MultivariateNormal
            # with a precision matrix would factorise it (LAPACK) at every gradient.
            x = numpyro.sample("x", dist.ImproperUniform(constraints.real_vector, (), (50,)))
            numpyro.factor("lp", -0.5 * x @ precision @ x)

        return gaussian, (precision,), {}
    if name == "logistic_5000x20":
        rng = np.random.default_rng(0)
        X = rng.normal(size=(5000, 20)).astype(np.float32)
        beta = rng.normal(size=20).astype(np.float32) * 0.5
        y = (rng.uniform(size=5000) < 1 / (1 + np.exp(-(X @ beta + 0.3)))).astype(np.float32)

        def logistic(X, y):
            b = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]))
            a = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Bernoulli(logits=a + X @ b), obs=y)

        return logistic, (X, y), {}
    if name == "eight_schools":
        path = os.path.join(ROOT, "..", "shared", "posteriordb", "data", "eight_schools.json")
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
            y, sigma = (np.asarray(data[k], np.float32) for k in ("y", "sigma"))
        else:  # the same numbers (posteriordb's eight_schools.json)
            y = np.array([28, 8, -3, 7, -1, 1, 18, 12], np.float32)
            sigma = np.array([15, 10, 16, 11, 9, 11, 10, 18], np.float32)

        def eight_schools(sigma, y):
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
            tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
            with numpyro.plate("J", sigma.shape[0]):
                theta_trans = numpyro.sample("theta_trans", dist.Normal(0.0, 1.0))
                theta = numpyro.deterministic("theta", mu + tau * theta_trans)
                numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

        return eight_schools, (sigma, y), {}
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


# -- measuring --------------------------------------------------------------------------


class PeakRSS:
    """Peak growth of this process' resident memory while inside the ``with`` block."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def _rss(self):
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self.page
        except OSError:  # not Linux: the process' peak so far (monotonic)
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def __enter__(self):
        self.base = self.peak = self._rss()
        self._stop = threading.Event()

        def watch():
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, self._rss())

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        self.growth = self.peak - self.base


class CompileCounter:
    """Counts XLA backend compilations (every jit, pmap and AOT compile in the process)."""

    def __init__(self):
        import jax

        self.count = 0

        def listen(event, duration, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                self.count += 1

        jax.monitoring.register_event_duration_secs_listener(listen)


MAX_ESS_CHAINS = 1024


def min_bulk_ess(draws, num_chains):
    """Minimum bulk ESS over the scalar parameters of ``draws`` (leaves (chain, draw, ...)).

    With more than ``MAX_ESS_CHAINS`` chains (the GPU rows), the ESS of the first
    ``MAX_ESS_CHAINS`` is scaled by ``num_chains / MAX_ESS_CHAINS`` (ESS adds up over
    independent chains), to keep the host's work and memory bounded.
    """
    import arviz as az
    import jax
    import numpy as np

    scale = 1.0
    if num_chains > MAX_ESS_CHAINS:
        scale, num_chains = num_chains / MAX_ESS_CHAINS, MAX_ESS_CHAINS
    flat = {}
    for i, x in enumerate(jax.tree.leaves(draws)):
        x = np.asarray(x, np.float64)[:num_chains]
        flat[f"v{i}"] = x.reshape((*x.shape[:2], -1))
    if not flat or next(iter(flat.values())).shape[1] < 4:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "more chains than draws": intended here
        ds = az.convert_to_dataset({k: v for k, v in flat.items()})
        ess = az.ess(ds, method="bulk")
    return scale * float(min(np.nanmin(ess[k].values) for k in ess.data_vars))


# -- methods ----------------------------------------------------------------------------


def numpyro_programs(model, args, kwargs, warmup):
    """A NUTS kernel whose ``sample`` advances one chain, and a jitted, vmapped init
    ``keys -> states`` (numpyro's init for each chain, as numpyro's parallel method)."""
    import jax
    from numpyro.infer import NUTS

    one = NUTS(model)  # initialised for one chain: its sample function is not vmapped
    one.init(jax.random.PRNGKey(0), warmup, model_args=args, model_kwargs=kwargs)
    init_kernel = NUTS(model)

    @jax.jit
    def init(keys):
        return jax.vmap(
            lambda k: init_kernel.init(k, warmup, model_args=args, model_kwargs=kwargs)
        )(keys)

    return one, init


def make_method(method, model, args, kwargs, chains, warmup, draws, ndev):
    """A function ``seed -> draws`` (leaves (chain, draw, ...)) for one method."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from numpyro.infer import MCMC, NUTS

    import chainrunner as cr

    if method.startswith("chainrunner"):
        batch = {"chainrunner": "auto", "chainrunner[vmap]": None, "chainrunner[batch=1]": 1}
        kernel = cr.from_numpyro(NUTS(model), model_args=args, model_kwargs=kwargs)
        mesh = cr.chain_mesh(min(ndev, chains))

        def run(seed):
            trace = cr.run(
                kernel, jax.random.key(seed), None, draws, num_warmup=warmup,
                num_chains=chains, mesh=mesh, batch_size=batch[method], progress=False,
                warn=False,
            )  # fmt: skip
            return trace.draws

        return run

    if method.startswith("numpyro_"):
        mcmc = MCMC(
            NUTS(model), num_warmup=warmup, num_samples=draws, num_chains=chains,
            chain_method=method.split("_")[1], progress_bar=False, jit_model_args=True,
        )  # fmt: skip

        def run(seed):
            mcmc.run(jax.random.PRNGKey(seed), *args, **kwargs)
            out = mcmc.get_samples(group_by_chain=True)
            return jax.block_until_ready(out)

        return run

    total = warmup + draws

    def loop(sample, state):
        """The blackjax recipe's inference loop: scan, keeping every position."""

        def body(s, _):
            s = sample(s, args, kwargs)
            return s, s.z

        return jax.lax.scan(body, state, None, length=total)[1]

    def post_warmup(z):
        return jax.tree.map(lambda x: x[:, warmup:], z)

    nuts, init = numpyro_programs(model, args, kwargs, warmup)

    def init_states(seed, n):
        return init(jax.random.split(jax.random.PRNGKey(seed), n))

    if method == "single_chain":
        cpu = jax.devices()[0]
        program = jax.jit(partial(loop, nuts.sample))

        def run(seed):
            state = jax.device_put(jax.tree.map(lambda x: x[0], init_states(seed, 1)), cpu)
            z = jax.tree.map(lambda x: x[None], jax.device_get(program(state)))  # (1, draw)
            return post_warmup(z)

        return run

    if method in ("floor", "floor[map]"):
        nd = min(ndev, chains)
        mesh = jax.make_mesh((nd,), ("chain",), devices=jax.devices()[:nd])
        one_chain = partial(loop, nuts.sample)
        if method == "floor":
            local = jax.vmap(one_chain)
        else:  # the floor of batch_size=1: chains one after another, no vmap
            local = partial(jax.lax.map, one_chain)
        program = jax.jit(
            jax.shard_map(
                local,
                mesh=mesh, in_specs=P("chain"), out_specs=P("chain"), check_vma=False,
            )
        )  # fmt: skip

        def run(seed):
            state = jax.device_put(init_states(seed, chains), NamedSharding(mesh, P("chain")))
            return post_warmup(jax.device_get(program(state)))

        return run

    if method == "blackjax_pmap":
        nd = min(ndev, chains)

        per = -(-chains // nd)
        pad = nd * per - chains
        program = jax.pmap(jax.vmap(partial(loop, nuts.sample)), devices=jax.devices()[:nd])

        def run(seed):
            state = init_states(seed, chains)

            def split(x):
                x = jnp.concatenate([x, jnp.repeat(x[:1], pad, 0)]) if pad else x
                return x.reshape(nd, per, *x.shape[1:])

            z = jax.device_get(program(jax.tree.map(split, state)))
            z = jax.tree.map(lambda x: x.reshape(nd * per, *x.shape[2:])[:chains], z)
            return post_warmup(z)

        return run
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")


def program_of(method):
    """``"map"`` for methods that run a device's chains one after another, else ``"vmap"``."""
    import jax

    if method in ("chainrunner[batch=1]", "floor[map]", "numpyro_sequential", "single_chain"):
        return "map"
    if method == "chainrunner":  # batch_size="auto": measured on CPU, None elsewhere
        return "best" if jax.devices()[0].platform == "cpu" else "vmap"
    return "vmap"


def applicable(method, chains, ndev, opts):
    """``None`` if the method runs on this row, else why not."""
    if method == "numpyro_parallel" and chains > ndev:
        return "falls back to sequential (chains > devices)"
    if method == "numpyro_sequential" and chains > opts.sequential_max_chains:
        return f"not run above {opts.sequential_max_chains} chains (compiles per chain)"
    if method == "single_chain" and chains != opts.single_chain_at:
        return "measured once per model (on the smallest chain count)"
    return None


def bench_row(model_name, chains, ndev, opts, counter):
    """Every method on one (model, chains, devices); returns the result rows."""
    model, args, kwargs = make_problem(model_name)
    warmup, draws = opts.sizes[chains]
    methods = [m for m in opts.methods if applicable(m, chains, ndev, opts) is None]
    skipped = [(m, applicable(m, chains, ndev, opts)) for m in opts.methods if m not in methods]
    runners, first, compiles, memory, ess = {}, {}, {}, {}, {}
    for m in methods:
        runners[m] = make_method(m, model, args, kwargs, chains, warmup, draws, ndev)
        with warnings.catch_warnings(), PeakRSS() as rss:
            warnings.simplefilter("ignore")
            c0 = counter.count
            t0 = time.perf_counter()
            out = runners[m](0)
            first[m] = time.perf_counter() - t0
            compiles[m] = counter.count - c0
        memory[m] = rss.growth
        ess[m] = [min_bulk_ess(out, chains)]
        del out
    times = {m: [] for m in methods}
    recompiles = {m: 0 for m in methods}
    for rep in range(opts.reps):  # interleaved repetitions, new seed each time
        for m in methods:
            with warnings.catch_warnings(), PeakRSS() as rss:
                warnings.simplefilter("ignore")
                c0 = counter.count
                t0 = time.perf_counter()
                out = runners[m](rep + 1)
                times[m].append(time.perf_counter() - t0)
                recompiles[m] = max(recompiles[m], counter.count - c0)
            memory[m] = max(memory[m], rss.growth)
            ess[m].append(min_bulk_ess(out, chains))
            del out
    import numpy as np

    rows = []
    floors = {k: float(np.median(v)) for k, v in times.items() if k.startswith("floor")}
    for m in methods:
        # chainrunner against the floor of the same per-device program (the default,
        # whose program is measured per run, against the better floor)
        floor_of = {"map": "floor[map]", "vmap": "floor"}.get(program_of(m))
        if floor_of is None and floors:
            floor_of = min(floors, key=floors.get)
        floor = floors.get(floor_of)
        wall = float(np.median(times[m]))
        n = 1 if m == "single_chain" else chains
        e = float(np.median(ess[m]))
        rows.append(
            {
                "model": model_name, "chains": chains, "devices": ndev, "method": m,
                "warmup": warmup, "draws": draws, "reps": opts.reps,
                "compile_s": round(max(first[m] - wall, 0.0), 3),
                "compilations": compiles[m], "compilations_repeat": recompiles[m],
                "sampling_s": round(wall, 4), "end_to_end_s": round(first[m], 3),
                "draws_per_s": round(n * draws / wall, 1),
                "min_bulk_ess": round(e, 1), "min_bulk_ess_per_s": round(e / wall, 1),
                "peak_rss_mb": round(memory[m] / 2**20, 1),
                "vs_floor": None if floor is None else round(wall / floor, 3),
                "floor": floor_of if floor is not None else None,
            }
        )  # fmt: skip
    for m, why in skipped:
        rows.append(
            {"model": model_name, "chains": chains, "devices": ndev, "method": m, "skipped": why}
        )
    return rows


def worker(opts):
    """Rows of one device count, in this process."""
    import jax

    if opts.platform == "cpu":
        jax.config.update("jax_num_cpu_devices", opts.devices)
    os.environ.setdefault("TQDM_DISABLE", "1")
    ndev = len(jax.devices())
    # JAX's own first-use programs (key handling, small jnp ops), so that the first
    # method of a row is not charged for them.
    jax.block_until_ready(jax.random.split(jax.random.key(0), 4))
    jax.block_until_ready(jax.random.normal(jax.random.split(jax.random.PRNGKey(0))[0], (2,)))
    counter = CompileCounter()
    for model_name in opts.models:
        for chains in opts.chains:
            t0 = time.perf_counter()
            for row in bench_row(model_name, chains, ndev, opts, counter):
                print("#ROW " + json.dumps(row), flush=True)
            print(
                f"# {model_name} chains={chains} devices={ndev}: {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )


# -- report -----------------------------------------------------------------------------


def machine():
    import jax
    import numpyro

    try:
        import blackjax

        bj = blackjax.__version__
    except ImportError:
        bj = "-"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = f"{names[0]} x {len(names)}" if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "devices": [str(d) for d in jax.devices()[:1]],
        "python": platform.python_version(),
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "blackjax": bj,
    }


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def table(rows):
    cols = (
        ("compile s", "compile_s"), ("compilations (repeat)", None),
        ("sampling s", "sampling_s"), ("end-to-end s", "end_to_end_s"),
        ("draws/s", "draws_per_s"), ("min bulk ESS/s", "min_bulk_ess_per_s"),
        ("peak RSS MB", "peak_rss_mb"), ("vs floor", "vs_floor"),
    )  # fmt: skip
    lines = []
    key = lambda r: (MODELS.index(r["model"]), r["chains"], r["devices"])  # noqa: E731
    current = None
    for r in sorted(rows, key=key):
        if key(r) != current:
            current = key(r)
            w = next((x for x in rows if key(x) == current and "warmup" in x), {})
            lines += [
                "",
                f"**{r['model']}, {r['chains']} chains, {r['devices']} devices** "
                f"({w.get('warmup', '?')} warmup + {w.get('draws', '?')} draws per chain, "
                f"{w.get('reps', '?')} warm repetitions)",
                "",
                "| method | " + " | ".join(c for c, _ in cols) + " |",
                "|---" * (len(cols) + 1) + "|",
            ]
        if "skipped" in r:
            lines.append(f"| {r['method']} | " + f"*{r['skipped']}* |" + " |" * (len(cols) - 1))
            continue
        cells = []
        for _, k in cols:
            if k is None:
                cells.append(f"{r['compilations']} ({r['compilations_repeat']})")
            else:
                cells.append(fmt(r[k]))
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines).strip() + "\n"


def write_docs(text, command, info, start=DOCS_START, end=DOCS_END):
    """Replaces the ``start`` ... ``end`` section of docs/benchmarks.md with ``text``."""
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(path) as f:
        page = f.read()
    if start not in page or end not in page:
        raise SystemExit(f"{path} has no {start} ... {end} section to update")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    block = (
        f"{start}\n"
        f"Machine: {info['cpu']}; Python {info['python']}, jax {info['jax']}, numpyro "
        f"{info['numpyro']}, blackjax {info['blackjax']}; measured {info['date']}.\n\n"
        f"```bash\n{command}\n```\n\n{text}\n{end}"
    )
    with open(path, "w") as f:
        f.write(head + block + tail)


def command_line():
    """This script's command line, as docs should quote it (without ``--from-json``)."""
    args = sys.argv[1:]
    if "--from-json" in args:  # quote the command that measured them
        i = args.index("--from-json")
        del args[i : i + 2]
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join(["python", script, *args])


def run_worker(cmd, env, label, rows, out, info):
    """Runs one worker process; appends its ``#ROW`` rows, saving ``out`` after each."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("#ROW "):
            rows.append(json.loads(line[5:]))
            print(line[5:].strip(), flush=True)
            with open(out, "w") as f:  # after every row: a cut-short run keeps them
                json.dump({"machine": info, "results": rows}, f, indent=1)
    if proc.wait():
        print(f"# the worker for {label} failed (exit {proc.returncode})", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes")
    parser.add_argument("--gpu", action="store_true", help="1,000 to 100,000 chains on GPU")
    parser.add_argument("--devices", default="2,8", help="simulated CPU device counts")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chains", default="8,64,512")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--reps", type=int, default=2, help="warm repetitions per method")
    parser.add_argument("--sizes", default=None, help="warmup:draws for every chain count")
    parser.add_argument("--sequential-max-chains", type=int, default=8)
    parser.add_argument(
        "--out", default=None, help="results JSON (default benchmarks/results/suite.json; "
        "suite-quick.json with --quick, suite-gpu.json with --gpu)",
    )  # fmt: skip
    parser.add_argument("--from-json", default=None, help="only print (and write) the table")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--platform", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--size-map", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single-chain-at", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help="skip rows already in --out")
    opts = parser.parse_args()
    if opts.quick:
        opts.devices, opts.chains, opts.reps = "2", "8", 1
        opts.models = opts.models if opts.models != ",".join(MODELS) else "eight_schools"
        opts.sizes = opts.sizes or "100:100"
    if opts.gpu:
        opts.platform, opts.devices = "gpu", "0"
        opts.chains = opts.chains if opts.chains != "8,64,512" else "1000,10000,100000"
        opts.methods = "chainrunner,chainrunner[vmap],numpyro_vectorized,floor"
        opts.sizes = opts.sizes or "200:200"
    opts.models = [m for m in opts.models.split(",") if m]
    opts.chains = [int(c) for c in opts.chains.split(",")]
    opts.methods = [m for m in opts.methods.split(",") if m]
    for m in opts.methods:
        if m not in METHODS:
            parser.error(f"--methods: unknown method {m!r}; expected some of {METHODS}")
    if opts.size_map:
        opts.sizes = {int(c): tuple(v) for c, v in json.loads(opts.size_map).items()}
    elif opts.sizes:
        w, d = (int(x) for x in opts.sizes.split(":"))
        opts.sizes = {c: (w, d) for c in opts.chains}
    else:
        opts.sizes = {c: SIZES.get(c, (100, 100)) for c in opts.chains}
    if opts.out is None:
        name = "suite-quick" if opts.quick else "suite-gpu" if opts.gpu else "suite"
        opts.out = os.path.join(HERE, "results", f"{name}.json")
    if opts.single_chain_at is None:
        opts.single_chain_at = min(opts.chains)
    if opts.worker:
        opts.devices = int(opts.devices)
        return worker(opts)

    info = {**machine(), "date": time.strftime("%Y-%m-%d")}
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    rows = []
    if opts.from_json:
        with open(opts.from_json) as f:
            saved = json.load(f)
        rows, info = saved["results"], saved["machine"]
    done = set()
    if opts.resume and os.path.exists(opts.out):
        with open(opts.out) as f:
            rows = json.load(f)["results"]
        done = {(str(r["devices"]), r["model"], r["chains"]) for r in rows}
    grid = [
        (nd, model, chains)
        for nd in opts.devices.split(",")
        for model in opts.models
        for chains in opts.chains
    ]
    for nd, model, chains in [] if opts.from_json else grid:
        if (nd, model, chains) in done:
            continue
        # One process per row: every row starts from the same state, and XLA's code
        # mappings (numpyro compiles per call) do not pile up past the OS limit.
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--devices", nd]
        cmd += ["--models", model, "--chains", str(chains)]
        cmd += ["--methods", ",".join(opts.methods), "--reps", str(opts.reps)]
        cmd += ["--sequential-max-chains", str(opts.sequential_max_chains)]
        cmd += ["--platform", opts.platform, "--size-map", json.dumps(opts.sizes)]
        cmd += ["--single-chain-at", str(min(opts.chains))]
        env = dict(os.environ, TQDM_DISABLE="1")
        if opts.platform != "cpu":
            env["JAX_PLATFORMS"] = opts.platform
        run_worker(cmd, env, f"{model}, {chains} chains, {nd} devices", rows, opts.out, info)
    text = table(rows)
    print()
    print(text)
    if opts.write_docs:
        write_docs(text, command_line(), info)


if __name__ == "__main__":
    main()
