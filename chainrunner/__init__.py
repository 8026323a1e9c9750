"""chainrunner: many MCMC chains across JAX devices, in one call."""

from ._version import __version__ as __version__
from .adapters import from_blackjax as from_blackjax
from .adapters import from_numpyro as from_numpyro
from .adapters import from_pymc as from_pymc
from .core._kernel import Adapter as Adapter
from .core._kernel import CrossChainWarmup as CrossChainWarmup
from .core._kernel import Ensemble as Ensemble
from .core._kernel import Kernel as Kernel
from .core._kernel import WarmupChunks as WarmupChunks
from .core._kernel import WarmupRequest as WarmupRequest
from .layout._mesh import chain_mesh as chain_mesh
from .layout._mesh import request_cpu_devices as request_cpu_devices
from .output._diagnostics import ChainrunnerWarning as ChainrunnerWarning
from .output._diagnostics import Diagnostics as Diagnostics
from .output._diagnostics import diagnose as diagnose
from .output._trace import Trace as Trace
from .output._trace import adapted_parameters as adapted_parameters
from .pipeline._run import run as run
from .pipeline._run import sample as sample
from .programs._cache import enable_compilation_cache as enable_compilation_cache
from .programs._chain_map import chain_map as chain_map
from .programs._store import set_cache as set_cache
from .stopping._until import Converged as Converged
from .stopping._until import Forgotten as Forgotten

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
    "WarmupChunks",
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
    "set_cache",
]
