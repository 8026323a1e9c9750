"""No chain waits: blackjax's NUTS vectorised as a state machine, against ``vmap`` (issue 37).

Under ``vmap``, NUTS makes every chain of a batch wait at every draw for the longest
trajectory of the batch. The state machine (``adapters/_blackjax/_nuts_fsm.py``, after
Dance et al. 2025) advances every chain by one leapfrog step per tick instead, and a
chain whose transition ends starts its next one at the next tick: the batch waits for
its slowest chain once per chunk.

Per model and width (chains per device), on ``--devices`` devices, the same fixed step
size and mass matrix for both, ``--draws`` draws per chain from the same starts:

- ``vmap``: ``jit(shard_map(vmap(scan(nuts.step))))``, the hand-written floor;
- ``fsm``: ``jit(shard_map(tick loop))``, the machine.

Reported: seconds per run (compile excluded, median of ``--reps``, interleaved), the
speed-up ``vmap / fsm``, leapfrog steps per draw, and the barrier the ``vmap`` pays
(``E[max n_steps over a batch] / E[mean n_steps]``). ``--gpu`` runs the same on the
first accelerator (widths 1,024 and 4,096 too).

    python benchmarks/bench_nuts_fsm.py [--widths 8,32,128,1024] [--devices 2] [--gpu]
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

    from chainrunner.adapters._blackjax._nuts_fsm import nuts_machine

    logdensity, dim, eps = model(name)
    mesh = jax.make_mesh((devices,), ("chain",))
    nuts = blackjax.nuts(logdensity, eps, jnp.ones(dim))
    machine = nuts_machine(logdensity)(jnp.ones(dim))
    eps = jnp.float32(eps)

    def floor(states, keys):
        def one(state, key):
            def body(s, t):
                s, info = nuts.step(jax.random.fold_in(key, t), s)
                return s, (s.position, info.num_integration_steps)

            return jax.lax.scan(body, state, jnp.arange(draws))[1]

        return jax.vmap(one)(states, keys)

    def fsm(states, keys):
        b = keys.shape[0]
        rows = jnp.arange(b)
        begin = jax.vmap(machine.begin, in_axes=(0, 0, None))
        first = begin(jax.vmap(jax.random.fold_in)(keys, jnp.zeros(b, jnp.int32)), states, eps)
        buf = (jnp.zeros((b, draws, dim)), jnp.zeros((b, draws), jnp.int32))

        def more(c):
            return jnp.any(c[1] < draws)

        def tick(c):
            m, count, (pos, steps) = c
            m = jax.vmap(machine.tick)(m)
            new, info = jax.vmap(machine.result)(m)
            end = m.done & (count < draws)
            at = jnp.minimum(count, draws - 1)
            pos = pos.at[rows, at].set(jnp.where(end[:, None], new.position, pos[rows, at]))
            steps = steps.at[rows, at].set(jnp.where(end, info.num_integration_steps,
                                                     steps[rows, at]))  # fmt: skip
            count = count + end
            nxt = begin(jax.vmap(jax.random.fold_in)(keys, count), new, eps)
            m = jax.tree.map(
                lambda a, b_: jnp.where(
                    (end & (count < draws)).reshape((-1,) + (1,) * (a.ndim - 1)), a, b_
                ),
                nxt,
                m,
            )
            return m, count, (pos, steps)

        return jax.lax.while_loop(more, tick, (first, jnp.zeros(b, jnp.int32), buf))[2]

    def sharded(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("chain"), out_specs=P("chain"),
                                     check_vma=False))  # fmt: skip

    n = width * devices
    starts = jax.vmap(nuts.init)(0.1 * jax.random.normal(jax.random.key(0), (n, dim)))
    keys = jax.random.split(jax.random.key(1), n)
    put = NamedSharding(mesh, P("chain"))
    args = (jax.device_put(starts, put), jax.device_put(keys, put))
    return sharded(floor), sharded(fsm), args


def timed(f, args) -> tuple[float, object]:
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(f(*args))
    return time.perf_counter() - t0, out


def row(name: str, width: int, devices: int, draws: int, reps: int) -> dict:
    floor, fsm, args = programs(name, width, devices, draws)
    out = {}
    for label, f in (("vmap", floor), ("fsm", fsm)):
        out[label] = timed(f, args)[1]  # compile
    times = {"vmap": [], "fsm": []}
    for r in range(reps):
        for label in ("vmap", "fsm") if r % 2 == 0 else ("fsm", "vmap"):
            times[label].append(timed(floor if label == "vmap" else fsm, args)[0])
    steps = np.asarray(out["vmap"][1])  # (chains, draws)
    per_batch = steps.reshape(devices, width, draws)
    barrier = float(per_batch.max(axis=1).mean() / per_batch.mean())
    fsm_steps = np.asarray(out["fsm"][1])
    t_vmap, t_fsm = float(np.median(times["vmap"])), float(np.median(times["fsm"]))
    return {"model": name, "width": width, "devices": devices, "draws": draws,
            "vmap_s": t_vmap, "fsm_s": t_fsm, "speedup": t_vmap / t_fsm, "barrier": barrier,
            "steps_per_draw_vmap": float(steps.mean()),
            "steps_per_draw_fsm": float(fsm_steps.mean())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="eight_schools,gaussian_50")
    parser.add_argument("--widths", default="8,32,128,1024")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="on the first accelerator")
    parser.add_argument("--quick", action="store_true", help="eight schools, widths 8 and 32")
    parser.add_argument("--json")
    args = parser.parse_args()
    devices = 1 if args.gpu else args.devices
    _setup(devices, args.gpu)
    widths = [int(w) for w in args.widths.split(",")]
    models = args.models.split(",")
    if args.gpu:
        widths = sorted(set(widths) | {1024, 4096})
    if args.quick:
        models, widths = ["eight_schools"], [8, 32]
    rows = []
    for name in models:
        for width in widths:
            r = row(name, width, devices, args.draws, args.reps)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| model | width | vmap (s) | fsm (s) | speed-up | barrier | steps/draw |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        figures = (r["vmap_s"], r["fsm_s"], r["speedup"], r["barrier"])
        cells = (r["model"], r["width"], *(f"{v:.2f}" for v in figures),
                 f"{r['steps_per_draw_fsm']:.1f}")  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
