"""mkdocs hook: nav entries whose page does not exist (yet) are dropped, not broken.

docs/multi-host.md is written alongside the multi-host support; until it exists the
site builds without it (``mkdocs build --strict`` would otherwise fail on the nav).
"""

import logging
import os

log = logging.getLogger("mkdocs.hooks.chainrunner")

OPTIONAL_PAGES = {"multi-host.md", "gpu.md"}


def _prune(items, docs_dir):
    kept = []
    for item in items:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if isinstance(value, list):
                kept.append({title: _prune(value, docs_dir)})
                continue
            missing = not os.path.exists(os.path.join(docs_dir, value))
            if isinstance(value, str) and value in OPTIONAL_PAGES and missing:
                log.info(
                    "nav: %s is not written yet; left out of the nav", value
                )
                continue
        kept.append(item)
    return kept


def _version(root):
    """The package's version, read from its one place without importing jax."""
    scope = {}
    with open(os.path.join(root, "chainrunner", "_version.py")) as f:
        exec(f.read(), scope)  # our own one-line file
    return scope["__version__"]


def on_config(config):
    root = os.path.dirname(os.path.abspath(config.config_file_path))
    config.copyright = f"chainrunner {_version(root)}, Apache-2.0"
    if config.nav:
        config.nav = _prune(config.nav, config.docs_dir)
    return config
