"""The code blocks in docs/ and the README run as written (each page in its own process)."""

import os
import re
import subprocess
import sys

import pytest

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs")
PAGES = [*sorted(f for f in os.listdir(DOCS) if f.endswith(".md")), "README.md"]


def path_of(page):
    return os.path.join(DOCS, "..", page) if page == "README.md" else os.path.join(DOCS, page)


def python_blocks(page):
    with open(path_of(page)) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_page_code_runs(page):
    code = "\n".join(python_blocks(page))
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
