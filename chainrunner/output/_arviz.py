"""Trace -> ``az.InferenceData`` (arviz < 1) or ``xarray.DataTree`` (arviz >= 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._naming import flat_dict

if TYPE_CHECKING:
    from ._trace import Trace


def _attrs(trace: Trace) -> dict[str, Any]:
    out = {}
    for k, v in trace.attrs.items():
        if v is None:
            continue
        if isinstance(v, (tuple, list)):
            v = list(v)
        elif isinstance(v, (bool, np.bool_)):
            v = int(v)  # netCDF has no boolean attributes: 1 / 0 survive to_netcdf
        out[k] = v
    return out


def arviz_major() -> int:
    import arviz as az

    return int(az.__version__.split(".")[0])


def _groups(trace: Trace, extra: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """Every group of the ArviZ data: the trace's, then those the caller adds."""
    groups = {"posterior": flat_dict(trace.draws), "sample_stats": dict(trace.stats)}
    if trace.warmup_draws is not None:
        groups["warmup_posterior"] = flat_dict(trace.warmup_draws)
        groups["warmup_sample_stats"] = dict(trace.warmup_stats or {})
    for group, values in trace.groups.items():
        groups[group] = {k: np.asarray(v) for k, v in values.items()}
    for group, values in extra.items():
        if values is None:
            continue
        if not isinstance(values, dict):
            raise TypeError(
                f"to_arviz: {group} must be a dict {{name: array}}, got {type(values).__name__}."
            )
        groups[group] = {k: np.asarray(v) for k, v in values.items()}
    return groups


def to_arviz(
    trace: Trace,
    coords: dict | None = None,
    dims: dict | None = None,
    extra: dict[str, Any] | None = None,
) -> Any:
    """See ``Trace.to_arviz``."""
    import arviz as az

    groups = _groups(trace, extra or {})
    dims = {**trace.dims, **(dims or {})} or None
    coords = {**trace.coords, **(coords or {})} or None
    attrs = _attrs(trace)
    save_warmup = trace.warmup_draws is not None
    if arviz_major() >= 1:
        data = az.from_dict(groups, coords=coords, dims=dims, save_warmup=save_warmup)
        nodes = [data[name] for name in data.children]
    else:
        data = az.from_dict(**groups, coords=coords, dims=dims, save_warmup=save_warmup)
        nodes = [getattr(data, name) for name in data.groups()]
    for node in nodes:  # the run's metadata on every group, as ArviZ's own converters do
        node.attrs.update(attrs)
    return data
