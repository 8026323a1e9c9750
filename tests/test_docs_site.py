"""The documentation site builds with ``mkdocs build --strict``: no warnings, and every
link between pages, to a heading and to an image resolves.

The build needs mkdocs-material and mkdocstrings (``pip install -e .[docs]``); the
``tests`` nox session does not install them, so there this test skips, and
``nox -s docs`` is the build that must pass.
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = os.path.join(ROOT, "docs")
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def missing():
    for name in NEEDED:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:
            return name
    return None


def build(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(missing() is not None, reason=f"the docs build needs {missing()} (.[docs])")
def test_site_builds_strict(tmp_path):
    out = build(tmp_path / "site")
    assert out.returncode == 0, out.stderr[-5000:]
    assert "WARNING" not in out.stderr, out.stderr[-5000:]
    for page in ("index.html", "tutorial-eight-schools/index.html", "api/index.html"):
        assert os.path.exists(tmp_path / "site" / page), page
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("chainrunner.run", "chainrunner.chain_map", "chainrunner.Trace"):
        assert f'id="{name}"' in api, name


def test_every_picture_exists():
    """Every image a page embeds is committed under docs/images (no sampling at build)."""
    for page in sorted(f for f in os.listdir(DOCS) if f.endswith(".md")):
        with open(os.path.join(DOCS, page)) as f:
            for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", f.read()):
                assert os.path.exists(os.path.join(DOCS, target)), f"{page}: {target}"


def test_image_generator_knows_every_plot():
    """docs/gen_images.py names one picture per ```py (plotting) block of its pages."""
    spec = importlib.util.spec_from_file_location("gen_images", os.path.join(DOCS, "gen_images.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for page, names in gen.FIGURES.items():
        assert len(gen.blocks(page, "py")) == len(names), page
        for name in names:
            assert os.path.exists(os.path.join(DOCS, "images", name)), name
