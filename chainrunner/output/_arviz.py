"""Trace -> ``az.InferenceData`` (arviz < 1) or ``xarray.DataTree`` (arviz >= 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._naming import flat_dict

if TYPE_CHECKING:
    from ._trace import Trace


#: the groups of the run's draws: they carry the run's attrs, as PyMC's and ArviZ's do.
RUN_GROUPS = ("posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats")
LIBRARY = ("inference_library", "inference_library_version")


def _attrs(trace: Trace) -> dict[str, Any]:
    """The run's attrs for its draws' groups, with PyMC's ``tuning_steps`` (the warmup's
    steps, burn-in added)."""
    out = {}
    warmup = trace.attrs.get("num_warmup")
    if warmup is not None:
        out["tuning_steps"] = int(warmup) + int(trace.attrs.get("burn_in_steps") or 0)
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
        nodes = [(name, data[name]) for name in data.children]
    else:
        data = az.from_dict(**groups, coords=coords, dims=dims, save_warmup=save_warmup)
        nodes = [(name, getattr(data, name)) for name in data.groups()]
    for name, node in nodes:
        node.attrs.update(group_attrs(trace, name, attrs))
    return data


def group_attrs(trace: Trace, group: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """What a group carries besides ArviZ's own ``created_at`` and ``arviz_version``, as
    ``pm.sample`` writes it: the run's attrs on the draws' groups; the library elsewhere,
    the model's (``pymc``) on the groups its front end made (``observed_data``, ...)."""
    if group in RUN_GROUPS:
        return attrs
    library = {k: attrs[k] for k in LIBRARY if k in attrs}
    model = trace.attrs.get("modeling_interface")
    if group in trace.groups and model:
        version = trace.attrs.get("modeling_interface_version", "unknown")
        library = {"inference_library": model, "inference_library_version": version}
    return library
