"""Sessions: tests (3.11 with arviz 0.x, 3.12 with arviz 1.x), lint, docs, demo, bench."""

import os

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"
# Under CI=true a missing interpreter fails the run instead of being skipped.
nox.options.error_on_missing_interpreters = os.environ.get("CI") == "true"


@nox.session(python=["3.11", "3.12"])
def tests(session: nox.Session) -> None:
    """The test suite, with doctests of the package (8 simulated CPU devices)."""
    session.install("-e", ".[test,pymc]")
    session.run("python", "-c", "import arviz; print('arviz', arviz.__version__)")
    session.run(
        "pytest",
        "tests",
        "chainrunner",
        "--doctest-modules",
        "-p",
        "no:cacheprovider",
        # Tests are mostly XLA compilation, one core each: one worker per core.
        "-n",
        "auto",
        # Idle workers take queued tests from busy ones: no tail of long tests on one.
        "--dist",
        "worksteal",
        *session.posargs,
        env={"JAX_NUM_CPU_DEVICES": "8"},
    )


@nox.session(python="3.11")
def quick(session: nox.Session) -> None:
    """The fast loop: the suite without the tests marked slow (tests/conftest.py), 3.11."""
    session.install("-e", ".[test,pymc]")
    session.run(
        "pytest", "tests", "-m", "not slow", "-p", "no:cacheprovider", "-n", "auto",
        "--dist", "worksteal", *session.posargs, env={"JAX_NUM_CPU_DEVICES": "8"},
    )  # fmt: skip


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff format --check and ruff check."""
    session.install("ruff")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Builds the documentation site into site/ with mkdocs --strict (no warnings allowed).

    The pictures in docs/images/ are committed, so the build never samples; first the
    plotting code of the pages runs (``docs/gen_images.py --check``: the ```py blocks,
    which tests/test_docs.py does not run); after the build, ``docs/check_browser.py``
    reads every page in headless Chromium (``apt install chromium``). Regenerate the pictures with
    ``python docs/gen_images.py`` (arviz < 1, matplotlib, rich) after changing a page.
    """
    session.install("-e", ".[docs,pymc]")  # the PyMC pages run their code
    session.run("python", "docs/gen_images.py", "--check")
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    # Every page read in a browser at 1280 and 390 px (Debian's chromium package).
    session.install("playwright")
    session.run("python", "docs/check_browser.py", "site")


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """Samples the built-in eight-schools model on 8 simulated CPU devices."""
    session.install("-e", ".")
    session.run("python", "-m", "chainrunner", *session.posargs)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """The benchmark suite, then the other benchmark scripts in benchmarks/.

    ``bench_suite.py`` writes ``benchmarks/results/suite.json`` and the suite's table in
    ``docs/benchmarks.md`` (about an hour on 2 CPU cores), ``bench_overhead.py``
    ``overhead.json`` and the row-by-row overhead table (about 35 minutes);
    ``nox -s bench -- --quick`` is a smoke run of every script that leaves the docs alone.
    """
    session.install("-e", ".")
    quick = "--quick" in session.posargs
    # The suite and the row-by-row overhead write their tables into docs/benchmarks.md
    # (not on a smoke run); the suite takes the session's arguments (--gpu, --reps, ...).
    suite = os.path.join("benchmarks", "bench_suite.py")
    overhead = os.path.join("benchmarks", "bench_overhead.py")
    session.run("python", suite, *session.posargs, *([] if quick else ["--write-docs"]))
    session.run("python", overhead, "--quick" if quick else "--write-docs")
    for script in sorted(os.listdir("benchmarks")):
        path = os.path.join("benchmarks", script)
        if script.startswith("bench_") and script.endswith(".py") and path not in (suite, overhead):
            session.run("python", path, *(["--quick"] if quick else []))
