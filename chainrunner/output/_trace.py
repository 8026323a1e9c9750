"""``Trace``: what a run returns."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """The result of ``cr.run``: draws and stats on the host, the final state on device.

    Attributes:
        draws: pytree of numpy arrays, leaves ``(chain, draw, *event)``.
        stats: dict of numpy ``(chain, draw)`` arrays in ArviZ names (``diverging``,
            ``lp``, ``acceptance_rate``, ``energy``, ``n_steps``, ``tree_depth``,
            ``step_size``: those the kernel provides).
        final_state: the kernel state after the last step, leading chain axis, still
            sharded over the mesh. Pass the trace back to ``cr.run`` to continue.
        num_steps: kernel steps taken per chain so far (warmup included); a
            continued run numbers its steps from here.
        warmup_draws: like ``draws`` for the warmup phase (``keep_warmup=True``), else ``None``.
        warmup_stats: like ``stats`` for the warmup phase, else ``None``.
        attrs: run metadata: versions, layout, seed, compile and sampling times.
        groups: further ArviZ groups, ``{group: {name: array}}`` (e.g. ``observed_data``,
            ``log_likelihood``), as adapters provide them.
        kernel_params: the kernel's parameters the run sampled with (``Kernel.params``:
            model data, or the shared step size of a cross-chain warmup), so that a
            continued run samples with the same ones.
        dims: the model's own dimension names per variable (numpyro plate names and
            ``event_dims``, PyMC dims), the default ``dims`` of ``to_arviz``.
        coords: the model's own coordinates per dimension (PyMC coords), the default
            ``coords`` of ``to_arviz``.
        adapted_parameters: the parameters the warmup adapted (``cr.adapted_parameters``),
            ``{name: numpy array}``, a leading chain axis where each chain adapts its own;
            ``None`` for a kernel that adapts nothing.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 50, progress=False)
        >>> trace.draws.shape, trace.stats["diverging"].shape, trace.num_steps
        ((4, 50, 2), (4, 50), 50)
    """

    draws: Any
    stats: dict[str, np.ndarray]
    final_state: Any
    num_steps: int = 0
    warmup_draws: Any = None
    warmup_stats: dict[str, np.ndarray] | None = None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    groups: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    kernel_params: Any = None
    dims: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    coords: dict[str, Any] = dataclasses.field(default_factory=dict)
    adapted_parameters: dict[str, Any] | None = None

    @functools.cached_property
    def diagnostics(self) -> Any:
        """Convergence diagnostics of the draws (R-hat, ESS, divergences, stuck chains...).

        Computed with ArviZ on first access; ``run`` warns when they say the run went
        wrong (unless ``warn=False``). See ``cr.Diagnostics``.

        Examples:
            >>> import blackjax, jax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
            >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 1000,
            ...                progress=False, warn=False)
            >>> trace.diagnostics.ok, int(trace.diagnostics.divergences.sum())
            (True, 0)
        """
        from ._diagnostics import diagnose

        return diagnose(self)

    def __repr__(self) -> str:
        """A few lines: chains, draws, variables with their event shapes, stats, layout.

        Examples:
            >>> import blackjax, jax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.8, jnp.ones(2))
            >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 2)), 50, progress=False,
            ...                warn=False)
            >>> print(repr(trace).splitlines()[0])
            Trace: 4 chains x 50 draws (50 steps per chain)
        """
        import jax

        from ..core._naming import flat_dict

        a = self.attrs
        lines = [f"Trace: {self.num_chains} chains x {self.num_draws} draws "
                 f"({self.num_steps} steps per chain)"]  # fmt: skip
        variables = [f"{k} {tuple(np.shape(v)[2:])}" for k, v in flat_dict(self.draws).items()]
        lines.append("  draws: " + _listed(variables))
        lines.append("  stats: " + _listed(sorted(self.stats)))
        if self.warmup_draws is not None:
            kept = np.shape(jax.tree.leaves(self.warmup_draws)[0])[1]
            lines.append(f"  warmup: {kept} draws kept")
        if self.groups:
            lines.append("  groups: " + _listed(sorted(self.groups)))
        if "layout" in a:
            lines.append(f"  layout: {a['layout']}")
        times = [
            f"{k.split('_')[0]} {a[k]:.2f} s" for k in ("compile_time", "sampling_time") if k in a
        ]
        if times:
            lines.append("  " + ", ".join(times))
        lines.append("  (trace.diagnostics for R-hat and ESS; trace.to_arviz() for ArviZ)")
        return "\n".join(lines)

    @property
    def num_chains(self) -> int:
        """Number of chains."""
        import jax

        return int(np.shape(jax.tree.leaves(self.draws)[0])[0])

    @property
    def num_draws(self) -> int:
        """Number of (post-warmup) draws per chain."""
        import jax

        return int(np.shape(jax.tree.leaves(self.draws)[0])[1])

    def to_arviz(
        self,
        coords: dict | None = None,
        dims: dict | None = None,
        *,
        constant_data: dict | None = None,
        posterior_predictive: dict | None = None,
        predictions: dict | None = None,
        predictions_constant_data: dict | None = None,
        prior: dict | None = None,
    ) -> Any:
        """Converts to ArviZ data.

        With arviz < 1 this is an ``az.InferenceData``; with arviz >= 1 an
        ``xarray.DataTree``. Groups: ``posterior`` (the draws), ``sample_stats``,
        ``warmup_posterior``/``warmup_sample_stats`` when warmup was kept, the
        trace's further ``groups`` (``observed_data``, ``log_likelihood``, ...), and the
        groups given here. The draws' groups (``posterior``, ``sample_stats``, their warmup
        twins) hold the run metadata in ``attrs``, with PyMC's ``tuning_steps``; the others
        the library (a PyMC model's ``observed_data``: ``inference_library="pymc"``).

        Args:
            coords: ArviZ coordinates, e.g. ``{"school": names}``; for a numpyro model,
                by plate name. They update the model's own (``Trace.coords``: PyMC coords).
            dims: ArviZ dimensions per variable, e.g. ``{"theta": ["school"]}``; they
                update the model's own (``Trace.dims``: numpyro plate names and
                ``event_dims``), which are the default.
            constant_data: ``{name: array}``, data the model conditions on (ArviZ's
                ``constant_data``).
            posterior_predictive: ``{name: (chain, draw, ...) array}``, e.g. the output
                of ``numpyro.infer.Predictive(model, posterior_samples=trace.draws,
                batch_ndims=2)``.
            predictions: ``{name: (chain, draw, ...) array}``: out-of-sample predictions.
            predictions_constant_data: ``{name: array}``: the data of ``predictions``.
            prior: ``{name: (chain, draw, ...) array}``: prior draws (add a leading
                chain axis of 1 to ``Predictive(model, num_samples=n)`` output).

        Returns:
            ``az.InferenceData`` (arviz < 1) or ``xarray.DataTree`` (arviz >= 1).

        Examples:
            >>> import blackjax, jax, jax.numpy as jnp
            >>> import chainrunner as cr
            >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x["a"] ** 2), 0.8, jnp.ones(3))
            >>> trace = cr.run(nuts, jax.random.key(0), {"a": jnp.zeros((2, 3))}, 20,
            ...                progress=False)
            >>> data = trace.to_arviz(dims={"a": ["dim"]}, coords={"dim": ["x", "y", "z"]})
            >>> list(data.posterior.data_vars)
            ['a']
        """
        from ._arviz import to_arviz

        extra = {
            "constant_data": constant_data,
            "posterior_predictive": posterior_predictive,
            "predictions": predictions,
            "predictions_constant_data": predictions_constant_data,
            "prior": prior,
        }
        return to_arviz(self, coords=coords, dims=dims, extra=extra)


def _listed(names: list[str], most: int = 8) -> str:
    """``names`` joined, the first ``most`` of them and a count of the rest."""
    if not names:
        return "none"
    more = len(names) - most
    return ", ".join(names[:most]) + (f", ... ({more} more)" if more > 0 else "")


def adapted_parameters(trace: Trace) -> dict[str, Any]:
    """The adapted parameters of a run with warmup: step size, inverse mass matrix, ...

    Per chain, with a leading chain axis, where every chain adapts on its own: for
    ``adaptation="window"`` and ``"fisher"`` ``step_size`` ``(chain,)`` and
    ``inverse_mass_matrix`` ``(chain, d)`` (``(chain, d, d)`` for a dense matrix; for
    ``"fisher_low_rank"`` blackjax's ``LowRankInverseMassMatrix`` of arrays); for
    blackjax's per-chain adaptations (``"window_low_rank"``, ``"staged"``,
    ``"pathfinder"``, ``"mclmc"``, ``"adjusted_mclmc"``, a built ``AdaptationAlgorithm``)
    the parameters blackjax's adaptation returned (MCLMC adds ``L``); for numpyro's
    ``NUTS`` and ``HMC`` their adapted ``step_size`` and ``inverse_mass_matrix``
    (numpyro's dict by site names). Shared by all chains, no chain axis, for the
    adaptations across chains: ``pooled=True`` (``"fisher"``, ``"fisher_low_rank"``),
    ``"chees"`` and ``"meads"``. They are the trace's one field
    ``trace.adapted_parameters``, which the front end filled after the run.

    Args:
        trace: a ``cr.Trace``.

    Returns:
        ``{name: numpy array (or a NamedTuple of them)}``.

    Raises:
        ValueError: for a trace of a kernel that adapts nothing.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                         adaptation="window")
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 3)), 10, num_warmup=30,
        ...                progress=False)
        >>> {k: v.shape for k, v in cr.adapted_parameters(trace).items()}
        {'step_size': (4,), 'inverse_mass_matrix': (4, 3)}
    """
    if trace.adapted_parameters is None:
        raise ValueError(
            "adapted_parameters: this trace has no adapted parameters (run a kernel that "
            "adapts: cr.from_blackjax(..., adaptation=...), numpyro's NUTS or HMC, "
            "cr.from_pymc(...), with num_warmup > 0)."
        )
    return trace.adapted_parameters
