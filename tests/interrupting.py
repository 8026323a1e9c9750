"""A progress bar that stops a run as Ctrl-C would (not a test module)."""


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
