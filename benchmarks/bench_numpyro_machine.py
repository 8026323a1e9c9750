"""numpyro models where chains share a device: numpyro's NUTS, or the NUTS state machine.

numpyro's own NUTS kernel (``cr.from_numpyro(NUTS(model), ...)``) is not a state machine:
in a ``vmap`` every chain waits, at every draw, for the batch's longest trajectory. The
same model with ``adaptation="window"`` is sampled by blackjax's NUTS with Stan's window
adaptation on the model's potential, and that runs as the machine (``docs/batches.md``).
This script times, for the non-centred eight schools (a numpyro model with a plate and
numpy data), 1000 warmup + 1000 draws on 2 CPU devices, in one process with the ways
interleaved:

- ``numpyro NUTS, vmap``: ``cr.run(cr.from_numpyro(NUTS(model), ...), batch_size=None)``;
- ``numpyro NUTS, 1``: the same kernel, ``batch_size=1`` (chains one after another);
- ``window, machine``: ``cr.from_numpyro(NUTS(model), ..., adaptation="window")``,
  ``batch_size=None`` (the machine).

Each: ``sampling_time`` (compile excluded; the warmup's and the draws' steps, one loop),
leapfrog steps per draw, the bulk ESS of ``mu`` per second of it and the posterior mean of
``mu`` (4.4 for this model). Medians over ``--reps``.

    python benchmarks/bench_numpyro_machine.py [--widths 8,32] [--reps 3] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

WAYS = ("numpyro NUTS, vmap", "numpyro NUTS, 1", "window, machine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="8,32", help="chains per device")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
    os.environ["CHAINRUNNER_CACHE"] = "off"
    rows = [measure(int(w), args.reps) for w in args.widths.split(",")]
    print(json.dumps(rows, indent=1))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def measure(width: int, reps: int) -> dict:
    """Every way ``reps`` times at ``width`` chains per device, interleaved; medians."""
    import jax
    import numpy as np
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import NUTS

    import chainrunner as cr

    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

    def eight_schools(J, sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfCauchy(5))
        with numpyro.plate("J", J):
            theta = numpyro.sample("theta_tilde", dist.Normal(0, 1))
            numpyro.sample("obs", dist.Normal(mu + tau * theta, sigma), obs=y)

    settings = {WAYS[0]: ({}, None), WAYS[1]: ({}, 1), WAYS[2]: ({"adaptation": "window"}, None)}
    found: dict[str, list[dict]] = {w: [] for w in WAYS}
    chains = width * jax.device_count()
    for rep in range(reps):
        for way in WAYS[:: 1 if rep % 2 == 0 else -1]:
            options, batch_size = settings[way]
            kernel = cr.from_numpyro(NUTS(eight_schools), model_args=(8, sigma),
                                     model_kwargs={"y": y}, **options)  # fmt: skip
            trace = cr.run(kernel, jax.random.key(rep), None, 1000, num_warmup=1000,
                           num_chains=chains, batch_size=batch_size, progress=False,
                           warn=False)  # fmt: skip
            seconds = trace.attrs["sampling_time"]
            found[way].append({
                "sampling_s": seconds,
                "steps_per_draw": float(np.mean(trace.stats["n_steps"])),
                "ess_mu_per_s": trace.diagnostics.ess_bulk["mu"] / seconds,
                "mean_mu": float(np.mean(trace.draws["mu"])),
            })  # fmt: skip
            print(json.dumps({"width": width, "way": way, **found[way][-1]}), file=sys.stderr)
    med = {w: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for w, rs in found.items()}
    base = med[WAYS[0]]["sampling_s"]
    for way in WAYS:
        med[way]["speed_vs_numpyro_vmap"] = base / med[way]["sampling_s"]
    versions = {"jax": jax.__version__, "numpyro": numpyro.__version__,
                "blackjax": __import__("blackjax").__version__}  # fmt: skip
    return {"width": width, "devices": jax.device_count(), "reps": reps, "warmup": 1000,
            "draws": 1000, "cores": os.cpu_count(), **versions, **med}  # fmt: skip


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (``measure``'s)."""
    lines = [
        "| chains per device | way | sampling (s) | speed vs numpyro vmap | steps per draw "
        "| ESS(mu) per s | mean mu |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for way in WAYS:
            r = row[way]
            lines.append(
                f"| {row['width']} | {way} | {r['sampling_s']:.2f} | "
                f"{r['speed_vs_numpyro_vmap']:.2f} | {r['steps_per_draw']:.1f} | "
                f"{r['ess_mu_per_s']:.0f} | {r['mean_mu']:.2f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
