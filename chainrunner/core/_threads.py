"""Helper threads whose errors always reach the caller.

chainrunner works on three helper threads: the compile of the sampling program (while
the chains are initialised), the checkpoint writer (while the next chunk runs) and the
ArviZ import (while XLA compiles). Each is a ``Background``: its result, or the error it
raised, is kept, and ``result()`` on the calling thread returns it or raises that error.
Threads still running at interpreter exit are joined first (a compile racing jax's own
clean-up of the backends would crash).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

_LIVE: list[threading.Thread] = []
_LOCK = threading.Lock()


def _join_at_exit() -> None:
    for thread in list(_LIVE):
        thread.join()


class Background:
    """``fn()`` on a daemon thread named ``name``; ``result()`` returns or re-raises.

    Examples:
        >>> job = Background(lambda: 1 + 1, "example")
        >>> job.result()
        2
        >>> Background(lambda: 1 / 0, "example").result()
        Traceback (most recent call last):
        ...
        ZeroDivisionError: division by zero
    """

    def __init__(self, fn: Callable[[], Any], name: str):
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        with _LOCK:
            if not _LIVE:  # registered with the first thread: nothing happens at import
                atexit.register(_join_at_exit)
            _LIVE[:] = [t for t in _LIVE if t.is_alive()] + [self._thread]
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as e:  # kept for result(): never dropped
            self._error = e

    @property
    def name(self) -> str:
        """The thread's name."""
        return self._thread.name

    def done(self) -> bool:
        """``True`` once ``fn`` has returned or raised."""
        return not self._thread.is_alive()

    def failed(self) -> BaseException | None:
        """The error ``fn`` raised, if it has finished with one."""
        return self._error if self.done() else None

    def result(self) -> Any:
        """Waits for ``fn``; returns its value or raises its error on this thread."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
