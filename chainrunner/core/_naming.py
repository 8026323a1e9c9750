"""Names: the one table of sample-stat names, and how draws are named as variables.

Sample stats use ArviZ's names (as arviz-base's numpyro converter): whatever a sampler
calls a statistic, chainrunner stores it under the name on the right of ``STAT_NAMES``.
Draws are a pytree; each leaf becomes one ArviZ variable, named by its path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# sampler field -> ArviZ name.
STAT_NAMES: Mapping[str, str] = {
    # blackjax
    "is_divergent": "diverging",
    "acceptance_rate": "acceptance_rate",
    "energy": "energy",
    "num_integration_steps": "n_steps",
    "num_trajectory_expansions": "tree_depth",
    "step_size": "step_size",
    # numpyro
    "diverging": "diverging",
    "accept_prob": "acceptance_rate",
    "num_steps": "n_steps",
    "tree_depth": "tree_depth",
    "n_steps": "n_steps",
    "lp": "lp",
}


def _scalar(value: Any) -> bool:
    return value is not None and jnp.ndim(value) == 0


def info_stats(info: Any) -> dict[str, jax.Array]:
    """The scalar fields of a sampler's ``info`` (NamedTuple or dict) in ArviZ names."""
    fields = (
        info._asdict() if hasattr(info, "_asdict") else (info if isinstance(info, Mapping) else {})
    )
    stats = {}
    for field, value in fields.items():
        name = STAT_NAMES.get(field)
        if name is not None and name not in stats and _scalar(value):
            stats[name] = value
    return stats


def tree_depth(num_steps: jax.Array) -> jax.Array:
    """``floor(log2(num_steps)) + 1`` (0 for 0 steps), as ArviZ derives it for NUTS."""
    n = jnp.asarray(num_steps).astype(jnp.uint32)
    return jnp.where(n > 0, 32 - jax.lax.clz(n), 0).astype(jnp.int32)


def numpyro_stats(
    state: Any, algo: str | None, max_tree_depth: int | None = None
) -> dict[str, jax.Array]:
    """The stats of a numpyro sampler state (``HMCState`` and the like) in ArviZ names.

    ``lp`` is the negated ``potential_energy``; NUTS gets ``tree_depth`` from
    ``num_steps`` and, given its ``max_tree_depth``, ``reached_max_tree_depth`` (as
    ArviZ 1.x's numpyro converter); ``step_size`` comes from the adaptation state.
    """
    fields = state._asdict() if hasattr(state, "_asdict") else {}
    stats = {}
    if _scalar(fields.get("potential_energy")):
        stats["lp"] = -fields["potential_energy"]
    for field in ("diverging", "accept_prob", "num_steps", "energy"):
        if _scalar(fields.get(field)):
            stats[STAT_NAMES.get(field, field)] = fields[field]
    if algo == "NUTS" and "num_steps" in fields:
        stats["tree_depth"] = tree_depth(fields["num_steps"])
        if max_tree_depth is not None:
            stats["reached_max_tree_depth"] = stats["tree_depth"] >= max_tree_depth
    step_size = getattr(fields.get("adapt_state"), "step_size", None)
    if _scalar(step_size):
        stats["step_size"] = step_size
    return stats


def warmup_stats(info: Any, step_size: Any) -> dict[str, Any]:
    """The stats of blackjax's cross-chain warmup info, ``(chain, draw)`` each."""
    return {
        "lp": info.state.logdensity.T,
        "acceptance_rate": info.info.acceptance_rate.T,
        "diverging": info.info.is_divergent.T,
        "step_size": step_size,
    }


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
    """A pytree of arrays as ``{variable name: array}``; a bare array is named ``x``.

    Examples:
        >>> import numpy as np
        >>> sorted(flat_dict({"a": np.zeros(2), "b": (np.ones(1), np.ones(1))}))
        ['a', 'b.0', 'b.1']
        >>> list(flat_dict(np.zeros(3)))
        ['x']
    """
    if tree is None:
        return {}
    return {_name(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
