"""Trace -> ``az.InferenceData`` (arviz < 1) or ``xarray.DataTree`` (arviz >= 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

if TYPE_CHECKING:
    from ._trace import Trace


def _name(path: tuple) -> str:
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        else:
            parts.append(str(entry))
    name = ".".join(parts)
    if not name:
        return "x"
    return f"x{name}" if name[0].isdigit() else name


def flat_dict(tree: Any) -> dict[str, np.ndarray]:
    """A pytree of arrays as ``{name: array}``; a bare array is named ``x``."""
    if tree is None:
        return {}
    return {_name(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _attrs(trace: Trace) -> dict[str, Any]:
    out = {}
    for k, v in trace.attrs.items():
        if v is None:
            continue
        if isinstance(v, (tuple, list)):
            v = list(v)
        out[k] = v
    return out


def arviz_major() -> int:
    import arviz as az

    return int(az.__version__.split(".")[0])


def to_arviz(trace: Trace, coords: dict | None = None, dims: dict | None = None) -> Any:
    """See ``Trace.to_arviz``."""
    import arviz as az

    groups = {"posterior": flat_dict(trace.draws), "sample_stats": dict(trace.stats)}
    if trace.warmup_draws is not None:
        groups["warmup_posterior"] = flat_dict(trace.warmup_draws)
        groups["warmup_sample_stats"] = dict(trace.warmup_stats or {})
    for group, values in trace.groups.items():
        groups[group] = {k: np.asarray(v) for k, v in values.items()}
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
