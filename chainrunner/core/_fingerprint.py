"""What a kernel computes, as a value: the key of the compiled-program caches.

``jax.jit`` caches on the identity of a function, so a new object built from the same
model (``NUTS(model)`` again in a re-run notebook cell, ``blackjax.nuts(logdensity_fn,
...)`` again) compiles again, though it computes the same thing. ``fingerprint(obj)``
describes ``obj`` by what determines its computation instead:

- plain values (numbers, strings, ``None``, tuples, lists, dicts) by value; numpy and JAX
  arrays by shape, dtype and a digest of their bytes (a closed-over array is a constant
  of the compiled program);
- modules by name; functions, classes and objects defined at the top of an importable
  module by where they are defined (``module.qualname``);
- other functions (closures, lambdas, functions of ``__main__`` or a notebook) by their
  code (bytecode, constants, names; not the file or line numbers), their defaults, the
  values their closure holds and the values of the globals they read, recursively;
- ``functools.partial`` and bound methods by their parts;
- anything else by identity (``id``): the fingerprint then holds the object, so that no
  other object can take its ``id`` while a cache entry keyed on it lives, and it is not
  ``stable``: it means something in this process only.

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
import sys
import threading
import types
from typing import Any, NamedTuple

import numpy as np

from ._lru import LRU

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

    from ._lru import LRU
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
    fingerprint, if that earlier source still has it: a function whose globals changed
    since (a notebook redefined a helper, a doctest's namespace was cleared) no longer
    computes what it did, and the value is built anew from ``source``.

    Examples:
        >>> cache = FingerprintCache(4)
        >>> make = lambda scale: (lambda x: x * scale)
        >>> cache.get(make(2.0), lambda: "built") is cache.get(make(2.0), lambda: "again")
        True
    """

    def __init__(self, size: int):
        self._lru = LRU(size)
        self._lock = threading.RLock()

    def get(self, source: Any, build: Any) -> Any:
        """The value for ``source``'s fingerprint, built with ``build()`` if missing."""
        found = fingerprint(source)
        with self._lock:
            hit, entry = self._lru.lookup(found.key)
            if hit and (entry[0] is source or fingerprint(entry[0]).key == found.key):
                return entry[1]
            value = build()
            self._lru.put(found.key, (source, value), keep=found.keep)
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
        if t is float or t is complex:
            return (t.__name__, repr(obj))  # 0.0 and -0.0 differ, as do nan payloads
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
            return ("module", obj.__name__)
        named = _named_global(obj)
        if named is not None:
            return ("global", *named)
        if isinstance(obj, functools.partial):
            return ("partial", self(obj.func, depth), self(obj.args, depth),
                    self(obj.keywords, depth))  # fmt: skip
        if isinstance(obj, types.MethodType):
            return ("method", self(obj.__self__, depth), self(obj.__func__, depth))
        if isinstance(obj, types.FunctionType):
            return self.function(obj, depth)
        if isinstance(obj, types.CodeType):
            return self.code(obj, depth)
        return self.identity(obj)

    def function(self, fn: types.FunctionType, depth: int) -> tuple:
        cells = tuple(_cell(c) for c in (fn.__closure__ or ()))
        names = sorted(_global_names(fn.__code__))
        scope = fn.__globals__
        read = tuple(
            (name, self(scope[name], depth)) for name in names if name in scope
        )  # a builtin or an unbound name reads nothing of the module
        return (
            "function",
            self.code(fn.__code__, depth),
            self(fn.__defaults__, depth),
            self(fn.__kwdefaults__, depth),
            tuple(self(c, depth) for c in cells),
            read,
        )

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
        return ("jax.Array", *_digest(data), weak)
    if data.dtype == object:
        return None
    return ("array", *_digest(data))


def _digest(data: np.ndarray) -> tuple:
    data = np.ascontiguousarray(data)
    return (data.shape, str(data.dtype), hashlib.blake2b(data.tobytes()).hexdigest())


def _named_global(obj: Any) -> tuple[str, str] | None:
    """``(module, qualname)`` where ``obj`` is defined at the top of an importable module
    (not ``__main__``): what names it in every process. For code outside the installed
    libraries, the caller adds the code itself (``fingerprint`` does for functions)."""
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
    if isinstance(obj, types.FunctionType) and not _installed(module):
        return None  # a user's own module: fingerprinted by its code, not its place
    return module, qualname


@functools.lru_cache(maxsize=1024)
def _installed(module: str) -> bool:
    """Whether ``module`` comes from an installed library (site-packages), whose code
    is pinned by its version; a user's own module may change between processes."""
    import sysconfig

    path = getattr(sys.modules.get(module), "__file__", None) or ""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return any(path.startswith(root) for root in roots if root)
