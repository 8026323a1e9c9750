"""No chain waits: blackjax's NUTS vectorised as a state machine, against ``vmap`` (issue 37).

Under ``vmap``, NUTS makes every chain of a batch wait at every draw for the longest
trajectory of the batch. The state machine (``adapters/_blackjax/_nuts_fsm.py``, after
Dance et al. 2025) advances every chain by one leapfrog step per tick instead, and a
chain whose transition ends starts its next one at once: the batch waits for its
slowest chain once per chunk. ``cr.run`` uses it wherever it vmaps ``blackjax.nuts``.

Per model and width (chains per device), on ``--devices`` devices, the same fixed step
size and mass matrix, ``--draws`` draws per chain from the same starts and keys:

- ``vmap``: ``jit(shard_map(vmap(scan(nuts.step))))``, the hand-written floor;
- ``fsm``: ``jit(shard_map(chunk_machine))``, the machine alone;
- ``run``: ``cr.run(nuts, ..., batch_size=None)``: the vmapped run users get (its
  ``sampling_time``);
- ``run_1``: ``cr.run(nuts, ..., batch_size=1)``: chains one after another, no vmap
  (widths up to 32).

Reported: seconds per run (compile excluded, median of ``--reps``, interleaved), each
speed-up over ``vmap``, leapfrog steps per draw, and the wait the ``vmap`` pays
(``E[max n_steps over a batch] / E[mean n_steps]``). ``--adapted N``: what users run
instead, window-adapted NUTS (``cr.from_blackjax(blackjax.nuts, adaptation="window")``) with
``N`` warmup draws, ``cr.run``'s ``sampling_time`` (warmup included) with the machine, with
the same kernel vmapped without it, and with ``batch_size=1``; ``--adaptation fisher`` (or
``fisher_low_rank``, its machine forced on) the same with Fisher's. ``--gpu`` runs the same
on the first accelerator (widths 1,024 and 4,096 too; ``batch_size=1`` left out: chains
one after another are a GPU's slowest way). On one H200 (``results/nuts_fsm-gpu.json``)
the machine was 4.4-5.3x (eight schools, 128 to 16,384 chains) and 1.6-2.2x (50-d
Gaussian, 128 to 4,096) faster than the ``vmap``.

    python benchmarks/bench_nuts_fsm.py [--widths 8,32,128,1024] [--devices 2] [--gpu]
    python benchmarks/bench_nuts_fsm.py --adapted 1000 --draws 1000 --widths 8,32
    python benchmarks/bench_nuts_fsm.py --adapted 1000 --draws 1000 --adaptation fisher
    python benchmarks/bench_nuts_fsm.py --quorums [--adapted 1000 --draws 1000]

``--quorums``: the machine alone with its ended chains processed at every tick where one
has ended, or once an eighth, a quarter (the default, ``_nuts_fsm.quorum``) or half of
the batch has: each one's speed over the first, and whether the draws are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _setup(devices: int, gpu: bool) -> None:
    if not gpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax

        jax.config.update("jax_num_cpu_devices", devices)


def _accelerator() -> bool:
    """Whether JAX runs on an accelerator: there ``batch_size=1`` (a launch per leapfrog
    step of each chain in turn) is left out."""
    import jax

    return jax.default_backend() != "cpu"


def model(name: str):
    """``(logdensity, dim, step_size)`` of ``name`` (fixed parameters, identity metric)."""
    import jax.numpy as jnp
    from jax.scipy.stats import norm

    if name == "eight_schools":
        y = jnp.array([28.0, 8, -3, 7, -1, 1, 18, 12])
        sigma = jnp.array([15.0, 10, 16, 11, 9, 11, 10, 18])

        def logdensity(x):
            mu, log_tau, theta_t = x[0], x[1], x[2:]
            tau = jnp.exp(log_tau)
            return (norm.logpdf(mu, 0, 5) + jnp.log(2 / (jnp.pi * 5 * (1 + (tau / 5) ** 2)))
                    + log_tau + jnp.sum(norm.logpdf(theta_t))
                    + jnp.sum(norm.logpdf(y, mu + tau * theta_t, sigma)))  # fmt: skip

        return logdensity, 10, 0.4
    if name == "gaussian_50":
        rng = np.random.default_rng(0)
        q, _ = np.linalg.qr(rng.normal(size=(50, 50)))
        prec = jnp.asarray(q @ np.diag(1 / np.geomspace(0.1, 3.0, 50) ** 2) @ q.T, jnp.float32)

        def logdensity(x):
            return -0.5 * x @ prec @ x

        return logdensity, 50, 0.08
    raise ValueError(name)


def programs(name: str, width: int, devices: int, draws: int):
    """The two jitted programs and their arguments, for ``width`` chains per device."""
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from chainrunner.adapters._blackjax._nuts_fsm import chunk_machine, nuts_spec
    from chainrunner.core._kernel import default_extract

    logdensity, dim, eps = model(name)
    mesh = jax.make_mesh((devices,), ("chain",))
    nuts = blackjax.nuts(logdensity, eps, jnp.ones(dim))

    def floor(states, keys):
        def one(state, key):
            def body(s, t):
                s, info = nuts.step(jax.random.fold_in(key, t), s)
                return s, (s.position, info.num_integration_steps)

            return jax.lax.scan(body, state, jnp.arange(draws))[1]

        return jax.vmap(one)(states, keys)

    def fsm(states, keys):
        loop = chunk_machine(nuts_spec(nuts), default_extract, draws)
        out = loop(states, keys, jnp.int32(0), jnp.int32(draws))[1]
        return out[0], out[1]["n_steps"]

    def sharded(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("chain"), out_specs=P("chain"),
                                     check_vma=False))  # fmt: skip

    n = width * devices
    starts = jax.vmap(nuts.init)(0.1 * jax.random.normal(jax.random.key(0), (n, dim)))
    keys = jax.random.split(jax.random.key(1), n)
    put = NamedSharding(mesh, P("chain"))
    args = (jax.device_put(starts, put), jax.device_put(keys, put))
    return sharded(floor), sharded(fsm), args


def run_call(name: str, width: int, devices: int, draws: int, batch_size):
    """``cr.run`` of the same NUTS, starts and draws: ``() -> (n_steps, sampling_time)``
    (the run's own ``attrs["sampling_time"]``: its chunk loop, draws moved to the host;
    not the diagnostics and the trace around it)."""
    import blackjax
    import jax
    import jax.numpy as jnp

    import chainrunner as cr

    logdensity, dim, eps = model(name)
    nuts = blackjax.nuts(logdensity, eps, jnp.ones(dim))
    x0 = 0.1 * jax.random.normal(jax.random.key(0), (width * devices, dim))
    mesh = cr.chain_mesh(devices)

    def call():
        trace = cr.run(nuts, jax.random.key(1), x0, draws, mesh=mesh, batch_size=batch_size,
                       progress=False, warn=False)  # fmt: skip
        return np.asarray(trace.stats["n_steps"]), trace.attrs["sampling_time"]

    return call


def adapted_kernel(adaptation: str, logdensity, machine: bool | None):
    """``cr.from_blackjax(blackjax.nuts, adaptation=adaptation)``'s kernel factory as users
    get it (``machine=None``), without its machine (``False``: the vmapped loop before), or
    with the machine forced on (``True``; ``"fisher_low_rank"`` has none by default)."""
    import blackjax

    import chainrunner as cr
    from chainrunner.adapters._blackjax import _fisher_options
    from chainrunner.adapters._blackjax._warmup_fisher import fisher_in_loop
    from chainrunner.adapters._blackjax._warmup_window import (
        WindowAdaptation,
        adaptive_kernel,
        window_kernel,
    )

    if machine is None:
        return cr.from_blackjax(blackjax.nuts, logdensity_fn=logdensity, adaptation=adaptation)
    if adaptation == "window":

        def kernel_fn(*a):
            kernel = window_kernel(*a)
            return kernel if machine else kernel._replace(machine=None)

        options = {"is_mass_matrix_diagonal": True, "initial_step_size": 1.0,
                   "target_acceptance_rate": 0.8}  # fmt: skip
    else:
        options = _fisher_options(adaptation, blackjax.nuts, {}, "bench")
        low_rank = adaptation == "fisher_low_rank"

        def kernel_fn(algorithm, logdensity_fn, num_warmup, options):
            spec = fisher_in_loop(logdensity_fn, num_warmup, options, low_rank)
            return adaptive_kernel(algorithm, logdensity_fn, num_warmup, {},
                                   spec._replace(machine=machine))  # fmt: skip

    return WindowAdaptation(blackjax.nuts, logdensity, options, kernel_fn=kernel_fn)


def adapted_call(name: str, width: int, devices: int, draws: int, warmup: int, how: str,
                 adaptation: str = "window"):  # fmt: skip
    """``cr.run`` of adapted NUTS (``from_blackjax(blackjax.nuts, adaptation=...)``, what
    users run): ``how`` is ``"run"`` (the default: the machine where chains are vmapped and
    the adaptation has one), ``"vmap"`` (the same kernel without its machine: the vmapped
    loop), ``"machine"`` (the machine forced on) or ``"run_1"`` (``batch_size=1``).
    ``() -> (n_steps, seconds of warmup and sampling, mean of the draws)``."""

    import jax

    import chainrunner as cr

    logdensity, dim, _ = model(name)
    machine = {"vmap": False, "machine": True}.get(how)
    kernel = adapted_kernel(adaptation, logdensity, machine)
    x0 = 0.1 * jax.random.normal(jax.random.key(0), (width * devices, dim))
    mesh = cr.chain_mesh(devices)

    def call():
        trace = cr.run(
            kernel,
            jax.random.key(1),
            x0,
            draws,
            num_warmup=warmup,
            mesh=mesh,
            batch_size=1 if how == "run_1" else None,
            progress=False,
            warn=False,
        )
        return (np.asarray(trace.stats["n_steps"]), trace.attrs["sampling_time"],
                float(np.mean(trace.draws)))  # fmt: skip

    return call


def adapted_row(name: str, width: int, devices: int, draws: int, warmup: int,
                reps: int, adaptation: str = "window") -> dict:  # fmt: skip
    """One row of ``--adapted``: the vmapped loop, the default run (the machine, forced on
    where the adaptation has none by default), and ``batch_size=1``."""
    default = "machine" if adaptation == "fisher_low_rank" else "run"
    hows = ["vmap", default] + (["run_1"] if width <= 32 and not _accelerator() else [])
    calls = {how: adapted_call(name, width, devices, draws, warmup, how, adaptation)
             for how in hows}  # fmt: skip
    out = {how: f() for how, f in calls.items()}  # compiles
    times = {how: [] for how in calls}
    for r in range(reps):
        for how in hows if r % 2 == 0 else hows[::-1]:
            times[how].append(calls[how]()[1])
    med = {how: float(np.median(t)) for how, t in times.items()}
    steps = out["vmap"][0].reshape(devices, width, draws)
    result = {"model": name, "adaptation": adaptation, "width": width, "devices": devices,
              "draws": draws, "warmup": warmup, "vmap_s": med["vmap"], "run_s": med[default],
              "run_speedup": med["vmap"] / med[default],
              "barrier": float(steps.max(axis=1).mean() / steps.mean()),
              "mean_vmap": out["vmap"][2], "mean_run": out[default][2]}  # fmt: skip
    if "run_1" in med:
        result.update(run_1_s=med["run_1"], run_1_speedup=med["vmap"] / med["run_1"])
    return result


def timed(f) -> tuple[float, object]:
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(f())
    return time.perf_counter() - t0, out


def row(name: str, width: int, devices: int, draws: int, reps: int) -> dict:
    floor, fsm, args = programs(name, width, devices, draws)
    calls = {"vmap": lambda: floor(*args), "fsm": lambda: fsm(*args),
             "run": run_call(name, width, devices, draws, None)}  # fmt: skip
    if width <= 32 and not _accelerator():  # chains one after another: no vmap, no wait
        calls["run_1"] = run_call(name, width, devices, draws, 1)  # (slow at large widths)
    out = {label: timed(f)[1] for label, f in calls.items()}  # compiles
    times = {label: [] for label in calls}
    for r in range(reps):
        for label in calls if r % 2 == 0 else list(calls)[::-1]:
            seconds, got = timed(calls[label])
            times[label].append(got[1] if label.startswith("run") else seconds)
    steps = np.asarray(out["vmap"][1])  # (chains, draws)
    per_batch = steps.reshape(devices, width, draws)
    barrier = float(per_batch.max(axis=1).mean() / per_batch.mean())
    med = {label: float(np.median(t)) for label, t in times.items()}
    result = {"model": name, "width": width, "devices": devices, "draws": draws,
              "vmap_s": med["vmap"], "fsm_s": med["fsm"], "speedup": med["vmap"] / med["fsm"],
              "run_s": med["run"], "run_speedup": med["vmap"] / med["run"],
              "barrier": barrier, "steps_per_draw_vmap": float(steps.mean()),
              "steps_per_draw_fsm": float(np.asarray(out["fsm"][1]).mean())}  # fmt: skip
    if "run_1" in med:
        result.update(run_1_s=med["run_1"], run_1_speedup=med["vmap"] / med["run_1"])
    return result


QUORUMS = {"each": None, "eighth": 8, "quarter": 4, "half": 2}
"""``--quorums``: when the machine processes ended chains (``_nuts_fsm.quorum``): at every
tick where one has ended, or once an eighth, a quarter (the default) or half of the batch."""


def quorum_program(name: str, width: int, devices: int, draws: int, warmup: int,
                   divisor: int | None):  # fmt: skip
    """The machine alone, ``jit(shard_map(chunk_machine))``, with ``quorum(b) = max(1, b //
    divisor)`` (``None``: 1), for fixed parameters (``warmup`` 0) or window-adapted NUTS
    (``warmup`` + ``draws`` in one chunk): ``(program, args)``."""
    import blackjax
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from chainrunner.adapters._blackjax import _nuts_fsm
    from chainrunner.adapters._blackjax._warmup_window import window_kernel
    from chainrunner.core._kernel import default_extract

    logdensity, dim, eps = model(name)
    n, length = width * devices, warmup + draws
    x0 = 0.1 * jax.random.normal(jax.random.key(0), (n, dim))
    if warmup:
        options = {"is_mass_matrix_diagonal": True, "initial_step_size": 1.0,
                   "target_acceptance_rate": 0.8}  # fmt: skip
        kernel = window_kernel(blackjax.nuts, logdensity, warmup, options)
        states = jax.vmap(kernel.init)(x0, jax.random.split(jax.random.key(3), n))
        spec, extract = kernel.machine.args[0], kernel.extract
    else:
        nuts = blackjax.nuts(logdensity, eps, jnp.ones(dim))
        states = jax.vmap(nuts.init)(x0)
        spec, extract = _nuts_fsm.nuts_spec(nuts), default_extract

    def chunk(states, keys):
        original = _nuts_fsm.quorum
        _nuts_fsm.quorum = lambda b: 1 if divisor is None else max(1, b // divisor)
        try:  # read when the program is traced
            loop = _nuts_fsm.chunk_machine(spec, extract, length)
            out = loop(states, keys, jnp.int32(0), jnp.int32(length))[1]
        finally:
            _nuts_fsm.quorum = original
        return out[0], out[1]["n_steps"]

    mesh = jax.make_mesh((devices,), ("chain",))
    program = jax.jit(jax.shard_map(chunk, mesh=mesh, in_specs=P("chain"),
                                    out_specs=P("chain"), check_vma=False))  # fmt: skip
    put = NamedSharding(mesh, P("chain"))
    keys = jax.random.split(jax.random.key(1), n)
    return program, (jax.device_put(states, put), jax.device_put(keys, put))


def quorum_row(name: str, width: int, devices: int, draws: int, warmup: int,
               reps: int) -> dict:  # fmt: skip
    """One row of ``--quorums``: each quorum's time, its speed over ``"each"``, and whether
    its draws equal ``"each"``'s bitwise."""
    programs_ = {label: quorum_program(name, width, devices, draws, warmup, d)
                 for label, d in QUORUMS.items()}  # fmt: skip
    calls = {label: (lambda p=p: p[0](*p[1])) for label, p in programs_.items()}
    out = {label: timed(f)[1] for label, f in calls.items()}  # compiles
    times = {label: [] for label in calls}
    for r in range(reps):
        for label in calls if r % 2 == 0 else list(calls)[::-1]:
            times[label].append(timed(calls[label])[0])
    med = {label: float(np.median(t)) for label, t in times.items()}
    same = {label: bool(np.array_equal(out[label][0], out["each"][0])) for label in out}
    return {"model": name, "width": width, "devices": devices, "draws": draws,
            "warmup": warmup, "seconds": med,
            "speedup": {label: med["each"] / t for label, t in med.items()},
            "same_draws": same,
            "steps_per_draw": float(np.asarray(out["each"][1]).mean())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="eight_schools,gaussian_50")
    parser.add_argument("--widths", default="8,32,128,1024")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="on the first accelerator")
    parser.add_argument("--quick", action="store_true", help="eight schools, widths 8 and 32")
    parser.add_argument(
        "--adapted",
        type=int,
        default=0,
        metavar="WARMUP",
        help="adapted NUTS with this many warmup draws (cr.run only)",
    )
    parser.add_argument(
        "--adaptation",
        default="window",
        choices=["window", "fisher", "fisher_low_rank"],
        help="with --adapted: the adaptation (fisher_low_rank: its machine forced on)",
    )
    parser.add_argument(
        "--quorums",
        action="store_true",
        help="the machine alone, ends processed at each tick or once 1/8, 1/4, 1/2 of the "
        "batch has ended (with --adapted N: window-adapted)",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    devices = 1 if args.gpu else args.devices
    _setup(devices, args.gpu)
    if args.gpu and not _accelerator():
        parser.error("--gpu: JAX sees no accelerator (jax.default_backend() is 'cpu')")
    widths = [int(w) for w in args.widths.split(",")]
    models = args.models.split(",")
    if args.gpu:
        widths = sorted(set(widths) | {1024, 4096})
    if args.quick:
        models, widths = ["eight_schools"], [8, 32]
    rows = []
    for name in models:
        for width in widths:
            if args.quorums:
                r = quorum_row(name, width, devices, args.draws, args.adapted, args.reps)
            elif args.adapted:
                r = adapted_row(
                    name, width, devices, args.draws, args.adapted, args.reps, args.adaptation
                )
            else:
                r = row(name, width, devices, args.draws, args.reps)
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.quorums:
        _quorum_table(rows)
    elif args.adapted:
        _adapted_table(rows)
    else:
        _table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.stdout.flush()


def _quorum_table(rows: list) -> None:
    print("\n| model | warmup | width | steps/draw | " + " | ".join(QUORUMS) + " | same draws |")
    print("|---|---:|---:|---:|" + "---:|" * len(QUORUMS) + "---|")
    for r in rows:
        cells = (
            r["model"],
            r["warmup"],
            r["width"],
            f"{r['steps_per_draw']:.1f}",
            *(f"{r['speedup'][q]:.2f}" for q in QUORUMS),
            all(r["same_draws"].values()),
        )
        print("| " + " | ".join(map(str, cells)) + " |")


def _adapted_table(rows: list) -> None:
    print("\n| model | adaptation | width | vmapped loop (s) | cr.run (s) | speed-up | cr.run, 1 "
          "| wait |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        figures = (r["vmap_s"], r["run_s"], r["run_speedup"],
                   r.get("run_1_speedup", float("nan")), r["barrier"])  # fmt: skip
        cells = (r["model"], r.get("adaptation", "window"), r["width"],
                 *(f"{v:.2f}" for v in figures))  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")


def _table(rows: list) -> None:
    print("\n| model | width | vmap (s) | machine (s) | speed-up | cr.run vmapped | cr.run, 1 "
          "| wait | steps/draw |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        figures = (r["vmap_s"], r["fsm_s"], r["speedup"], r["run_speedup"],
                   r.get("run_1_speedup", float("nan")), r["barrier"])  # fmt: skip
        cells = (r["model"], r["width"], *(f"{v:.2f}" for v in figures),
                 f"{r['steps_per_draw_fsm']:.1f}")  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
