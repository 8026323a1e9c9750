"""What ``from_blackjax(factory, logdensity_fn=..., adaptation=..., **options)`` builds.

``adaptation`` is a name (``ADAPTATIONS``), blackjax's own adaptation function (the same
adaptation as its name, its options its keywords), or a built ``AdaptationAlgorithm``.
Everything that can be checked without running is checked here, naming the option: the
factory the adaptation can adapt, options it does not take, values of the wrong kind.

Where each one runs:

- ``"window"``, ``"fisher"``, ``"fisher_low_rank"``: inside the sampling loop, per chain
  (``_warmup_window``, ``_warmup_fisher``): chunked, with the progress bar, Ctrl-C,
  checkpoints and ``until=``.
- ``"chees"``, ``"meads"``: over all chains before sampling (``_warmup_cross_chain``).
- the rest: blackjax's own ``run`` for every chain before sampling (``_warmup_tuned``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# name -> the blackjax function of the same adaptation
FUNCTIONS = {
    "window": "window_adaptation",
    "window_low_rank": "window_adaptation_low_rank",
    "staged": "staged_adaptation",
    "pathfinder": "pathfinder_adaptation",
    "mclmc": "mclmc_find_L_and_step_size",
    "adjusted_mclmc": "adjusted_mclmc_find_L_and_step_size",
    "chees": "chees_adaptation",
    "meads": "meads_adaptation",
}
# chainrunner's own, in the sampling loop (no blackjax function of their own).
IN_LOOP = ("fisher", "fisher_low_rank")
ADAPTATIONS = tuple(FUNCTIONS) + IN_LOOP
"""The names ``from_blackjax(..., adaptation=...)`` takes."""

# The factory each adaptation samples with, where it is one only.
SAMPLERS = {
    "mclmc": "mclmc",
    "adjusted_mclmc": "adjusted_mclmc_dynamic",
    "chees": "dynamic_hmc",
    "meads": "ghmc",
}
# Keywords of blackjax's functions that chainrunner sets itself.
_SET_BY_RUN = {
    "algorithm", "logdensity_fn", "adaptation_info_fn", "progress_bar", "num_steps",
    "mclmc_kernel", "state", "rng_key", "num_chains", "n_chains",
}  # fmt: skip
# The in-loop window's options (blackjax.window_adaptation's others need its own run:
# pass the built blackjax.window_adaptation(...)).
WINDOW_OPTIONS = ("is_mass_matrix_diagonal", "initial_step_size", "target_acceptance_rate")


def is_adaptation_algorithm(obj: Any) -> bool:
    """A built blackjax ``AdaptationAlgorithm`` (a NamedTuple with a callable ``run``)."""
    return isinstance(obj, tuple) and getattr(obj, "_fields", None) == ("run",)


def name_of(adaptation: Any, where: str) -> str:
    """The name of ``adaptation`` (a name or blackjax's function), or ``"built"``."""
    if isinstance(adaptation, str):
        if adaptation not in ADAPTATIONS:
            raise ValueError(
                f"{where}: adaptation must be None, one of {ADAPTATIONS}, blackjax's "
                "adaptation function (e.g. blackjax.window_adaptation_low_rank) or a built "
                f"blackjax AdaptationAlgorithm, got {adaptation!r}."
            )
        return adaptation
    if is_adaptation_algorithm(adaptation):
        return "built"
    import blackjax

    for name, function in FUNCTIONS.items():
        if adaptation is getattr(blackjax, function, None):
            return name
    raise TypeError(
        f"{where}: adaptation must be None, a name {ADAPTATIONS}, one of blackjax's "
        f"adaptation functions (blackjax.{', blackjax.'.join(FUNCTIONS.values())}) or a "
        f"built AdaptationAlgorithm, got {type(adaptation).__name__} {adaptation!r}."
    )


def factory_parameters(factory: Any) -> dict[str, inspect.Parameter] | None:
    """The parameters of ``factory(logdensity_fn, ...)`` (``None``: cannot tell)."""
    try:
        return dict(inspect.signature(getattr(factory, "differentiable", factory)).parameters)
    except (TypeError, ValueError):
        return None


def factory_name(factory: Any) -> str:
    """``blackjax.mala`` for blackjax's factory objects (they have no ``__name__``)."""
    module = getattr(getattr(factory, "differentiable", None), "__module__", "") or ""
    if module.startswith("blackjax."):
        return "blackjax." + module.rsplit(".", 1)[-1]
    return getattr(factory, "__name__", type(factory).__name__)


def check_factory(name: str, factory: Any, options: dict, where: str) -> None:
    """The factory must be what ``name`` adapts: a step size and inverse mass matrix and
    nothing else unset, or the one sampler the adaptation tunes."""
    import blackjax

    if name in SAMPLERS:
        expected = getattr(blackjax, SAMPLERS[name])
        if factory is not expected:
            raise TypeError(
                f"{where}: adaptation={name!r} samples with blackjax.{SAMPLERS[name]}; pass "
                f"algorithm=blackjax.{SAMPLERS[name]}, got {factory!r}."
            )
        return
    if not callable(factory) or not hasattr(factory, "build_kernel"):
        raise TypeError(
            f"{where}: adaptation={name!r} takes a blackjax algorithm factory called as "
            "algorithm(logdensity_fn, step_size, inverse_mass_matrix) (e.g. blackjax.nuts "
            f"or blackjax.hmc), got {type(factory).__name__}."
        )
    params = factory_parameters(factory)
    if params is None:
        return  # cannot tell: let blackjax decide
    if "step_size" not in params or "inverse_mass_matrix" not in params:
        raise TypeError(
            f"{where}: adaptation={name!r} adapts a step size and an inverse mass matrix, "
            f"but {factory_name(factory)} takes no inverse_mass_matrix. These adaptations "
            "support factories called as algorithm(logdensity_fn, step_size, "
            "inverse_mass_matrix) (blackjax.nuts, blackjax.hmc, blackjax.barker_proposal); "
            "pass a built algorithm with a fixed step size instead (e.g. "
            "cr.from_blackjax(blackjax.mala(logdensity_fn, 0.1)))."
        )
    unset = [
        p for p, v in params.items()
        if v.default is inspect.Parameter.empty and v.kind is not v.VAR_KEYWORD
        and v.kind is not v.VAR_POSITIONAL and p not in options
        and p not in ("logdensity_fn", "step_size", "inverse_mass_matrix")
    ]  # fmt: skip
    if unset:
        hint = " (for blackjax.mclmc use adaptation='mclmc')" if "L" in unset else ""
        raise TypeError(
            f"{where}: {factory_name(factory)} needs {unset}, which adaptation={name!r} does "
            f"not set; pass them as options (e.g. num_integration_steps=10 for "
            f"blackjax.hmc){hint}."
        )


def check_options(name: str, function: Callable | None, factory: Any, options: dict,
                  where: str) -> None:  # fmt: skip
    """Options must be keywords of blackjax's function (or of the factory, where the
    function passes its extra keywords on to it), of the right kind."""
    diagonal = options.get("is_mass_matrix_diagonal", True)
    if not isinstance(diagonal, bool):
        raise ValueError(
            f"{where}: is_mass_matrix_diagonal must be True (a diagonal inverse mass matrix) "
            f"or False (a dense one), got {diagonal!r}."
        )
    if function is None:
        return
    params = dict(inspect.signature(function).parameters)
    extra = any(p.kind is p.VAR_KEYWORD for p in params.values())
    taken = {p for p, v in params.items() if v.kind is not v.VAR_KEYWORD} - _SET_BY_RUN
    if name in ("mclmc", "adjusted_mclmc"):
        taken.add("integrator")  # the tuned kernel's and the sampler's
    if extra and name not in SAMPLERS:
        taken |= set(factory_parameters(factory) or {}) - {
            "logdensity_fn", "step_size", "inverse_mass_matrix",
        }  # fmt: skip
    set_by_run = sorted(set(options) & _SET_BY_RUN)
    if set_by_run:
        raise TypeError(
            f"{where}: {set_by_run} are set by cr.run for adaptation={name!r} (the number of "
            "steps is num_warmup; every chain runs its own adaptation)."
        )
    unknown = sorted(set(options) - taken)
    if unknown:
        raise TypeError(
            f"{where}: unknown option(s) {unknown} for adaptation={name!r} with "
            f"{factory_name(factory)}; known: {sorted(taken)}."
        )
