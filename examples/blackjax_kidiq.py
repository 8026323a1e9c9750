"""blackjax NUTS on a real posterior (posteriordb's kidiq-kidscore_interaction), 8 devices.

Step size and mass matrix come from blackjax's window adaptation on one chain; then
chainrunner runs 16 chains over 8 simulated CPU devices with those fixed parameters
and compares the posterior with the posteriordb (Stan) reference.

Run: python examples/blackjax_kidiq.py [--quick]
"""

import os

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any JAX work

import argparse  # noqa: E402
import json  # noqa: E402

import arviz as az  # noqa: E402
import blackjax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.scipy import stats  # noqa: E402

import chainrunner as cr  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DB = os.path.join(HERE, "..", "data", "posteriordb")


def load():
    with open(os.path.join(DB, "data", "kidiq.json")) as f:
        data = json.load(f)
    return {k: jnp.asarray(data[k], jnp.float32) for k in ("kid_score", "mom_hs", "mom_iq")}


def make_logdensity(data):
    """beta flat, sigma ~ HalfCauchy(2.5), on the unconstrained space (log_sigma)."""
    hs, iq, y = data["mom_hs"], data["mom_iq"], data["kid_score"]

    def logdensity(p):
        b, sigma = p["beta"], jnp.exp(p["log_sigma"])
        mu = b[0] + b[1] * hs + b[2] * iq + b[3] * hs * iq
        return (
            jnp.sum(stats.norm.logpdf(y, mu, sigma))
            + stats.cauchy.logpdf(sigma, 0.0, 2.5)
            + p["log_sigma"]  # Jacobian
        )

    return logdensity


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    num_chains, num_warmup, num_samples = (16, 1000, 1000) if not args.quick else (10, 200, 100)

    logdensity = make_logdensity(load())
    start = {"beta": jnp.array([26.0, 5.0, 0.6, 0.0]), "log_sigma": jnp.log(18.0)}

    # Adapt once, on one chain, with blackjax's own window adaptation.
    warmup = blackjax.window_adaptation(blackjax.nuts, logdensity, target_acceptance_rate=0.9)
    (state, params), _ = warmup.run(jax.random.key(0), start, num_steps=num_warmup)
    nuts = blackjax.nuts(logdensity, **params)

    # Many chains from jittered starts, spread over 8 devices.
    jitter = jax.random.normal(jax.random.key(1), (num_chains, 5)) * 0.01
    positions = {
        "beta": state.position["beta"] * (1.0 + jitter[:, :4]),
        "log_sigma": state.position["log_sigma"] + jitter[:, 4],
    }
    trace = cr.run(
        nuts, jax.random.key(2), positions, num_samples, num_warmup=100, mesh=cr.chain_mesh(8)
    )
    trace.draws["sigma"] = np.exp(trace.draws.pop("log_sigma"))
    print(trace.attrs["layout"])
    data = trace.to_arviz()
    summary = az.summary(data, var_names=["beta", "sigma"])
    with open(os.path.join(DB, "reference", "kidiq-kidscore_interaction.json")) as f:
        ref = json.load(f)["params"]
    names = [f"beta[{i}]" for i in range(4)] + ["sigma"]
    ref_names = [f"beta[{i + 1}]" for i in range(4)] + ["sigma"]
    print(f"{'':8} {'mean':>9} {'ref mean':>9} {'sd':>8} {'ref sd':>8} {'ess':>7}")
    for ours, theirs in zip(names, ref_names, strict=True):
        row, r = summary.loc[ours], ref[theirs]
        print(
            f"{theirs:8} {row['mean']:9.3f} {r['mean']:9.3f} {row['sd']:8.3f} {r['sd']:8.3f} "
            f"{row['ess_bulk']:7.0f}"
        )
    print(f"divergences: {int(trace.stats['diverging'].sum())}")


if __name__ == "__main__":
    main()
