"""Helpers that stop a run as Ctrl-C or a crash would, and watch its bar (not a test
module)."""

import os
import signal
import subprocess
import time


class InterruptingBar:
    """A tqdm stand-in that raises KeyboardInterrupt at its ``at``-th update.

    ``run`` updates its bar once at the start, then once per collected chunk: update
    ``k + 1`` follows chunk ``k`` (and its checkpoint write).
    """

    def __init__(self, *args, at=3, **kwargs):
        self.calls, self.at = 0, at
        self.total, self.leave = None, True

    def update(self, n=1):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt

    def set_description(self, *a, **k):
        pass

    def set_postfix(self, *a, **k):
        pass

    def reset(self, total=None):
        self.total = total

    def refresh(self):
        pass

    def close(self):
        pass


class Recorder:
    """A tqdm stand-in that records what the run shows, in order: ``shown``, each
    description with the count it was shown at; ``updates``, each update with the
    description shown then."""

    def __init__(self, progress, total, desc):
        self.total, self.n, self.leave, self.desc = total, 0, True, desc
        self.shown, self.updates = [(desc, 0)], []

    def set_description(self, desc, refresh=True):
        self.desc = desc
        self.shown.append((desc, self.n))

    def update(self, n=1):
        self.n += n
        self.updates.append((self.desc, n))

    def reset(self, total=None):
        self.total, self.n = total, 0

    def set_postfix(self, *a, **k):
        pass

    def refresh(self):
        pass

    def close(self):
        self.closed = True


def kill_when_written(cmd, manifest, chunks, env, timeout=300):
    """Starts ``cmd`` and kills it (``SIGKILL``) once ``manifest`` lists ``chunks``
    chunk files: a crash in the middle of a checkpointed run."""
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(manifest) as f:
                if f.read().count('"file"') >= chunks:
                    break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
