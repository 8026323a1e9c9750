"""Monte-Carlo standard errors for the statistical tests, as Python floats.

arviz 0.x returns a one-element array for a ``(chain, draw)`` numpy input, which numpy
>= 2.4 no longer converts with ``float()``; and its ``mcse(method="sd")`` does such a
conversion itself (it raises under the numpy that PyMC 5 resolves). Both are done here.
"""

import arviz as az
import numpy as np


def mcse(x) -> float:
    """MCSE of the mean of ``x`` ``(chain, draw)`` (ArviZ's)."""
    return float(np.ravel(az.mcse(np.asarray(x, dtype=np.float64)))[0])


def mcse_sd(x) -> float:
    """MCSE of the standard deviation of ``x`` ``(chain, draw)``: the delta method on the
    second central moment, ``mcse((x - mean)^2) / (2 sd)``."""
    x = np.asarray(x, dtype=np.float64)
    return mcse((x - x.mean()) ** 2) / (2 * float(x.std(ddof=1)))
