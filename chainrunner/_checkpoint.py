"""Checkpoints: a folder of atomically written netCDF chunk files and a manifest.

Layout of ``PATH/``:

- ``manifest.json``: what the run is (fingerprint of the compiled program, seed,
  layout, lengths, state structure) and which chunks are complete. It is replaced
  atomically (write to a temporary file, ``os.replace``) after a chunk's files are
  in place, so it is the commit point: anything it does not list is ignored.
- ``chunk_000000.nc`` ...: the draws and stats of one chunk, a netCDF-4 file (via
  xarray and h5netcdf) with ArviZ groups (``posterior``, ``sample_stats``, and the
  ``warmup_`` ones), each ``(chain, draw, ...)``. Each opens on its own with
  ``arviz.from_netcdf`` (arviz < 1) or ``xarray.open_datatree`` (arviz >= 1).
- ``state_000000.npz``: the kernel state after that chunk (what a resume needs).

With several JAX processes (``jax.distributed``) process 0 alone writes the folder,
holding every chain (the draws and the state are gathered first); every process
reads it on a resume, so it must be on a filesystem that all of them see.

netCDF via xarray because it is what ArviZ itself reads and writes, and one file per
chunk, renamed into place, cannot be left half-written by a crash; appending to one
growing file (netCDF or zarr) can.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

import jax
import numpy as np

VERSION = 1


def _atomic_write(path: str, write) -> None:
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def fingerprint(program_text: str, params: Any) -> str:
    """A hash of the compiled chunk program and of the kernel's parameter values."""
    h = hashlib.sha256(program_text.encode())
    for leaf in jax.tree.leaves(params):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def describe_state(state: Any) -> list:
    """Shapes and dtypes of the state's leaves (for the manifest and checks)."""
    return [[list(np.shape(x)), str(x.dtype)] for x in jax.tree.leaves(state)]


class Checkpoint:
    """One run's checkpoint folder."""

    def __init__(self, path: str | os.PathLike, config: dict[str, Any]):
        self.path = os.fspath(path)
        self.config = config
        self.manifest_path = os.path.join(self.path, "manifest.json")
        self.chunks: list[dict[str, Any]] = []
        self._executor: Any = None
        self._future: Any = None

    # -- opening -------------------------------------------------------------------
    def open(self, create: bool = True) -> None:
        """Checks an existing manifest against this run's config, or creates the folder.

        ``create=False`` only checks and loads (with several processes every process
        does that first; then process 0 alone calls ``create``).
        """
        if os.path.exists(self.manifest_path):
            with open(self.manifest_path) as f:
                manifest = json.load(f)
            theirs = manifest.get("config", {})
            diffs = [
                f"{k}: checkpoint has {theirs.get(k)!r}, this call {v!r}"
                for k, v in self.config.items()
                if theirs.get(k) != v
            ]
            if diffs:
                raise ValueError(
                    f"run: checkpoint={self.path!r} belongs to another run; left untouched. "
                    + "; ".join(diffs)
                    + ". Use another path, or delete this one to start over."
                )
            self.chunks = manifest["chunks"]
            return
        if os.path.exists(self.path) and os.listdir(self.path):
            raise ValueError(
                f"run: checkpoint={self.path!r} exists, is not empty and has no manifest.json; "
                "expected a chainrunner checkpoint folder or a new path."
            )
        if create:
            self.create()

    def create(self) -> None:
        """Creates the folder and an empty manifest, unless the manifest exists."""
        if os.path.exists(self.manifest_path):
            return
        os.makedirs(self.path, exist_ok=True)
        self._write_manifest()

    @property
    def draws_done(self) -> int:
        return self.chunks[-1]["end"] if self.chunks else 0

    # -- writing -------------------------------------------------------------------
    def _write_manifest(self) -> None:
        manifest = {"version": VERSION, "config": self.config, "chunks": self.chunks}

        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(manifest, f, indent=1)

        _atomic_write(self.manifest_path, write)

    def write_chunk(
        self, start: int, end: int, groups: dict[str, tuple[int, dict]], state: Any
    ) -> None:
        """Writes one chunk (draws ``start:end`` of the run) and the state after it.

        ``groups`` maps an ArviZ group to ``(first draw index in that group, {name: array})``.
        """

        index = len(self.chunks)
        nc = f"chunk_{index:06d}.nc"
        npz = f"state_{index:06d}.npz"

        def write_nc(tmp):
            # h5netcdf directly (netCDF-4 groups, as xarray writes them): a third of the
            # time of Dataset.to_netcdf, which matters when sampling uses every core.
            import h5netcdf

            with h5netcdf.File(tmp, "w") as f:
                for group, (offset, values) in groups.items():
                    if not values:
                        continue
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
                            var = g.create_variable(
                                name, ("chain", "draw", *extra), data=v.view(np.int8)
                            )
                            var.attrs["dtype"] = "bool"
                        else:
                            g.create_variable(name, ("chain", "draw", *extra), data=v)

        def write_npz(tmp):
            leaves = {}
            for i, x in enumerate(jax.tree.leaves(state)):
                if _is_key(x):
                    leaves[f"key{i}"] = np.asarray(jax.random.key_data(x))
                else:
                    leaves[f"leaf{i}"] = np.asarray(x)
            with open(tmp, "wb") as f:
                np.savez(f, **leaves)

        _atomic_write(os.path.join(self.path, nc), write_nc)
        _atomic_write(os.path.join(self.path, npz), write_npz)
        previous = self.chunks[-1]["state"] if self.chunks else None
        self.chunks.append({"start": start, "end": end, "file": nc, "state": npz})
        self._write_manifest()  # the commit point
        if previous is not None:
            os.remove(os.path.join(self.path, previous))

    def write_chunk_async(
        self, start: int, end: int, groups: dict[str, tuple[int, dict]], state: Any
    ) -> None:
        """``write_chunk`` on a writer thread, while the devices run the next chunk.

        At most one write is in flight: this waits for the previous one (and re-raises
        its error) first, so chunks are committed in order.
        """
        from concurrent.futures import ThreadPoolExecutor

        self.flush(shutdown=False)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="chainrunner-checkpoint")
        self._future = self._executor.submit(self.write_chunk, start, end, groups, state)

    def flush(self, shutdown: bool = True) -> None:
        """Waits for the write in flight, if any (re-raising its error)."""
        future, self._future = self._future, None
        try:
            if future is not None:
                future.result()
        finally:
            if shutdown and self._executor is not None:
                self._executor.shutdown()
                self._executor = None

    # -- reading -------------------------------------------------------------------
    def read_chunks(self) -> list[dict[str, tuple[int, dict[str, np.ndarray]]]]:
        """``{group: (first draw index, {name: array})}`` for every complete chunk."""
        import xarray as xr

        out = []
        for chunk in self.chunks:
            file = os.path.join(self.path, chunk["file"])
            groups = {}
            for group in ("posterior", "sample_stats", "warmup_posterior", "warmup_sample_stats"):
                try:
                    with xr.open_dataset(file, group=group, engine="h5netcdf") as ds:
                        values = {k: ds[k].values for k in ds.data_vars}
                        groups[group] = (int(ds["draw"].values[0]), values)
                except OSError:
                    continue
            out.append(groups)
        return out

    def read_state(self, like: Any) -> Any:
        """The state after the last complete chunk, with the structure of ``like``."""
        leaves, treedef = jax.tree.flatten(like)
        with np.load(os.path.join(self.path, self.chunks[-1]["state"])) as f:
            new = []
            for i, x in enumerate(leaves):
                if _is_key(x):
                    new.append(jax.random.wrap_key_data(f[f"key{i}"], impl=jax.random.key_impl(x)))
                else:
                    new.append(f[f"leaf{i}"])
        return jax.tree.unflatten(treedef, new)
