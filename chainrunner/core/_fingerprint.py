"""What a kernel computes, as a value: the key of the compiled-program caches.

``jax.jit`` caches on the identity of a function, so a new object built from the same
model (``NUTS(model)`` again in a re-run notebook cell, ``blackjax.nuts(logdensity_fn,
...)`` again) compiles again, though it computes the same thing. ``fingerprint(obj)``
describes ``obj`` by what determines its computation instead:

- plain values (numbers, strings, ``None``, tuples, lists, dicts) by value; numpy and JAX
  arrays by shape, dtype and a digest of their bytes (a closed-over array is a constant
  of the compiled program);
- functions, classes and objects defined at the top of a module of an installed library
  (site-packages, the standard library) by where they are defined (``module.qualname``)
  and that library's version;
- the user's own code (``__main__``, a notebook, a project's modules): functions by their
  code (bytecode, constants, names; not the file or line numbers), their defaults, the
  values their closure holds, the values of the globals they read and what they read of
  the user's modules (``cfg.MU``), recursively; classes by their bases and what they
  define; their instances, dataclasses and ``SimpleNamespace`` by their class and
  attributes;
- ``functools.partial`` and bound methods by their parts;
- anything else by identity (``id``): the fingerprint then holds the object, so that no
  other object can take its ``id`` while a cache entry keyed on it lives, and it is not
  ``stable``: it means something in this process only, and ``FingerprintCache`` reuses
  what it built for that very object only.

Two objects with equal fingerprints compute the same thing, as far as their code and the
values they read can tell: a global that a function reads is part of its fingerprint, so
changed data never reuse a program; state hidden in an object of an unknown type is
never looked into (identity). A ``stable`` fingerprint (no identity in it) is the same in
every process running the same code, so it can key a cache on disk (with the versions of
the libraries that define the functions named by their place).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import struct
import sys
import threading
import types
from typing import Any, NamedTuple

import numpy as np

from ._lru import LRU
from ._settings import trace_settings

__all__ = ["Fingerprint", "FingerprintCache", "fingerprint", "stable_digest"]

_PLAIN = (type(None), bool, int, str, bytes, type(Ellipsis))
_MAX_DEPTH = 64


class Fingerprint(NamedTuple):
    """``fingerprint``'s result.

    Attributes:
        key: a hashable value; equal keys, equal computations.
        stable: ``True`` when the key holds no identity: the same in every process.
        keep: the objects the key names by identity (hold them while the key is used).
    """

    key: Any
    stable: bool
    keep: tuple

    def digest(self) -> str:
        """A hex digest of the key (meaningful across processes when ``stable``)."""
        return hashlib.blake2b(repr(self.key).encode(), digest_size=20).hexdigest()


def fingerprint(obj: Any) -> Fingerprint:
    """The fingerprint of ``obj``: what determines the computation it stands for.

    Args:
        obj: a function, a kernel's settings, data: anything.

    Returns:
        A ``Fingerprint``.

    Examples:
        >>> import numpy as np
        >>> def make(scale):
        ...     return lambda x: -0.5 * (x / scale) ** 2
        >>> fingerprint(make(2.0)).key == fingerprint(make(2.0)).key
        True
        >>> fingerprint(make(2.0)).key == fingerprint(make(3.0)).key
        False
        >>> fingerprint(np.zeros(3)).stable
        True
    """
    walk = _Walk()
    key = walk(obj, 0)
    return Fingerprint(key, walk.stable, tuple(walk.keep))


def stable_digest(obj: Any) -> str | None:
    """``fingerprint(obj).digest()`` where the fingerprint is ``stable``, else ``None``.

    Examples:
        >>> stable_digest((1, "a")) == stable_digest((1, "a")), stable_digest(object())
        (True, None)
    """
    found = fingerprint(obj)
    return found.digest() if found.stable else None


class FingerprintCache:
    """A bounded cache keyed on fingerprints: what was built for an equal source is reused.

    ``get(source, build)`` returns the value built earlier for a source with the same
    fingerprint and JAX settings (``trace_settings``: ``jax_enable_x64``, ...), if that
    earlier source still has it: a function whose globals changed since (a notebook
    redefined a helper, a doctest's namespace was cleared) no longer computes what it
    did, and the value is built anew from ``source``. A fingerprint that holds an
    identity (an object whose state is not read) is reused for that very ``source``
    only, since the object may have changed since; unless ``trust_identities``: the
    caller knows that the objects its sources name by identity never change (the ops
    of a PyTensor graph).

    Examples:
        >>> cache = FingerprintCache(4)
        >>> make = lambda scale: (lambda x: x * scale)
        >>> cache.get(make(2.0), lambda: "built") is cache.get(make(2.0), lambda: "again")
        True
    """

    def __init__(self, size: int, *, trust_identities: bool = False):
        self._lru = LRU(size)
        self._lock = threading.RLock()
        self._trust = trust_identities

    def get(self, source: Any, build: Any) -> Any:
        """The value for ``source``'s fingerprint, built with ``build()`` if missing."""
        found = fingerprint(source)
        key = (found.key, trace_settings())
        with self._lock:
            hit, entry = self._lru.lookup(key)
            if hit and (
                entry[0] is source
                or ((found.stable or self._trust) and fingerprint(entry[0]).key == found.key)
            ):
                return entry[1]
            value = build()
            self._lru.put(key, (source, value), keep=found.keep)
            return value


class _Walk:
    """One fingerprint: the objects seen so far (cycles), the identities used."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []
        self.stable = True

    def identity(self, obj: Any) -> tuple:
        self.stable = False
        self.keep.append(obj)
        return ("id", type(obj).__qualname__, id(obj))

    def __call__(self, obj: Any, depth: int) -> Any:
        t = type(obj)
        if t in _PLAIN:
            return obj if t is not bool else ("bool", obj)
        if t is float:
            return ("float", struct.pack("<d", obj).hex())  # 0.0 and -0.0 differ, as do nans
        if t is complex:
            return ("complex", struct.pack("<dd", obj.real, obj.imag).hex())
        if depth > _MAX_DEPTH:
            return self.identity(obj)
        if id(obj) in self.seen:
            return ("cycle", self.seen[id(obj)])
        self.seen[id(obj)] = len(self.seen)  # (every object walked is alive meanwhile)
        return self.compound(obj, t, depth + 1)

    def compound(self, obj: Any, t: type, depth: int) -> Any:
        try:
            array = _array(obj)
        except Exception:  # a tracer, an array of another process: no value to read
            return self.identity(obj)
        if array is not None:
            return array
        if isinstance(obj, enum.Enum):
            return ("enum", self(t, depth), obj.name)
        if t in (tuple, list, set, frozenset):
            items = sorted(obj, key=repr) if t in (set, frozenset) else obj
            return (t.__name__, tuple(self(x, depth) for x in items))
        if isinstance(obj, tuple) and hasattr(t, "_fields"):  # a NamedTuple
            return ("namedtuple", self(t, depth), tuple(self(x, depth) for x in obj))
        if t is dict:
            items = [(self(k, depth), self(v, depth)) for k, v in obj.items()]
            return ("dict", tuple(sorted(items, key=repr)))
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)  # (what a function reads of it: ``function``)
        named = _named_global(obj)
        if named is not None:
            return ("global", *named)
        if isinstance(obj, type) and _users(obj.__module__):
            return self.cls(obj, depth)
        if isinstance(obj, functools.partial):
            return ("partial", self(obj.func, depth), self(obj.args, depth),
                    self(obj.keywords, depth))  # fmt: skip
        if isinstance(obj, types.MethodType):
            return ("method", self(obj.__self__, depth), self(obj.__func__, depth))
        if isinstance(obj, types.FunctionType):
            return self.function(obj, depth)
        if isinstance(obj, types.CodeType):
            return self.code(obj, depth)
        if isinstance(obj, types.BuiltinFunctionType):  # tuple.__new__, [].append, ...
            return ("builtin", self(obj.__self__, depth), obj.__name__)
        if _plain_instance(obj):
            return ("object", self(t, depth), self(dict(vars(obj)), depth))
        return self.identity(obj)

    def cls(self, c: type, depth: int) -> tuple:
        """A class outside the installed libraries, by its bases and what it defines."""
        items = []
        for name, value in vars(c).items():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = (value.fget, value.fset, value.fdel)
            elif isinstance(value, functools.cached_property):
                value = value.func
            elif _dunder(name) and not isinstance(value, types.FunctionType):
                continue  # __dict__, __module__, __doc__, a dataclass's fields, ...
            elif _library_descriptor(value):  # a NamedTuple's fields, ...
                items.append((name, ("descriptor", type(value).__qualname__, repr(value))))
                continue
            items.append((name, self(value, depth)))
        bases = tuple(self(b, depth) for b in c.__bases__)
        return ("class", c.__qualname__, bases, tuple(sorted(items, key=repr)))

    def function(self, fn: types.FunctionType, depth: int) -> tuple:
        cells = tuple(_cell(c) for c in (fn.__closure__ or ()))
        names = sorted(_global_names(fn.__code__))
        scope = fn.__globals__
        read = tuple(
            (name, self(scope[name], depth)) for name in names if name in scope
        )  # a builtin or an unbound name reads nothing of the module
        modules = [scope[n] for n in names if isinstance(scope.get(n), types.ModuleType)]
        modules += [c for c in cells if isinstance(c, types.ModuleType)]
        modules += [sys.modules[n] for n in names if n not in scope and n in sys.modules]
        read += self.module_reads(modules, names, depth)
        return (
            "function",
            self.code(fn.__code__, depth),
            self(fn.__defaults__, depth),
            self(fn.__kwdefaults__, depth),
            tuple(self(c, depth) for c in cells),
            read,
        )

    def module_reads(self, modules: list, names: list[str], depth: int) -> tuple:
        """What a function may read of the modules of the user's own code: the attributes
        its code names (``cfg.MU``, where ``cfg`` is a global or in its closure; ``from cfg
        import MU`` in its body), recursively in their submodules. An installed library's
        module is pinned by its version."""
        out, todo, seen = [], list(modules), set()
        while todo:
            module = todo.pop()
            if module.__name__ in seen or _pinned(module.__name__) is not None:
                continue
            seen.add(module.__name__)
            for name in names:
                if name in vars(module):
                    value = vars(module)[name]
                    if isinstance(value, types.ModuleType):
                        todo.append(value)
                    else:
                        out.append((module.__name__, name, self(value, depth)))
        return tuple(out)

    def code(self, code: types.CodeType, depth: int) -> tuple:
        consts = tuple(
            self.code(c, depth) if isinstance(c, types.CodeType) else self(c, depth)
            for c in code.co_consts
        )
        return (
            "code", code.co_name, code.co_code, consts, code.co_names, code.co_varnames,
            code.co_freevars, code.co_cellvars, code.co_argcount, code.co_kwonlyargcount,
            code.co_posonlyargcount, code.co_flags,
        )  # fmt: skip


_EMPTY = ("empty cell",)


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled (a function defined before its closure)
        return _EMPTY


def _global_names(code: types.CodeType) -> set[str]:
    """The names a code object (and those nested in it) may read as globals."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _array(obj: Any) -> tuple | None:
    """Shape, dtype and a digest of an array's values, or ``None`` if not an array."""
    if isinstance(obj, (np.ndarray, np.generic)):
        data = np.asarray(obj)
    else:
        jax = sys.modules.get("jax")
        if jax is None or not isinstance(obj, jax.Array):
            return None
        if isinstance(obj, getattr(jax.core, "Tracer", ())):
            raise TypeError("fingerprint: a traced value has no fingerprint")
        data = np.asarray(obj)
        weak = bool(getattr(obj, "weak_type", False))
        return ("jax.Array", *array_digest(data), weak)
    if data.dtype == object:
        return None
    return ("array", *array_digest(data))


def array_digest(data: np.ndarray) -> tuple:
    """``(shape, dtype, blake2b of the bytes)`` of a numeric array.

    Examples:
        >>> array_digest(np.zeros(2))[:2]
        ((2,), 'float64')
    """
    data = np.ascontiguousarray(data)
    return (data.shape, str(data.dtype), hashlib.blake2b(data.tobytes()).hexdigest())


def _named_global(obj: Any) -> tuple[str, str, str] | None:
    """``(module, qualname, version)`` where ``obj`` is defined at the top of a module of
    an installed library (site-packages, the standard library): what names it in every
    process with that library's version. The user's own code (``__main__``, a notebook,
    a project's modules) is fingerprinted by what it is, not where."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__":
        return None
    if "<locals>" in qualname or "<lambda>" in qualname:
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        return None
    version = _pinned(module)
    return None if version is None else (module, qualname, version)


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _library_descriptor(value: Any) -> bool:
    """Whether ``value`` is an attribute descriptor of a library's type that its ``repr``
    describes (``collections.namedtuple``'s field getters)."""
    t = type(value)
    if isinstance(value, types.FunctionType) or not hasattr(t, "__get__"):
        return False
    return _pinned(t.__module__) is not None and " at 0x" not in repr(value)


def _plain_instance(obj: Any) -> bool:
    """Whether ``obj``'s state is its ``__dict__``, to be read: a ``SimpleNamespace``, a
    dataclass, or an instance of a class of the user's own code (not a library's, whose
    objects may hold state elsewhere: those go by identity)."""
    t = type(obj)
    if t is types.SimpleNamespace:
        return True
    if not hasattr(obj, "__dict__") or getattr(t, "__slots__", None):
        return False
    return _users(t.__module__) or (
        hasattr(t, "__dataclass_fields__") and _pinned(t.__module__) is not None
    )


def _users(module: Any) -> bool:
    """Whether ``module`` (a name) is of the user's own code: ``__main__``, or a module
    loaded from a file outside the installed libraries (an unknown one is not)."""
    if module == "__main__":
        return True
    found = sys.modules.get(module) if isinstance(module, str) else None
    return bool(getattr(found, "__file__", None)) and _pinned(module) is None


@functools.lru_cache(maxsize=1024)
def _pinned(module: str) -> str | None:
    """What pins the code of an installed ``module``: its distribution's version (the
    Python version for the standard library and built-in modules); ``None`` for a module
    of the user's own code (or ``__main__``), which may change between processes."""
    import sysconfig

    found = sys.modules.get(module)
    spec = getattr(found, "__spec__", None)
    if getattr(spec, "origin", None) in ("built-in", "frozen") or module == "builtins":
        return f"python {sys.version}"
    path = getattr(found, "__file__", None) or ""
    paths = sysconfig.get_paths()
    if any(path.startswith(root) for root in _site_folders()):
        return _distribution_version(module.split(".")[0], path)
    if any(path.startswith(paths[k]) for k in ("stdlib", "platstdlib") if paths[k]):
        return f"python {sys.version}"
    return None


def _site_folders() -> set[str]:
    """The folders libraries are installed in: this environment's, and any other
    ``site-packages`` on ``sys.path`` (added by a ``.pth`` file or ``PYTHONPATH``)."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("purelib", "platlib") if paths.get(k)}
    found |= set(getattr(site, "getsitepackages", list)())
    found |= {p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")}
    return {os.path.join(p, "") for p in found if p}


def _distribution_version(top: str, path: str) -> str:
    """The versions of the distributions that install the package ``top``; where none
    says so, a digest of the module's file."""
    from importlib import metadata

    names = _owners(top)
    versions = []
    for name in names:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    if versions:
        return ", ".join(sorted(set(versions)))  # (a vendored copy on sys.path: once)
    try:
        with open(path, "rb") as f:
            return "file " + hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    except OSError:
        return "unknown"


def _owners(top: str) -> list[str]:
    """The distributions that install the package ``top``: the one of the same name where
    it installs ``top`` (as jax, numpyro, blackjax, numpy do), else ``_distributions``' list.

    ``packages_distributions`` reads every installed distribution's file list (0.1-0.3 s
    in an environment with PyMC): a first call pays that only for a package named unlike
    its distribution (``yaml``, ``PIL``, ...) or one this shortcut cannot vouch for."""
    from importlib import metadata

    try:
        found = metadata.distribution(top)
        name = found.metadata["Name"]
        if name and _normal(name) == _normal(top) and _installs(found, top):
            return [name]
    except Exception:  # not installed under that name, or its metadata unreadable
        pass
    return _distributions().get(top, [])


def _installs(found: Any, top: str) -> bool:
    """Whether the distribution ``found`` installs the top-level package ``top`` (its
    ``top_level.txt``, else its file list)."""
    listed = found.read_text("top_level.txt")
    if listed is not None:
        return top in listed.split()
    return any(f.parts and f.parts[0] in (top, top + ".py") for f in found.files or ())


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


@functools.lru_cache(maxsize=1)
def _distributions() -> dict:
    from importlib import metadata

    return metadata.packages_distributions()
