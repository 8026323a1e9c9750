"""Test setup: 8 simulated CPU devices, asked for before JAX starts."""

import fnmatch
import os
import sys
import tempfile
import zlib

import jax

# Before any JAX computation: the backend fixes its device count when it starts.
jax.config.update("jax_num_cpu_devices", 8)

# chainrunner keeps compiled programs on disk (programs/_store.py): each test process
# (each xdist worker) gets a folder of its own, empty at the start, so that no test sees
# programs of an earlier session; the subprocesses a test starts share their parent's.
os.environ["CHAINRUNNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="chainrunner-tests-")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "data", "posteriordb")


@pytest.fixture(scope="session", autouse=True)
def _eight_devices():
    assert len(jax.devices()) == 8, "tests expect 8 simulated CPU devices"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# Scripts the tests run in subprocesses (multi-host; a run killed in its warmup), not test
# modules (they would run on import under --doctest-modules).
collect_ignore = ["multihost_worker.py", "warmup_run.py"]


# CI runs the suite twice (Python 3.11: jax 0.10, arviz 0.x; Python 3.12: jax 0.12,
# arviz 1.x) and must stay under 45 minutes on 2 cores. Every test whose result can
# depend on JAX (layouts, bitwise equality across devices and widths, chain_map, the
# properties, warmup, ensembles, the compilation cache, batch_size="auto") runs under
# both, and so does everything about ArviZ, PyMC, diagnostics and checkpoints. Only
# tests of pages, examples and multi-process plumbing, whose subject is not the JAX
# version, and the posteriordb references (each mode under one version; what each mode
# computes is compared bitwise or to rounding under both) run under one of the two
# (patterns of node ids, fnmatch); the skip says where.
ONLY_ON = {
    (3, 12): [
        "test_multihost.py::*",
        "test_forget.py::*",
        "test_pmap_recipe.py::*",
        "test_posteriordb.py::*-until]",
        "test_docs.py::*[[]tutorial-pymc.md]",
        "test_docs.py::*[[]tutorial-eight-schools.md]",
        "test_long_runs.py::test_sigkill_then_resume_equals_uninterrupted",
        "test_docs.py::*[[]README.md]",
        "test_docs.py::*[[]pymc.md]",
    ],
    # (jax 0.10 compiles a program in about 0.8 of jax 0.12's time: the pages whose
    # subject is chainrunner's JAX API run here; those of PyMC and ArviZ under 3.12)
    (3, 11): [
        "test_examples.py::*",
        "test_numpyro_data.py::*",
        "test_docs.py::*[[]numpyro.md]",
        "test_docs.py::*[[]migrating-from-pmap.md]",
        "test_docs.py::*[[]batches.md]",
        "test_docs.py::*[[]compilation.md]",
        "test_docs.py::*[[]mesh.md]",
        "test_docs.py::*[[]gpu.md]",
        "test_docs.py::*[[]multi-host.md]",
        "test_docs.py::*[[]warmup.md]",
        "test_docs.py::*[[]ensembles.md]",
        "test_docs.py::*[[]reproducibility.md]",
        "test_posteriordb.py::*-fixed]",
        "test_posteriordb.py::*-fisher]",
        "test_posteriordb.py::*-machine]",  # jax 0.10: where "auto" takes the machine
        "test_docs.py::*[[]batch-size.md]",
        "test_docs.py::*[[]chain-map.md]",
        "test_docs.py::*[[]contributing.md]",
        "test_docs.py::*[[]long-runs.md]",
        "test_docs.py::*[[]more-chains-than-devices.md]",
        "test_docs.py::*[[]quickstart.md]",
        "test_docs.py::*[[]how-many-draws.md]",
    ],
}


# Variants of one check that CI divides between the two Pythons (CI time): the test runs
# under both, each of its parameters (another model, mesh or step size of the same check)
# under one: by the parity of its parameters' indices, even under 3.11, odd under 3.12.
# Checks whose subject can change with the JAX version as a whole (bitwise across device
# counts and widths, ensembles, the cross-chain warmups, the caches, each adaptation's
# sampler) are not divided. The docstring examples are divided too, by a hash of their
# name (``_divided_under``). ``CHAINRUNNER_TESTS_UNDIVIDED=1`` runs everything divided
# under either Python.
DIVIDED = [
    "test_nuts_fsm.py::test_the_quorum_changes_when_ends_run_not_the_draws",
    "test_nuts_fsm.py::test_a_chunk_is_blackjaxs_draw_for_draw",
    "test_nuts_fsm.py::test_run_vmaps_the_machine_with_blackjaxs_draws",
    "test_nuts_fsm.py::test_an_adapted_chunk_is_the_kernels_own_step",
    "test_fisher.py::test_samples_a_correlated_gaussian",
    "test_fisher_pooled.py::test_pooled_samples_a_correlated_gaussian",
    "test_pymc.py::test_posterior_means_match_pm_sample",
    "test_adaptations.py::test_matches_blackjax_own_run_per_chain",
    "test_adaptations.py::test_the_mclmc_tuners_steps_are_blackjaxs_passes",
    # blackjax's one-call warmups in chunks (their cut: test_split.py, under both)
    "test_warmup_chunks.py::test_a_one_call_warmup_in_chunks",
    # the eleven adaptations' kill and resume, and the in-loop three's bar and Ctrl-C: each
    # under one (the chunked warmups' Ctrl-C and resume, bitwise, run under both)
    "test_warmup_chunks.py::test_sigkill_in_the_warmup_then_resume_equals_uninterrupted",
    "test_warmup_chunks.py::test_an_in_loop_warmup_moves_the_bar_and_ctrl_c_keeps_it",
]
DIVIDED_AMONG = ((3, 11), (3, 12))


# The fast loop (``nox -s quick``: ``-m "not slow"``, Python 3.11) leaves these out: the
# pages' code, statistical checks against references and other samplers (PyMC, numpyro's
# MCMC, posteriordb), the warmups, ensembles, bitwise fixtures and properties, several
# processes, and single tests of 10 s or more on 2 cores. CI runs everything.
SLOW = [
    "test_docs.py::test_page_code_runs*",
    "test_examples.py::*",
    "test_multihost.py::*",
    "test_posteriordb.py::*",
    "test_numpyro_data.py::*",
    "test_pmap_recipe.py::*",
    "test_pymc.py::*",
    "test_arviz_numpyro.py::*",
    "test_ensemble.py::*",
    "test_cross_chain_sharded.py::*",
    "test_warmup.py::*",
    "test_warmup_chunks.py::*",
    "test_bitwise.py::*",
    "test_properties.py::*",
    "test_run.py::test_same_batch_width_is_bitwise_across_device_counts",
    "test_long_runs.py::test_sigkill_then_resume_equals_uninterrupted",
    "test_long_runs.py::test_a_quiet_chunk_keeps_a_devices_outputs_within_its_bytes",
    "test_numpyro.py::test_draws_do_not_depend_on_the_device_count",
]


def _divided_under(item) -> tuple | None:
    """The Python a divided parameter or docstring example runs under, or ``None`` (not
    divided). The examples (``--doctest-modules``), like the pages, by a hash of their
    name: each under one Python (the functions they show are tested under both)."""
    if os.environ.get("CHAINRUNNER_TESTS_UNDIVIDED") == "1":
        return None
    if isinstance(item, pytest.DoctestItem):
        return DIVIDED_AMONG[zlib.crc32(item.name.encode()) % len(DIVIDED_AMONG)]
    name = item.nodeid.split("/")[-1].split("[")[0]
    spec = getattr(item, "callspec", None)
    if name not in DIVIDED or spec is None:
        return None
    # One index per parametrize mark (a mark of several names gives each the same index).
    firsts = []
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0]
        firsts.append(names.split(",")[0].strip() if isinstance(names, str) else names[0])
    return DIVIDED_AMONG[sum(spec.indices[n] for n in firsts) % len(DIVIDED_AMONG)]


def pytest_collection_modifyitems(config, items):
    here = sys.version_info[:2]
    # A docstring example of another Python is deselected (a skip marker on a doctest of a
    # module's docstring breaks pytest's report: it has no line number).
    doctests = [i for i in items if isinstance(i, pytest.DoctestItem)]
    other = [i for i in doctests if _divided_under(i) not in (None, here)]
    if other:
        left_out = set(other)
        items[:] = [i for i in items if i not in left_out]
        config.hook.pytest_deselected(items=other)
    for item in items:
        under = _divided_under(item)
        if under is not None and under != here:
            where = ".".join(map(str, under))
            item.add_marker(
                pytest.mark.skip(reason=f"divided: runs under Python {where} (CI time)")
            )
        name = item.nodeid.split("/")[-1]
        if any(fnmatch.fnmatchcase(name, p) for p in SLOW):
            item.add_marker(pytest.mark.slow)
        for version, patterns in ONLY_ON.items():
            if version != here and any(fnmatch.fnmatchcase(name, p) for p in patterns):
                where = ".".join(map(str, version))
                item.add_marker(
                    pytest.mark.skip(reason=f"runs under Python {where} only (CI time)")
                )
