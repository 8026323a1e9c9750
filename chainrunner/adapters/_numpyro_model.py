"""numpyro models sampled with chainrunner's adaptations: ``from_numpyro(..., adaptation=)``.

A bare numpyro kernel keeps numpyro's own adaptation (``_numpyro``). With ``adaptation=``
the model's log density is sampled by blackjax instead, adapted by any adaptation
``cr.from_blackjax`` takes (nutpie's ``"fisher_low_rank"``, Stan's ``"window"``, ChEES,
pathfinder, ...), as ``cr.from_pymc`` does for PyMC models. Everything model-side is
numpyro's own:

- the log density in the unconstrained space: ``-numpyro.infer.util.potential_energy``
  (what numpyro's ``NUTS`` samples, Jacobians of the transforms included);
- the starts: numpyro's ``initialize_model`` with the kernel's init strategy
  (``init_to_uniform`` by default; up to 100 tries for a finite log density and
  gradient), from the chain's init key; or the constrained ``initial_position`` given
  (``init_to_value``; sites left out start as the init strategy says);
- the draws as numpyro's ``MCMC`` returns them: constrained, with the deterministic sites
  (``constrain_fn(..., return_deterministic=True)``);
- ArviZ dims, ``observed_data`` and ``log_likelihood`` as for numpyro's own kernels.

The model's data are constants of the compiled programs (as in ``from_pymc``): the
adapter is cached on the model, a digest of the data and the options, so the same model
and data reuse the compiled programs, and new data compile anew.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpyro
from numpyro import handlers
from numpyro.infer.initialization import init_to_uniform, init_to_value
from numpyro.infer.util import constrain_fn, initialize_model, potential_energy

from ..core._kernel import Adapter
from ._blackjax._adaptations import factory_parameters, name_of
from ._model import ModelAdapter, build_sampler, with_target_accept
from ._numpyro import (
    NumpyroKernel,
    bare_nuts,
    check_model_arguments,
    check_sites,
    model_trace,
)

__all__ = ["NumpyroModel", "from_numpyro_model"]

_SALT = 0x6E756D70  # "nump": the start's keys are not the adaptation's

# numpyro NUTS's settings and their defaults: those chainrunner's adaptation replaces.
_NUTS_DEFAULTS = {
    "step_size": 1.0,
    "inverse_mass_matrix": None,
    "adapt_step_size": True,
    "adapt_mass_matrix": True,
    "trajectory_length": None,
    "find_heuristic_step_size": False,
    "forward_mode_differentiation": False,
    "regularize_mass_matrix": True,
}


def _kinetic_default(kernel: Any) -> bool:
    from numpyro.infer.hmc_util import euclidean_kinetic_energy

    return getattr(kernel, "_kinetic_fn", None) in (None, euclidean_kinetic_energy)


def _nuts_setting(kernel: Any, name: str) -> Any:
    return getattr(kernel, f"_{name}", _NUTS_DEFAULTS.get(name))


def _translated(kernel: Any, name: str, algorithm: Any, options: dict, where: str) -> dict:
    """``options`` with what a ``NUTS(model, ...)`` says that blackjax says otherwise.

    ``target_accept_prob`` becomes the adaptation's target, ``max_tree_depth``
    ``max_num_doublings`` and ``dense_mass=True`` a dense window adaptation; settings that
    chainrunner's adaptation replaces (a step size, a mass matrix, ...) are an error when
    they are not numpyro's defaults, rather than silently ignored.
    """
    changed = [k for k, v in _NUTS_DEFAULTS.items() if not _same(_nuts_setting(kernel, k), v)]
    changed += [] if _kinetic_default(kernel) else ["kinetic_fn"]
    if changed:
        raise ValueError(
            f"{where}: NUTS({', '.join(f'{k}=...' for k in changed)}) does not apply with "
            f"adaptation={name!r}: chainrunner's adaptation sets the step size and mass "
            "matrix. Pass NUTS(model) with only target_accept_prob, max_tree_depth, "
            "dense_mass or init_strategy, or adaptation=None for numpyro's own."
        )
    accept = float(kernel._target_accept_prob)
    if accept != 0.8:
        options = with_target_accept(
            name, accept, options, where, given_as="NUTS(target_accept_prob)"
        )
    depth = kernel._max_tree_depth
    if depth != 10:
        if isinstance(depth, tuple) or "max_num_doublings" not in (
            factory_parameters(algorithm) or ()
        ):
            raise ValueError(
                f"{where}: NUTS(max_tree_depth={depth!r}) does not apply with adaptation="
                f"{name!r} and this sampler (blackjax.nuts takes one max_num_doublings)."
            )
        options = {"max_num_doublings": int(depth), **options}
    if kernel._dense_mass is not False:
        if name != "window" or kernel._dense_mass is not True:
            raise ValueError(
                f"{where}: NUTS(dense_mass={kernel._dense_mass!r}) applies with adaptation="
                f"'window' only (a dense mass matrix); {name!r} adapts its own metric "
                "('fisher_low_rank' finds the correlated directions itself)."
            )
        options = {"is_mass_matrix_diagonal": False, **options}
    return options


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and not hasattr(a, "shape") and a == b)


def _model_and_kernel(kernel: Any, where: str) -> tuple[Callable, Any]:
    """``(model function, NUTS kernel)`` of a ``NUTS(model)`` or a bare model function."""
    if callable(kernel) and not isinstance(kernel, numpyro.infer.mcmc.MCMCKernel):
        return kernel, bare_nuts(kernel)
    if type(kernel) is not numpyro.infer.NUTS:
        raise TypeError(
            f"{where}: adaptation= applies to numpyro.infer.NUTS(model) or a model function "
            f"(its log density is sampled by blackjax), got {type(kernel).__name__}; pass "
            "adaptation=None to run this kernel with numpyro's own adaptation."
        )
    if kernel.model is None:
        raise TypeError(
            f"{where}: adaptation= needs NUTS(model) with a model; this NUTS has a "
            "potential_fn: sample it with cr.from_blackjax(blackjax.nuts, logdensity_fn="
            "lambda z: -potential_fn(z), adaptation=...)."
        )
    return kernel.model, kernel


def _check_continuous(model: Callable, args: tuple, kwargs: dict, where: str) -> None:
    """A ``ValueError`` for discrete latent sites (blackjax samples continuous ones)."""
    found: list[str] = []

    def collect() -> None:
        for name, site in model_trace(model, args, kwargs).items():
            if site["type"] == "sample" and not site["is_observed"]:
                if site["fn"].support.is_discrete:
                    found.append(name)

    jax.eval_shape(collect)
    if found:
        raise ValueError(
            f"{where}: the model has discrete latent sites {found}; with adaptation= blackjax "
            "samples continuous ones only (numpyro's own NUTS enumerates them: adaptation=None)."
        )


def _start(model: Callable, args: tuple, kwargs: dict, strategy: Any) -> Callable:
    """One chain's start in the unconstrained space, as numpyro's ``NUTS`` finds it."""

    def start(position: Any, rng_key: jax.Array) -> Any:
        chosen = strategy
        if position is not None:
            if not isinstance(position, Mapping):
                raise TypeError(
                    "run: initial_position for a numpyro model must be a dict "
                    "{site name: constrained values with a leading chain axis}, got "
                    f"{type(position).__name__}."
                )
            check_sites(model, position, args, kwargs)
            chosen = init_to_value(values=dict(position))
        info = initialize_model(
            jax.random.fold_in(rng_key, _SALT),
            model,
            init_strategy=chosen,
            model_args=args,
            model_kwargs=kwargs,
        )
        return info.param_info.z

    return start


def _functions(model: Callable, args: tuple, kwargs: dict) -> tuple[Callable, Callable]:
    """``(logdensity_fn, constrain)`` of the model, in its unconstrained space."""

    seeded = handlers.seed(model, rng_seed=0)  # as numpyro's potential: a default key

    def logdensity_fn(z: Any) -> jax.Array:
        return -potential_energy(seeded, args, kwargs, z)

    def constrain(z: Any) -> dict[str, jax.Array]:
        return constrain_fn(seeded, args, kwargs, z, return_deterministic=True)

    return logdensity_fn, constrain


class NumpyroModel(ModelAdapter):
    """A numpyro model's log density, sampled by blackjax with chainrunner's adaptations.

    Build it with ``cr.from_numpyro(model, adaptation=...)``. Chains start where numpyro's
    ``NUTS`` would (its init strategy, from chainrunner's keys), and ``trace.draws`` are
    the model's sites, constrained, with its deterministic sites; ``to_arviz`` gets the
    plates' dims, ``observed_data`` and, if asked for, ``log_likelihood``.

    Attributes:
        model: the model function.
        sampler: the blackjax adapter that samples the log density (``from_blackjax``).
        logdensity_fn: that log density, of one chain's unconstrained position
            (``{site: array}``): ``-numpyro.infer.util.potential_energy``.
        meta: the model as numpyro's own kernel sees it (ArviZ dims, observed data, the
            log likelihood).

    Examples:
        >>> import numpyro, numpyro.distributions as dist
        >>> import chainrunner as cr
        >>> def model(y):
        ...     with numpyro.plate("obs", 2):
        ...         numpyro.sample("x", dist.Normal(), obs=y)
        >>> adapter = cr.from_numpyro(model, model_args=([0.5, 1.0],), adaptation="fisher")
        >>> type(adapter).__name__, adapter.dims()
        ('NumpyroModel', {'x': ['obs']})
    """

    def __init__(
        self, model: Callable, sampler: Adapter, meta: NumpyroKernel, logdensity_fn: Callable,
        start: Callable, constrain: Callable,
    ):  # fmt: skip
        super().__init__(sampler, start, constrain)
        self.model, self.meta = model, meta
        self.logdensity_fn = logdensity_fn

    def __repr__(self) -> str:
        return f"NumpyroModel({getattr(self.model, '__name__', 'model')}, {self.sampler!r})"

    init_error_hint = NumpyroKernel.init_error_hint

    def dims(self) -> dict[str, list[str]]:
        """The sites' plates and event dims, as for numpyro's own kernels."""
        return self.meta.dims()

    def groups(self, draws: Any, *, complete: bool) -> dict[str, dict[str, Any]]:
        """``observed_data`` and (when asked for) ``log_likelihood``."""
        return self.meta.groups(draws, complete=complete)

    def attrs(self) -> dict[str, Any]:
        """The sampler's library, and numpyro as the modelling interface."""
        return {
            **self.sampler.attrs(),
            "modeling_interface": "numpyro",
            "modeling_interface_version": numpyro.__version__,
        }


def from_numpyro_model(
    kernel: Any,
    *,
    model_args: tuple,
    model_kwargs: dict | None,
    log_likelihood: bool,
    data: str,
    adaptation: Any,
    algorithm: Any,
    options: dict,
) -> NumpyroModel:
    """``cr.from_numpyro(kernel, ..., adaptation=...)``: see ``chainrunner.from_numpyro``."""
    where = "from_numpyro"
    if data == "inputs":
        raise ValueError(
            f"{where}: data='inputs' does not apply with adaptation= (the model's data are "
            "constants of the compiled programs; new data compile anew); leave data='auto'."
        )
    name = name_of(adaptation, where)  # a clear error for an unknown one, now
    model, nuts = _model_and_kernel(kernel, where)
    kwargs = dict(model_kwargs or {})
    check_model_arguments(nuts, tuple(model_args), kwargs)
    import blackjax

    from ._blackjax._adaptations import SAMPLERS

    factory = algorithm if algorithm is not None else getattr(blackjax, SAMPLERS.get(name, "nuts"))
    options = _translated(nuts, name, factory, dict(options), where)
    strategy = getattr(nuts, "_init_strategy", init_to_uniform)
    _check_continuous(model, tuple(model_args), kwargs, where)
    meta = NumpyroKernel(nuts, tuple(model_args), kwargs, log_likelihood, "constants")
    args = meta.model_args
    logdensity_fn, constrain = _functions(model, args, kwargs)
    sampler = build_sampler(factory, adaptation, logdensity_fn, options, where)
    start = _start(model, args, kwargs, strategy)
    return NumpyroModel(model, sampler, meta, logdensity_fn, start, constrain)
