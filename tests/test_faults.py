"""Checkpoint faults: every kind of damage gives the uninterrupted draws or a clear error.

A finished checkpoint (4 chunks) and a half-finished one (2 of 4 chunks: the run was
stopped) are damaged in every way a crash, a full disk or a careless copy can: a file
truncated, scribbled on, emptied, deleted, two files swapped, the manifest emptied or
garbled, a foreign folder. Resuming then either returns exactly the draws of the
uninterrupted run (recomputing what was damaged) or raises a ``ValueError`` that names
the checkpoint and the file; never anything else.
"""

import errno
import json
import os
import shutil
import warnings

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from interrupting import InterruptingBar

import chainrunner as cr
from chainrunner.output import _checkpoint
from chainrunner.output._diagnostics import ChainrunnerWarning
from chainrunner.pipeline import _run

NUTS = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.9, jnp.ones(3))
X0 = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32)
KW = {"chunk_size": 5, "mesh": cr.chain_mesh(2), "progress": False, "warn": False}
ARGS = (NUTS, jax.random.key(11), X0, 20)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """``{"finished": folder, "half": folder}`` and the uninterrupted draws."""
    root = tmp_path_factory.mktemp("pristine")
    full = cr.run(*ARGS, **KW)
    cr.run(*ARGS, checkpoint=root / "finished", **KW)
    real = _run.progress_bar
    _run.progress_bar = lambda *a, **k: InterruptingBar(at=3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ChainrunnerWarning)
            cr.run(*ARGS, checkpoint=root / "half", **KW)
    finally:
        _run.progress_bar = real
    with open(root / "half" / "manifest.json") as f:
        assert len(json.load(f)["chunks"]) == 2
    return {"finished": root / "finished", "half": root / "half"}, full


def _files(folder):
    return sorted(f for f in os.listdir(folder) if not f.startswith("."))


def _damage(folder, name, kind, other=None):
    path = os.path.join(folder, name)
    if kind == "delete":
        os.remove(path)
    elif kind == "empty":
        open(path, "wb").close()
    elif kind == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif kind == "scribble":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size // 3)
            f.write(b"\xde\xad\xbe\xef" * 8)
    elif kind == "garble":
        with open(path, "w") as f:
            f.write("{not json")
    elif kind == "swap":
        tmp = path + ".swap"
        os.replace(path, tmp)
        os.replace(os.path.join(folder, other), path)
        os.replace(tmp, os.path.join(folder, other))


def _resume_checked(folder, full, damaged):
    """Either the uninterrupted draws, or a ValueError naming the folder and the file."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trace = cr.run(*ARGS, checkpoint=folder, **KW)
    except ValueError as e:
        assert str(folder) in str(e) and damaged in str(e), str(e)
        return "error"
    np.testing.assert_array_equal(trace.draws, full.draws)
    for name in full.stats:
        np.testing.assert_array_equal(trace.stats[name], full.stats[name])
    repaired = trace.attrs.get("checkpoint_repaired", [])
    if repaired:
        assert any(issubclass(w.category, ChainrunnerWarning) and damaged in str(w.message)
                   for w in caught), [str(w.message) for w in caught]  # fmt: skip
    return "recomputed" if repaired else "used"


KINDS = ["truncate", "scribble", "delete", "empty"]


@pytest.mark.parametrize("which", ["finished", "half"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("file", ["chunk_000000.nc", "chunk_000001.nc", "last state"])
def test_damaged_file(pristine, tmp_path, which, kind, file):
    folders, full = pristine
    folder = tmp_path / "ckpt"
    shutil.copytree(folders[which], folder)
    if file == "last state":
        file = "state_000003.npz" if which == "finished" else "state_000001.npz"
    _damage(folder, file, kind)
    assert _resume_checked(folder, full, file) == "recomputed"


@pytest.mark.parametrize("which", ["finished", "half"])
def test_swapped_chunk_files(pristine, tmp_path, which):
    folders, full = pristine
    folder = tmp_path / "ckpt"
    shutil.copytree(folders[which], folder)
    _damage(folder, "chunk_000000.nc", "swap", other="chunk_000001.nc")
    assert _resume_checked(folder, full, "chunk_000000.nc") == "recomputed"


@pytest.mark.parametrize("which", ["finished", "half"])
@pytest.mark.parametrize("kind", ["empty", "garble", "truncate", "delete_chunks_key"])
def test_damaged_manifest_is_a_clear_error(pristine, tmp_path, which, kind):
    folders, _ = pristine
    folder = tmp_path / "ckpt"
    shutil.copytree(folders[which], folder)
    if kind == "delete_chunks_key":
        with open(folder / "manifest.json") as f:
            manifest = json.load(f)
        del manifest["chunks"]
        with open(folder / "manifest.json", "w") as f:
            json.dump(manifest, f)
    else:
        _damage(folder, "manifest.json", kind)
    with pytest.raises(ValueError, match=r"manifest.*(cannot be read|not a chainrunner)") as e:
        cr.run(*ARGS, checkpoint=folder, **KW)
    assert str(folder) in str(e.value) and "manifest.json" in str(e.value)


def test_deleted_manifest_is_a_foreign_folder(pristine, tmp_path):
    folders, _ = pristine
    folder = tmp_path / "ckpt"
    shutil.copytree(folders["finished"], folder)
    os.remove(folder / "manifest.json")
    with pytest.raises(ValueError, match=r"has no manifest\.json"):
        cr.run(*ARGS, checkpoint=folder, **KW)


def test_foreign_folder_and_file(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ValueError, match=r"photos.*has no manifest\.json"):
        cr.run(*ARGS, checkpoint=tmp_path / "photos", **KW)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; expected a folder"):
        cr.run(*ARGS, checkpoint=tmp_path / "file", **KW)


def test_checkpoint_of_another_run_is_refused(pristine, tmp_path):
    folders, _ = pristine
    folder = tmp_path / "ckpt"
    shutil.copytree(folders["finished"], folder)
    with pytest.raises(ValueError, match="belongs to another run"):
        cr.run(NUTS, jax.random.key(12), X0, 20, checkpoint=folder, **KW)


FILES = [
    "chunk_000000.nc", "chunk_000001.nc", "chunk_000002.nc", "chunk_000003.nc",
    "state_000000.npz", "state_000001.npz", "state_000002.npz", "state_000003.npz",
]  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.sampled_from(["finished", "half"]),
    damages=st.lists(
        st.tuples(st.sampled_from(FILES), st.sampled_from([*KINDS, "swap"])),
        min_size=1,
        max_size=3,
    ),
)
# Found by hypothesis: the only state file left after a delete has no sibling to swap with.
@example(which="half", damages=[("state_000000.npz", "delete"), ("state_000001.npz", "truncate")])
def test_any_damage_gives_the_uninterrupted_draws_or_a_clear_error(
    pristine, tmp_path_factory, which, damages
):
    folders, full = pristine
    folder = tmp_path_factory.mktemp("ckpt") / "c"
    shutil.copytree(folders[which], folder)
    present = set(_files(folder))
    for name, kind in damages:
        if name not in present:
            continue
        siblings = [f for f in sorted(present) if f != name and f[:5] == name[:5]]
        if kind == "swap" and not siblings:
            continue  # no file of its kind is left to swap it with
        _damage(folder, name, kind, siblings[0] if siblings else None)
        if kind == "delete":
            present.discard(name)
    outcome = _resume_checked(folder, full, "")
    assert outcome in ("used", "recomputed", "error")


# -- disk faults while a run writes --------------------------------------------------------


def test_failed_write_stops_the_run_and_keeps_what_was_committed(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    full = cr.run(*ARGS, **KW)
    real = _checkpoint._write_npz
    calls = []

    def full_disk(tmp, state):
        calls.append(tmp)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tmp, state)

    monkeypatch.setattr(_checkpoint, "_write_npz", full_disk)
    with pytest.raises(OSError, match=r"checkpoint=.*ckpt.*writing chunk 2.*No space") as e:
        cr.run(*ARGS, checkpoint=folder, **KW)
    assert "2 chunk(s) committed before it are intact" in str(e.value)
    monkeypatch.undo()
    assert not [f for f in os.listdir(folder) if f.startswith(".tmp-")]  # nothing half-written
    trace = cr.run(*ARGS, checkpoint=folder, **KW)
    assert trace.attrs["resumed_from_draw"] == 10
    np.testing.assert_array_equal(trace.draws, full.draws)


def test_folder_removed_mid_run_is_a_clear_error(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    real = _checkpoint._write_nc
    calls = []

    def remove_folder(tmp, groups):
        calls.append(tmp)
        if len(calls) == 2:
            shutil.rmtree(folder)
        real(tmp, groups)

    monkeypatch.setattr(_checkpoint, "_write_nc", remove_folder)
    with pytest.raises(OSError, match=r"checkpoint=.*ckpt.*writing chunk 1"):
        cr.run(*ARGS, checkpoint=folder, **KW)


# -- every attr survives netCDF --------------------------------------------------------------


def _round_trip(trace, tmp_path):
    import arviz as az

    data = trace.to_arviz()
    os.makedirs(tmp_path, exist_ok=True)
    path = str(tmp_path / "trace.nc")
    data.to_netcdf(path)
    if int(az.__version__.split(".")[0]) >= 1:
        import xarray as xr

        back = xr.open_datatree(path)
        attrs = back["posterior"].attrs
    else:
        back = az.from_netcdf(path)
        attrs = back.posterior.attrs
    for key, value in trace.attrs.items():
        got = attrs[key]
        expected = int(value) if isinstance(value, bool) else value
        if isinstance(expected, (list, tuple)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
        elif isinstance(expected, float):
            assert float(got) == pytest.approx(expected), key
        else:
            assert got == expected, key


def test_interrupted_resumed_and_cross_chain_runs_save_to_netcdf(tmp_path, monkeypatch):
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: InterruptingBar(at=2))
    with pytest.warns(ChainrunnerWarning, match="interrupted"):
        part = cr.run(*ARGS, checkpoint=tmp_path / "c", **KW)
    monkeypatch.undo()
    assert part.attrs["interrupted"] is True
    _round_trip(part, tmp_path / "a")
    resumed = cr.run(*ARGS, checkpoint=tmp_path / "c", **KW)
    assert resumed.attrs["resumed_from_draw"] == 5
    _round_trip(resumed, tmp_path / "b")
    meads = cr.from_blackjax(
        blackjax.ghmc, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2), adaptation="meads"
    )
    adapted = cr.run(meads, jax.random.key(0), jnp.tile(X0, (2, 1)), 10, num_warmup=10, **KW)
    assert "adapted_momentum_inverse_scale" in adapted.attrs
    _round_trip(adapted, tmp_path / "c2")
