"""Why a checkpoint folder belongs to another run, in words: what differs and what to do.

The manifest's config identifies a run (its seed, chains, layout, lengths, the hash of its
compiled program and kernel parameters, its state's shapes). A call whose config differs
is refused; this module says which kind of difference it is, and keeps the raw values
(hashes, shapes) for a second line.
"""

from __future__ import annotations

from typing import Any

#: config keys of the chunk layout (each changes the chunk program too).
LAYOUT = ("num_devices", "chains_per_device", "padded_chains", "batch_size", "chunk_size")
#: config keys of the run's length and what it keeps.
LENGTH = ("num_warmup", "num_samples", "thinning", "first_step", "keep_warmup")
STOPPING = ("until", "until_tail_probs", "superchains")


def diffs(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """The keys whose values differ, the manifest's order then the call's new keys."""
    keys = [*ours, *(k for k in theirs if k not in ours)]
    return [k for k in keys if theirs.get(k) != ours.get(k)]


def _without_chains(state: Any) -> Any:
    """A state description (``[[shape], dtype]`` per leaf) without the leading chain axis."""
    if not isinstance(state, list):
        return state
    return [[list(shape)[1:], dtype] for shape, dtype in state]


def explain(theirs: dict[str, Any], ours: dict[str, Any], keys: list[str]) -> tuple[str, str]:
    """``(what differs, what to do)`` in words, for the differing config ``keys``.

    Examples:
        >>> explain({"num_chains": 8}, {"num_chains": 4}, ["num_chains"])[0]
        'another chain count (8 chains in the checkpoint, 4 in this call)'
    """
    said, todo = [], "Use another checkpoint path, or delete this one to start over"
    if "num_chains" in keys:
        said.append(f"another chain count ({theirs.get('num_chains')} chains in the "
                    f"checkpoint, {ours.get('num_chains')} in this call)")  # fmt: skip
    dims = "state" in keys and _without_chains(theirs.get("state")) != _without_chains(
        ours.get("state")
    )
    if dims:
        said.append("another dimension (the chains' states have other shapes or dtypes)")
    follow = ("chains_per_device", "padded_chains") if "num_chains" in keys else ()
    layout = [k for k in LAYOUT if k in keys and k != "chains_per_device" and k not in follow]
    if layout:
        was = ", ".join(f"{k}={theirs.get(k)!r}" for k in layout)
        said.append(f"another chunk layout (the checkpoint's {was})")
        if len(said) == 1:
            todo = (f"To resume it, call with the checkpoint's layout ({was}; num_devices is "
                    "the mesh's size), or use another path")  # fmt: skip
    for k in ("seed", *LENGTH, *STOPPING):
        if k in keys:
            said.append(f"another {k} ({theirs.get(k)!r} in the checkpoint)")
    if "fingerprint" in keys and not (dims or layout or "num_chains" in keys):
        said.append("another model, log density or kernel (its compiled program or "
                    "parameters differ)")  # fmt: skip
    if "version" in keys:
        said.append("another checkpoint format (an older or newer chainrunner)")
    if not said:
        said = [f"another {k}" for k in keys]
    return "; ".join(said), todo


def details(theirs: dict[str, Any], ours: dict[str, Any], keys: list[str]) -> str:
    """The raw values of the differing keys, short: hashes cut to 12 digits, states to
    their leaf count and first differing leaf."""
    out = []
    for k in keys:
        a, b = theirs.get(k), ours.get(k)
        if k == "state" and isinstance(a, list) and isinstance(b, list):
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            where = (
                f"; first differing leaf {first}: {a[first]} vs {b[first]}"
                if first is not None
                else ""
            )
            out.append(f"state: {len(a)} leaves in the checkpoint, {len(b)} in this call{where}")
        elif k in ("fingerprint",) and isinstance(a, str) and isinstance(b, str):
            out.append(f"{k}: checkpoint {a[:12]}…, this call {b[:12]}…")
        else:
            out.append(f"{k}: checkpoint {a!r}, this call {b!r}")
    return "; ".join(out)
