"""chainrunner: many MCMC chains across JAX devices, in one call."""

__version__ = "0.1.0"

from ._cache import enable_compilation_cache as enable_compilation_cache
from ._chain_map import chain_map as chain_map
from ._diagnostics import ChainrunnerWarning as ChainrunnerWarning
from ._diagnostics import Diagnostics as Diagnostics
from ._diagnostics import diagnose as diagnose
from ._kernel import Adapter as Adapter
from ._kernel import CrossChainWarmup as CrossChainWarmup
from ._kernel import Ensemble as Ensemble
from ._kernel import Kernel as Kernel
from ._kernel import WarmupRequest as WarmupRequest
from ._mesh import chain_mesh as chain_mesh
from ._mesh import request_cpu_devices as request_cpu_devices
from ._run import run as run
from ._run import sample as sample
from ._trace import Trace as Trace
from ._until import Converged as Converged
from ._until import Forgotten as Forgotten
from .adapters import adapted_parameters as adapted_parameters
from .adapters import from_blackjax as from_blackjax
from .adapters import from_numpyro as from_numpyro
from .adapters import from_pymc as from_pymc

__all__ = [
    "Adapter",
    "ChainrunnerWarning",
    "Converged",
    "CrossChainWarmup",
    "Diagnostics",
    "Ensemble",
    "Forgotten",
    "Kernel",
    "Trace",
    "WarmupRequest",
    "adapted_parameters",
    "chain_map",
    "chain_mesh",
    "diagnose",
    "enable_compilation_cache",
    "from_blackjax",
    "from_numpyro",
    "from_pymc",
    "request_cpu_devices",
    "run",
    "sample",
]
