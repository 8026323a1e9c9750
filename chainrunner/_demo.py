"""``python -m chainrunner``: eight schools with blackjax NUTS on simulated CPU devices."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

# Eight schools (Rubin 1981), as in posteriordb's `eight_schools` data.
Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)
SCHOOLS = ("A", "B", "C", "D", "E", "F", "G", "H")


def eight_schools_logdensity(position):
    """Non-centred eight schools on the unconstrained space (``log_tau`` for ``tau``).

    ``mu ~ N(0, 5)``, ``tau ~ HalfCauchy(5)``, ``theta_trans ~ N(0, 1)``,
    ``y ~ N(mu + tau * theta_trans, sigma)``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from chainrunner._demo import eight_schools_logdensity
        >>> p = {"mu": 0.0, "log_tau": 0.0, "theta_trans": jnp.zeros(8)}
        >>> bool(jnp.isfinite(eight_schools_logdensity(p)))
        True
    """
    import jax.numpy as jnp
    from jax.scipy import stats

    mu, log_tau, z = position["mu"], position["log_tau"], position["theta_trans"]
    tau = jnp.exp(log_tau)
    theta = mu + tau * z
    return (
        stats.norm.logpdf(mu, 0.0, 5.0)
        + stats.cauchy.logpdf(tau, 0.0, 5.0)
        + jnp.log(2.0)
        + log_tau  # Jacobian of tau = exp(log_tau)
        + jnp.sum(stats.norm.logpdf(z))
        + jnp.sum(stats.norm.logpdf(jnp.asarray(Y), theta, jnp.asarray(SIGMA)))
    )


def _batch_size(text: str) -> int | str | None:
    if text in ("auto", "all"):
        return None if text == "all" else text
    try:
        return _at_least(1)(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}, 'auto' or 'all'") from None


def _positive(text: str) -> float:
    """An argparse type: a finite float above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {value}")
    return value


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an int of at least ``low`` (else argparse's usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m chainrunner",
        description="Eight schools, blackjax NUTS, many chains over simulated CPU devices.",
    )
    parser.add_argument(
        "--chains", type=_at_least(1), default=32, help="number of chains (default 32)"
    )
    parser.add_argument(
        "--devices", type=_at_least(1), default=8, help="simulated CPU devices (default 8)"
    )
    parser.add_argument(
        "--batch-size",
        type=_batch_size,
        default="auto",
        help="chains advanced together on a device: an int, 'all' (one vmap) or 'auto' "
        "(the default: decided from the call on CPU, see docs/batch-size.md)",
    )
    parser.add_argument("--samples", type=_at_least(1), default=1000, help="draws per chain")
    parser.add_argument("--warmup", type=_at_least(0), default=500, help="burn-in steps per chain")
    parser.add_argument("--step-size", type=_positive, default=0.4, help="NUTS step size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--quiet", action="store_true", help="print the layout line only (no progress bar)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the demo; see ``python -m chainrunner --help``.

    Examples:
        >>> from chainrunner._demo import main
        >>> main(["--chains", "3", "--devices", "1", "--samples", "20", "--warmup", "0",
        ...       "--no-progress", "--quiet"])
        layout: 3 chains on 1 device(s), 3 per device, batch_size=1
    """
    args = _parser().parse_args(argv)

    import jax

    from .layout import _mesh

    if jax.config.jax_platforms in (None, "", "cpu"):
        try:
            _mesh.request_cpu_devices(args.devices)
        except RuntimeError:  # JAX is already up (another count): run on what it has
            pass
    import arviz as az
    import blackjax
    import jax.numpy as jnp

    from .pipeline._run import run

    num_devices = min(args.devices, len(jax.devices()), args.chains)
    mesh = _mesh.chain_mesh(num_devices)
    nuts = blackjax.nuts(eight_schools_logdensity, args.step_size, jnp.ones(10))
    start_key, run_key = jax.random.split(jax.random.key(args.seed))
    start = jax.random.normal(start_key, (args.chains, 10))
    position = {"mu": start[:, 0], "log_tau": start[:, 1], "theta_trans": start[:, 2:]}
    trace = run(
        nuts,
        run_key,
        position,
        args.samples,
        num_warmup=args.warmup,
        mesh=mesh,
        batch_size=args.batch_size,
        progress=not (args.no_progress or args.quiet),
    )
    a = trace.attrs
    print(f"layout: {a['layout']}")
    if args.quiet:
        return
    print(
        f"compile: {a['compile_time']:.2f} s   sampling: {a['sampling_time']:.2f} s   "
        f"({args.chains * (args.warmup + args.samples) / a['sampling_time']:,.0f} steps/s)"
    )
    print(f"divergences: {int(trace.stats['diverging'].sum())}")
    data = trace.to_arviz(coords={"school": list(SCHOOLS)}, dims={"theta_trans": ["school"]})
    print(az.summary(data, var_names=["mu", "log_tau", "theta_trans"]).to_string())
