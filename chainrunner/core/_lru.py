"""One bounded, thread-safe cache: executables, draw shapes, placed values."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


def _same(a: Any, b: Any) -> bool:
    """Identity, element by element for tuples (an owner may be several objects)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
    return a is b


class LRU:
    """A least-recently-used map of at most ``size`` entries, safe across threads.

    ``get(key, build)`` returns the cached value or builds it (under the lock, so two
    threads never build the same entry twice). With ``owner=obj`` (an object, or a tuple
    of objects) the entry is returned only to a lookup with that very object: a key made
    of ``id``s, reused by a new object after the old one died, never returns the old value.

    Examples:
        >>> cache = LRU(2)
        >>> cache.get("a", lambda: 1), cache.get("b", lambda: 2), cache.get("a", lambda: 9)
        (1, 2, 1)
        >>> _ = cache.get("c", lambda: 3)  # "b" was least recently used: dropped
        >>> "b" in cache, len(cache)
        (False, 2)
    """

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.RLock()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Drops every entry."""
        with self._lock:
            self._items.clear()

    def discard(self, key: Hashable) -> None:
        """Drops ``key``'s entry, if there is one."""
        with self._lock:
            self._items.pop(key, None)

    def lookup(self, key: Hashable, owner: Any = None) -> tuple[bool, Any]:
        """``(True, value)`` if cached (and marked recent), else ``(False, None)``."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None or (owner is not None and not _same(hit[0], owner)):
                return False, None
            self._items.move_to_end(key)
            return True, hit[1]

    def put(self, key: Hashable, value: Any, owner: Any = None) -> Any:
        """Stores ``value`` (dropping the least recent entries beyond ``size``); returns it."""
        with self._lock:
            self._items[key] = (owner, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return value

    def get(self, key: Hashable, build: Callable[[], Any], owner: Any = None) -> Any:
        """The cached value for ``key``, built with ``build()`` if missing."""
        with self._lock:
            found, value = self.lookup(key, owner)
            return value if found else self.put(key, build(), owner)
