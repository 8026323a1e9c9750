"""Checkpoints: a folder of atomically written netCDF chunk files and a manifest.

Layout of ``PATH/``:

- ``manifest.json``: what the run is (fingerprint of the compiled program, seed,
  layout, lengths, state structure) and which chunks are complete, each with the size
  and CRC-32 of its files. It is replaced atomically (write to a temporary file,
  ``os.replace``) after a chunk's files are in place, so it is the commit point:
  anything it does not list is ignored.
- ``chunk_000000.nc`` ...: the draws and stats of one chunk, a netCDF-4 file (via
  h5netcdf) with ArviZ groups (``posterior``, ``sample_stats``, and the ``warmup_``
  ones), each ``(chain, draw, ...)``. Each opens on its own with ``arviz.from_netcdf``
  (arviz < 1) or ``xarray.open_datatree`` (arviz >= 1).
- ``state_000000.npz`` ...: the kernel state after each chunk (what a resume needs).
- ``warmup_manifest.json``, ``warmup_chunk_000000.nc``, ``warmup_state_000000.npz`` ...:
  the same for the chunks of a cross-chain warmup (ChEES, MEADS, pooled Fisher), which
  runs before the sampling loop's chunks: their draws in the ``warmup_`` groups, and
  after each chunk the warmup's whole state (the chains' states, the adaptation's, the
  parameters adapted so far), a phase of its own (``WARMUP``).

Every file is verified against the manifest before anything of it is used: a chunk that
is missing, truncated or altered (or whose state is) is never read. A resume keeps the
longest intact prefix of chunks whose last state is intact (recomputing the rest gives
the uninterrupted run's draws, bitwise), drops the others from the manifest, and says so.
A manifest that cannot be read is an error naming the folder and the file.

With several JAX processes (``jax.distributed``) process 0 alone writes the folder,
holding every chain (the draws and the state are gathered first); every process
reads it on a resume, so it must be on a filesystem that all of them see.

netCDF because it is what ArviZ itself reads and writes, and one file per chunk,
renamed into place, cannot be left half-written by a crash; appending to one growing
file (netCDF or zarr) can.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from typing import Any

import jax
import numpy as np

from ..core._naming import flat_dict
from ..core._threads import Background
from ..layout import _distributed
from . import _mismatch

VERSION = 2
WARMUP = "warmup_"
"""The file prefix of a cross-chain warmup's checkpoint (``Checkpoint(prefix=WARMUP)``)."""
GROUPS = ("posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats")
_BLOCK = 1 << 23  # 8 MiB reads for the checksums


def checksum(path: str) -> dict[str, int]:
    """``{"size": bytes, "crc32": CRC-32}`` of a file (about 1 s per GB on one core)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return {"size": size, "crc32": crc}


def damage(path: str, record: dict[str, int]) -> str | None:
    """What is wrong with ``path`` against its ``record``, or ``None`` if it is intact."""
    if not os.path.isfile(path):
        return "missing"
    found = checksum(path)
    if found["size"] != record.get("size"):
        return f"{found['size']} bytes instead of {record.get('size')} (truncated or extended)"
    if found["crc32"] != record.get("crc32"):
        return "altered (its checksum differs from the manifest's)"
    return None


def _atomic_write(path: str, write) -> dict[str, int]:
    """Writes ``path`` through a temporary file renamed into place; returns its checksum."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        record = checksum(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return record


def manifest_text(version: int, config: dict, chunks: list[dict]) -> str:
    """The manifest as JSON, one chunk a line. Written after every chunk, and it grows
    with the run: JSON's C encoder (no ``indent``) for each part. An indented dump is
    pure Python and took about 4 times as long (53 ms a write at 4,000 chunks).

    Examples:
        >>> import json
        >>> text = manifest_text(1, {"seed": [0, 1]}, [{"end": 5}, {"end": 10}])
        >>> print(text)
        {"version": 1,
         "config": {"seed": [0, 1]},
         "chunks": [
          {"end": 5},
          {"end": 10}
         ]}
        >>> json.loads(text)["chunks"][1]
        {'end': 10}
    """
    lines = ",\n  ".join(json.dumps(chunk) for chunk in chunks)
    body = f"\n  {lines}\n " if chunks else ""
    return (f'{{"version": {json.dumps(version)},\n "config": {json.dumps(config)},\n'
            f' "chunks": [{body}]}}')  # fmt: skip


def fingerprint(program: str, params: Any) -> str:
    """A hash of the chunk program (its text's digest) and of the kernel's parameter values."""
    h = hashlib.sha256(program.encode())
    for leaf in jax.tree.leaves(params):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def describe_state(state: Any) -> list:
    """Shapes and dtypes of the state's leaves (for the manifest and checks)."""
    return [[list(np.shape(x)), str(x.dtype)] for x in jax.tree.leaves(state)]


def _write_nc(tmp: str, groups: dict[str, tuple[int, dict]]) -> None:
    # h5netcdf directly (netCDF-4 groups, as xarray writes them): a third of the time of
    # Dataset.to_netcdf, which matters when sampling uses every core.
    import h5netcdf

    with h5netcdf.File(tmp, "w") as f:
        for group, (offset, values) in groups.items():
            chains, width = np.shape(next(iter(values.values())))[:2]
            g = f.create_group(group)
            g.dimensions = {"chain": chains, "draw": width}
            g.create_variable("chain", ("chain",), data=np.arange(chains))
            g.create_variable("draw", ("draw",), data=np.arange(offset, offset + width))
            for name, v in values.items():
                v = np.asarray(v)
                extra = tuple(f"{name}_dim_{i}" for i in range(v.ndim - 2))
                for dim, size in zip(extra, v.shape[2:], strict=True):
                    g.dimensions[dim] = size
                if v.dtype == bool:  # netCDF has no bool: xarray's int8 convention
                    var = g.create_variable(name, ("chain", "draw", *extra), data=v.view(np.int8))
                    var.attrs["dtype"] = "bool"
                else:
                    g.create_variable(name, ("chain", "draw", *extra), data=v)


def _write_npz(tmp: str, state: Any) -> None:
    leaves = {}
    for i, x in enumerate(jax.tree.leaves(state)):
        if _is_key(x):
            leaves[f"key{i}"] = np.asarray(jax.random.key_data(x))
        else:
            leaves[f"leaf{i}"] = np.asarray(x)
    with open(tmp, "wb") as f:
        np.savez(f, **leaves)


def _is_warmup(name: str) -> bool:
    """Whether a file of a checkpoint folder belongs to its cross-chain warmup."""
    return name.startswith(WARMUP) or (name.startswith(".tmp-") and WARMUP in name)


class Checkpoint:
    """One run's checkpoint folder (or its cross-chain warmup's files, ``prefix=WARMUP``).

    Attributes:
        path: the folder.
        config: what identifies the run (compared with the manifest's).
        prefix: the prefix of this phase's file names (``""``: the sampling loop's).
        chunks: the intact, committed chunks (after ``open``), in order.
        repaired: ``[(file, what is wrong)]`` found by ``open``; those chunks and the
            ones after them were dropped and are computed again.
    """

    def __init__(self, path: str | os.PathLike, config: dict[str, Any], prefix: str = ""):
        self.path = os.fspath(path)
        self.config = config
        self.prefix = prefix
        self.manifest_path = os.path.join(self.path, f"{prefix}manifest.json")
        self.chunks: list[dict[str, Any]] = []
        self.repaired: list[tuple[str, str]] = []
        self._job: Background | None = None

    def _error(self, what: str, todo: str) -> ValueError:
        return ValueError(f"run: checkpoint={self.path!r}: {what}. {todo}")

    # -- opening -------------------------------------------------------------------
    def _read_manifest(self) -> dict[str, Any]:
        """The manifest, or a clear error when it cannot be read or is malformed."""
        todo = (
            "Without it the chunk files cannot be trusted: delete the folder to start over, "
            "or restore manifest.json from a backup."
        )
        try:
            with open(self.manifest_path) as f:
                manifest = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            what = f"its manifest {self.manifest_path!r} cannot be read ({e})"
            raise self._error(what, todo) from e
        entry_keys = {"start", "end", "file", "state", "groups", "checks"}
        ok = (
            isinstance(manifest, dict)
            and isinstance(manifest.get("config"), dict)
            and isinstance(manifest.get("chunks"), list)
            and all(isinstance(c, dict) and entry_keys <= set(c) for c in manifest["chunks"])
        )
        if not ok:
            raise self._error(f"its manifest {self.manifest_path!r} is not a chainrunner "
                              f"manifest of version {VERSION}", todo)  # fmt: skip
        return manifest

    def open(self, create: bool = True) -> None:
        """Checks an existing manifest against this run's config and its files, or creates it.

        ``create=False`` only checks and loads (with several processes every process does
        that first; then process 0 alone calls ``create``).
        """
        if os.path.exists(self.manifest_path):
            manifest = self._read_manifest()
            self._check_same_run(manifest)
            self.chunks = self._intact(manifest["chunks"])
            if create and self.repaired:
                self._write_manifest()  # the damaged chunks are no longer committed
            return
        if os.path.isfile(self.path):
            raise ValueError(f"run: checkpoint={self.path!r} is a file; expected a folder.")
        if os.path.exists(self.path) and self._own_files():
            raise ValueError(
                f"run: checkpoint={self.path!r} exists, is not empty and has no "
                f"{self.prefix}manifest.json; expected a chainrunner checkpoint folder or a "
                "new path."
            )
        if create:
            self.create()

    def _own_files(self) -> list[str]:
        """The folder's files of this phase (the other phase's are not its business; a
        temporary file left by a crash belongs to the phase it was written for)."""
        mine = self.prefix == WARMUP
        return [f for f in os.listdir(self.path) if _is_warmup(f) == mine]

    def _check_same_run(self, manifest: dict[str, Any]) -> None:
        """A ``ValueError`` saying in words how the manifest's run differs from this call's,
        with the raw values (hashes, shapes) on a second line."""
        theirs = {**manifest["config"], "version": manifest.get("version")}
        ours = {**self.config, "version": VERSION}
        keys = _mismatch.diffs(theirs, ours)
        if keys:
            what, todo = _mismatch.explain(theirs, ours, keys)
            raise ValueError(
                f"run: checkpoint={self.path!r} belongs to another run; left untouched: it "
                f"was written with {what}. {todo}.\n"
                f"  In detail: {_mismatch.details(theirs, ours, keys)}."
            )

    def _intact(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The longest prefix of ``chunks`` whose files and last state are intact."""
        keep = len(chunks)
        for i, chunk in enumerate(chunks):
            problem = damage(os.path.join(self.path, chunk["file"]), chunk["checks"]["file"])
            if problem:
                self.repaired.append((chunk["file"], problem))
                keep = i
                break
        while keep > 0:  # the state after the last kept chunk must be intact too
            chunk = chunks[keep - 1]
            problem = damage(os.path.join(self.path, chunk["state"]), chunk["checks"]["state"])
            if problem is None:
                break
            self.repaired.append((chunk["state"], problem))
            keep -= 1
        return chunks[:keep]

    def create(self) -> None:
        """Creates the folder and writes the manifest (dropping chunks found damaged)."""
        os.makedirs(self.path, exist_ok=True)
        if os.path.exists(self.manifest_path) and not self.repaired:
            return
        self._write_manifest()

    @property
    def draws_done(self) -> int:
        return self.chunks[-1]["end"] if self.chunks else 0

    # -- writing -------------------------------------------------------------------
    def _write_manifest(self) -> None:
        text = manifest_text(VERSION, self.config, self.chunks)

        def write(tmp):
            with open(tmp, "w") as f:
                f.write(text)

        _atomic_write(self.manifest_path, write)

    def write_chunk(
        self, start: int, end: int, groups: dict[str, tuple[int, dict]], state: Any
    ) -> None:
        """Writes one chunk (draws ``start:end`` of the run) and the state after it.

        ``groups`` maps an ArviZ group to ``(first draw index in that group, {name: array})``.
        A failed write (no space, no permission, the folder gone) raises an ``OSError``
        naming the folder; the chunks committed before it stay valid.
        """
        index = len(self.chunks)
        nc, npz = f"{self.prefix}chunk_{index:06d}.nc", f"{self.prefix}state_{index:06d}.npz"
        groups = {g: v for g, v in groups.items() if v[1]}
        try:
            checks = {
                "file": _atomic_write(os.path.join(self.path, nc), lambda t: _write_nc(t, groups)),
                "state": _atomic_write(
                    os.path.join(self.path, npz), lambda t: _write_npz(t, state)
                ),
            }
            entry = {"start": start, "end": end, "file": nc, "state": npz,
                     "groups": sorted(groups), "checks": checks}  # fmt: skip
            self.chunks.append(entry)
            try:
                self._write_manifest()  # the commit point
            except BaseException:
                self.chunks.pop()
                raise
        except OSError as e:
            raise OSError(
                f"run: checkpoint={self.path!r}: writing chunk {index} (draws {start}..{end - 1}) "
                f"failed: {e}. The {index} chunk(s) committed before it are intact: fix the "
                "folder (space, permissions), then run the same call again to resume."
            ) from e

    def write_chunk_async(
        self, start: int, end: int, groups: dict[str, tuple[int, dict]], state: Any
    ) -> None:
        """``write_chunk`` on a writer thread, while the devices run the next chunk.

        At most one write is in flight: this waits for the previous one (and re-raises
        its error) first, so chunks are committed in order.
        """
        self.flush()
        self._job = Background(
            lambda: self.write_chunk(start, end, groups, state), "chainrunner-checkpoint"
        )

    def flush(self) -> None:
        """Waits for the write in flight, if any (re-raising its error).

        A Ctrl-C while waiting leaves the write registered, so that the next ``flush``
        waits for it again (it is never forgotten, nor its error).
        """
        job = self._job
        if job is None:
            return
        try:
            job.result()
        except KeyboardInterrupt:
            raise
        except BaseException:
            self._job = None
            raise
        self._job = None

    # -- reading -------------------------------------------------------------------
    def read_chunks(self) -> list[dict[str, tuple[int, dict[str, np.ndarray]]]]:
        """``{group: (first draw index, {name: array})}`` for every intact chunk."""
        import xarray as xr

        out = []
        for chunk in self.chunks:
            file = os.path.join(self.path, chunk["file"])
            groups = {}
            try:
                for group in chunk["groups"]:
                    with xr.open_dataset(file, group=group, engine="h5netcdf") as ds:
                        values = {k: ds[k].values for k in ds.data_vars}
                        groups[group] = (int(ds["draw"].values[0]), values)
            except (OSError, KeyError, ValueError) as e:
                raise self._error(
                    f"chunk file {file!r} passed its checksum but cannot be read ({e})",
                    "Delete the folder to start over.",
                ) from e
            out.append(groups)
        return out

    def read_state(self, like: Any) -> Any:
        """The state after the last intact chunk, with the structure of ``like``."""
        leaves, treedef = jax.tree.flatten(like)
        file = os.path.join(self.path, self.chunks[-1]["state"])
        try:
            with np.load(file) as f:
                new = []
                for i, x in enumerate(leaves):
                    if _is_key(x):
                        impl = jax.random.key_impl(x)
                        new.append(jax.random.wrap_key_data(f[f"key{i}"], impl=impl))
                    else:
                        new.append(f[f"leaf{i}"])
        except (OSError, KeyError, ValueError) as e:
            raise self._error(
                f"state file {file!r} passed its checksum but cannot be read ({e})",
                "Delete the folder to start over.",
            ) from e
        return jax.tree.unflatten(treedef, new)


def written_without_warmup(path: str) -> bool:
    """Whether ``path`` holds a sampling checkpoint but no warmup files: a run without a
    cross-chain warmup, or one written before its warmup had a checkpoint."""
    has = os.path.exists
    return has(os.path.join(path, "manifest.json")) and not has(
        os.path.join(path, f"{WARMUP}manifest.json")
    )


def open_for_run(path: str, config: dict[str, Any], prefix: str = "") -> Checkpoint:
    """Opens (or creates) a run's checkpoint folder, checking it belongs to this run
    (``prefix=WARMUP``: its cross-chain warmup's files).

    Every process checks and reads the folder (it must be visible to all of them); only
    process 0 creates and writes it, once all have looked.
    """
    ckpt = Checkpoint(path, config, prefix)
    multi = _distributed.is_multiprocess()
    ckpt.open(create=not multi)
    if multi:
        _distributed.barrier("chainrunner-checkpoint-checked")
        if _distributed.is_main_process():
            ckpt.create()
    return ckpt


def restore(ckpt: Checkpoint, sinks: dict[str, Any], like: Any) -> int:
    """Writes the checkpoint's chunks into ``sinks`` (``{"posterior": sink, ...}``).

    ``like`` is one chunk's ``(draws, stats)`` structure. Returns the draws done.
    """
    names = list(flat_dict(like[0]))
    treedef = jax.tree.structure(like[0])
    for chunk in ckpt.read_chunks():
        for group, sink in sinks.items():
            if group in chunk and sink is not None:
                at, values = chunk[group]
                _, stats = chunk.get(group.replace("posterior", "sample_stats"), (at, {}))
                draws = jax.tree.unflatten(treedef, [values[k] for k in names])
                width = np.shape(values[names[0]])[1]
                sink.write((draws, stats), at, slice(0, width))
    if not _distributed.all_equal(ckpt.draws_done):
        raise ValueError(
            f"run: checkpoint={ckpt.path!r} looks different from the JAX processes (they "
            "found different numbers of finished draws): with several processes the folder "
            "must be on a filesystem that every process sees."
        )
    return ckpt.draws_done
