"""The ``plan`` stage of ``run``: every option checked, eager, before any JAX work.

Every check raises ``TypeError`` or ``ValueError`` naming the function, the argument,
the value and what was expected, before anything is traced or compiled.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from ..core._checks import check_batch_size, check_bool, check_int, check_key, check_mesh
from ..stopping._until import check_forgotten, check_until

DEFAULT_CHUNK_SIZE = 250
"""Draws per compiled call when ``chunk_size=None`` (fewer if the run is shorter)."""

ON_BAD_INIT = ("raise", "warn", "reinit")


def check_keep(keep: Any) -> Any:
    """``None``, a function, or a tuple of site names."""
    if keep is None or callable(keep):
        return keep
    if isinstance(keep, str):
        keep = (keep,)
    if isinstance(keep, (list, tuple)) and keep and all(isinstance(k, str) for k in keep):
        return tuple(keep)
    raise TypeError(
        "run: keep must be None, a site name, a list of names, or a function "
        f"(state, info) -> pytree, got {keep!r}."
    )


def check_init(on_bad_init: Any, init_jitter: Any) -> None:
    if on_bad_init not in ON_BAD_INIT:
        raise ValueError(f"run: on_bad_init must be one of {ON_BAD_INIT}, got {on_bad_init!r}.")
    if not callable(init_jitter) and (
        isinstance(init_jitter, bool)
        or not isinstance(init_jitter, (int, float))
        or not np.isfinite(init_jitter)
        or init_jitter <= 0
    ):
        raise ValueError(
            f"run: init_jitter must be a positive number or a function, got {init_jitter!r}."
        )


def check_checkpoint(checkpoint: Any) -> str | None:
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(
            f"run: checkpoint must be a folder path (str or os.PathLike), got {checkpoint!r}."
        )
    return None if checkpoint is None else os.fspath(checkpoint)


class Plan(NamedTuple):
    """``run``'s options, checked (the output of ``plan``)."""

    rng_key: jax.Array
    num_samples: int
    num_warmup: int
    num_chains: int | None
    thinning: int
    mesh: Mesh | None
    batch_size: int | str | None
    chunk_size: int | None
    progress: bool | None
    keep_warmup: bool
    keep: Any
    checkpoint: str | None
    monitor: bool
    warn: bool
    on_bad_init: str
    init_jitter: float | Callable
    until: Any = None
    superchains: int | None = None
    warmup_until: Any = None


def plan(rng_key: Any, num_samples: Any, **options: Any) -> Plan:
    """Checks every option of ``run`` (not the kernel or the initial position) -> ``Plan``."""
    where = "run"
    num_samples = check_int("num_samples", num_samples, minimum=1, where=where)
    num_warmup = check_int("num_warmup", options["num_warmup"], minimum=0, where=where)
    thinning = check_int("thinning", options["thinning"], minimum=1, where=where)
    for name, value in (("num_samples", num_samples), ("num_warmup", num_warmup)):
        if value % thinning:
            raise ValueError(
                f"run: {name}={value} is not a multiple of thinning={thinning}; "
                "draws are kept every `thinning` steps."
            )
    num_chains, chunk_size, mesh = options["num_chains"], options["chunk_size"], options["mesh"]
    progress = options["progress"]
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"run: progress must be None, True or False, got {progress!r}.")
    for name in ("keep_warmup", "monitor", "warn"):
        check_bool(name, options[name], where)
    check_init(options["on_bad_init"], options["init_jitter"])
    superchains = options.get("superchains")
    if superchains is not None:
        superchains = check_int("superchains", superchains, minimum=2, where=where)
    warmup_until = check_forgotten(options.get("warmup_until"))
    if warmup_until is not None and superchains is None:
        raise ValueError(
            "run: warmup_until needs superchains (nested R-hat compares the chains of "
            "superchains started from one point each); pass superchains=K."
        )
    if warmup_until is not None and options["checkpoint"] is not None:
        raise ValueError(
            "run: warmup_until does not work with checkpoint= yet (the warmup's length is "
            "decided during the run); pass one or the other."
        )
    return Plan(
        rng_key=check_key(rng_key, where),
        num_samples=num_samples,
        num_warmup=num_warmup,
        num_chains=None
        if num_chains is None
        else check_int("num_chains", num_chains, minimum=1, where=where),
        thinning=thinning,
        mesh=None if mesh is None else check_mesh(mesh, where),
        batch_size=check_batch_size(options["batch_size"], where),
        chunk_size=None
        if chunk_size is None
        else check_int("chunk_size", chunk_size, minimum=1, where=where),
        progress=progress,
        keep_warmup=options["keep_warmup"],
        keep=check_keep(options["keep"]),
        checkpoint=check_checkpoint(options["checkpoint"]),
        monitor=options["monitor"],
        warn=options["warn"],
        on_bad_init=options["on_bad_init"],
        init_jitter=options["init_jitter"],
        until=check_until(options.get("until")),
        superchains=superchains,
        warmup_until=warmup_until,
    )
