"""The house: folders by concern, each importing only the folders below it (issue 32).

Read from the source (no import of chainrunner), so a layering mistake fails here with
the module and the import named, before any other test runs into an import circle.
"""

import ast
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "chainrunner"

LAYERS = ("core", "stopping", "layout", "output", "programs", "adapters", "pipeline", "")
"""Lowest first. A module may import its own folder and the folders before it; ``""`` is
the package's top (``__init__``, ``_demo``), which may import anything. ``_version``
sits with ``core``."""

OWN = {"_version": "core"}

# Import names that are not their distribution's name.
DISTRIBUTION = {"yaml": "pyyaml", "arviz_base": "arviz-base", "arviz_stats": "arviz-stats"}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def layer(module: str) -> int:
    parts = module.split(".")[1:]  # drop "chainrunner"
    if not parts:
        return LAYERS.index("")
    if (PACKAGE / parts[0]).is_dir():
        return LAYERS.index(parts[0])
    return LAYERS.index(OWN.get(parts[0], ""))


def imports(module: str, path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, lazy ones included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return found


def own_target(name: str, known: dict) -> str | None:
    """The chainrunner module ``name`` (``pkg.mod.attr`` or ``pkg.mod``) refers to."""
    while name.startswith("chainrunner"):
        if name in known:
            return name
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return None


def test_every_module_sits_in_a_named_folder():
    top = ("__main__", "_demo", "_version")
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", *top)]
    assert not loose, f"modules outside a folder: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS) - {""}, folders


def test_no_folder_imports_a_folder_above_it():
    known = modules()
    wrong = []
    for module, path in known.items():
        for line, name in imports(module, path):
            target = own_target(name, known)
            if target is not None and layer(target) > layer(module):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "imports of a higher layer:\n" + "\n".join(wrong)


def test_the_layering_check_catches_an_upward_import(tmp_path):
    known = {"chainrunner.core._kernel": None, "chainrunner.pipeline._run": None}
    path = tmp_path / "_kernel.py"
    path.write_text("from ..pipeline._run import run\n")
    (_, name), = imports("chainrunner.core._kernel", path)  # fmt: skip
    target = own_target(name, known)
    assert target == "chainrunner.pipeline._run"
    assert layer(target) > layer("chainrunner.core._kernel")


def test_no_private_jax_imports():
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in modules().items()
        for line, name in imports(module, path)
        if name.startswith("jax._src")
    ]
    assert not found, found


def declared() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(meta["dependencies"])
    for extra in meta.get("optional-dependencies", {}).values():
        specs += extra
    names = set()
    for spec in specs:
        name = spec.split(";")[0].strip()
        for stop in "[<>=!~ ":
            name = name.split(stop)[0]
        names.add(name.lower().replace("_", "-"))
    return names


def test_every_third_party_import_is_declared():
    have = declared()
    missing = set()
    for module, path in modules().items():
        for _, name in imports(module, path):
            top = name.split(".")[0]
            if top == "chainrunner" or top in sys.stdlib_module_names or top == "__future__":
                continue
            dist = DISTRIBUTION.get(top, top).lower().replace("_", "-")
            if dist not in have:
                missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
