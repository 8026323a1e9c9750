"""blackjax kernels for ``cr.run``: fixed parameters, or adapted during warmup.

``from_blackjax(algorithm)`` wraps a built ``SamplingAlgorithm`` as a ``Kernel``;
``from_blackjax(factory, logdensity_fn=..., adaptation=...)`` gives an ``Adapter``: window
or Fisher adaptation per chain in the loop (``_warmup_window``, ``_warmup_fisher``),
blackjax's per-chain adaptations before it (``_warmup_tuned``), or ChEES/MEADS across
chains (``_warmup_cross_chain``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ...core._kernel import Adapter, Kernel
from . import _adaptations, _nuts_fsm, _warmup_fisher, _warmup_tuned
from ._adaptations import ADAPTATIONS
from ._warmup_cross_chain import CrossChainAdaptation
from ._warmup_pooled import PooledFisherAdaptation
from ._warmup_tuned import TunedAdaptation
from ._warmup_window import WindowAdaptation

__all__ = ["ADAPTATIONS", "from_blackjax", "is_sampling_algorithm"]


def is_sampling_algorithm(obj: Any) -> bool:
    """A blackjax ``SamplingAlgorithm`` (or any NamedTuple with callable init/step)."""
    return (
        isinstance(obj, tuple)
        and hasattr(obj, "_fields")
        and callable(getattr(obj, "init", None))
        and callable(getattr(obj, "step", None))
    )


def from_blackjax(
    algorithm: Any,
    *,
    logdensity_fn: Callable | None = None,
    adaptation: Any = None,
    **options: Any,
) -> Any:
    """Wraps a blackjax ``SamplingAlgorithm`` (``init``/``step``) as a chainrunner Kernel.

    The algorithm's parameters (step size, mass matrix, ...) are fixed: they are
    closed over by its functions. Draws are ``state.position``; sample stats are
    the info fields chainrunner knows, in ArviZ names (``is_divergent`` ->
    ``diverging``, ``num_integration_steps`` -> ``n_steps``,
    ``num_trajectory_expansions`` -> ``tree_depth``, ``acceptance_rate``,
    ``energy``) plus ``lp`` from ``state.logdensity``.

    With ``adaptation`` the parameters are adapted during ``cr.run``'s
    ``num_warmup`` steps instead (see [blackjax with warmup](warmup.md)); ``algorithm`` is then the
    blackjax *factory* and ``logdensity_fn`` is required. ``adaptation`` is a name below,
    blackjax's function of that adaptation (``blackjax.window_adaptation_low_rank``, ...:
    the options are its keywords, and those it passes on to the factory), or a built
    ``AdaptationAlgorithm`` (``blackjax.window_adaptation(blackjax.nuts, f, ...)``: no
    options; the factory builds the sampler from its parameters). Options an adaptation
    does not take, and a factory it cannot adapt, raise here.

    - ``"window"`` (``blackjax.window_adaptation``): Stan's window adaptation of the step
      size and inverse mass matrix, per chain, inside the sampling program (chunked: the
      progress bar, Ctrl-C, checkpoints and ``until=`` work during warmup). ``algorithm``
      is called as ``algorithm(logdensity_fn, step_size, inverse_mass_matrix, **extra)``
      (``blackjax.nuts``, ``blackjax.hmc``, ...). Options:
      ``is_mass_matrix_diagonal=True`` (``False``: dense), ``initial_step_size=1.0``,
      ``target_acceptance_rate=0.8``; other options go to the factory (e.g.
      ``num_integration_steps`` for HMC).
    - ``"fisher"``, ``"fisher_low_rank"``: nutpie's Fisher-divergence adaptation, per
      chain, inside the sampling program like ``"window"`` (``_warmup_fisher``): the
      mass matrix from the draws *and their gradients*, updated after every warmup draw
      from the last one to two of nutpie's growing windows, a diagonal
      (``σ² = sqrt(Var[x]/Var[∇log p])``) or that plus ``max_rank`` eigen-directions
      (Algorithm 1 of Seyboldt, Carlson & Carpenter). Options (nutpie's defaults):
      ``target_acceptance_rate=0.8``, ``initial_step_size=0.1``, ``early_window=0.3``,
      ``step_size_window=0.15``, ``early_switch_freq=10``, ``switch_freq=80``,
      ``window_growth=1.5``, ``step_size_jitter=0.1``, ``update_freq=1`` (draws between
      mass-matrix updates, besides every switch; 10 for the low rank, whose update costs
      more); for the low rank ``max_rank=None`` (nutpie's: every direction outside the
      cutoff, up to 100; an integer caps it), ``gamma=1e-5`` (in float32 at least
      ``3e-3`` of the covariances' scale, float32's resolution),
      ``eigenvalue_cutoff=2.0``; other options go to the factory. The factory's state
      must carry ``logdensity_grad`` (blackjax's HMC family does).
      ``cr.from_pymc``'s default is ``"fisher_low_rank"``. With ``pooled=True``
      (``_warmup_pooled``) the same schedule adapts one step size and mass matrix from
      the draws of **all** chains, before sampling, spread over the devices like ChEES
      (no progress bar or Ctrl-C during it); every chain then samples with them.
    - Per chain, before sampling, blackjax's own ``run`` for every chain in one program
      over the mesh (batched like sampling), each chain with its own parameters (a
      leading chain axis in ``cr.adapted_parameters``): ``"window_low_rank"``
      (``blackjax.window_adaptation_low_rank``: the Fisher-divergence low-rank metric),
      ``"staged"`` (``blackjax.staged_adaptation``, e.g. ``metric="fisher_diag"``),
      ``"pathfinder"`` (``blackjax.pathfinder_adaptation``), ``"mclmc"``
      (``blackjax.mclmc_find_L_and_step_size``, ``algorithm=blackjax.mclmc``) and
      ``"adjusted_mclmc"`` (``blackjax.adjusted_mclmc_find_L_and_step_size``,
      ``algorithm=blackjax.adjusted_mclmc_dynamic``, ``target=0.9``). For the MCLMC
      tuners ``num_warmup`` is the tuning length (blackjax's ``num_steps`` is
      ``num_warmup / (frac_tune1 + frac_tune2 + frac_tune3)``).
    - ``"chees"``: ChEES over all chains, then jittered HMC
      (``algorithm=blackjax.dynamic_hmc``). Options: ``step_size=0.1`` (initial),
      ``learning_rate=0.025`` (Adam), ``jitter_amount=1.0``,
      ``target_acceptance_rate=0.651``, ``decay_rate=0.5``, ``max_leapfrog_steps=1000``.
    - ``"meads"``: MEADS over all chains, then generalised HMC
      (``algorithm=blackjax.ghmc``). Options: ``num_folds=None`` (the largest of
      4, 3, 2, 1 dividing the chains with four per fold, else 1), ``step_size_multiplier=0.5``,
      ``damping_slowdown=1.0``, ``divergence_threshold=1000``.
    - ``"chees"`` and ``"meads"`` also take ``layout=``: ``"sharded"`` (the default)
      spreads each warmup step's kernel calls over the devices under ``shard_map``
      (the ensemble and the adaptation replicated on every device): bitwise the same
      results on any device count and padding for the same ``batch_size``, faster with
      more devices. ``"replicated"``: every device steps all chains in one ``vmap``
      (bitwise blackjax's own ``run``): the same on any device count and batch size,
      no faster with more devices.

    Factories that take no inverse mass matrix (``blackjax.mala``, ``blackjax.rmh``, ...)
    cannot be window-adapted: ``adaptation="window"`` raises a ``TypeError`` for them at
    once (build them with a fixed step size instead).

    Args:
        algorithm: e.g. ``blackjax.nuts(logdensity_fn, step_size, inverse_mass_matrix)``;
            with ``adaptation``, the factory (``blackjax.nuts``, ``blackjax.dynamic_hmc``,
            ``blackjax.ghmc``).
        logdensity_fn: the log density of one chain's position (with ``adaptation`` only).
        adaptation: ``None`` (fixed parameters), a name in ``ADAPTATIONS``, blackjax's
            adaptation function, or a built ``AdaptationAlgorithm``.
        **options: the adaptation's options (above).

    Returns:
        A ``Kernel``. With ``adaptation``: an object ``cr.run`` accepts as a kernel. A
        new object of the same computation (a notebook cell run again) compiles nothing
        again: compiled programs are found by what they compute
        ([what is compiled when](compilation.md)).

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
        >>> kernel = cr.from_blackjax(nuts)
        >>> kernel.step is nuts.step
        True
        >>> import jax
        >>> adaptive = cr.from_blackjax(blackjax.nuts, adaptation="window",
        ...                             logdensity_fn=lambda x: -0.5 * jnp.sum(x**2))
        >>> trace = cr.run(adaptive, jax.random.key(0), jnp.zeros((4, 2)), 20, num_warmup=30,
        ...                progress=False)
        >>> trace.stats["step_size"].shape
        (4, 20)
    """
    if adaptation is not None:
        return from_blackjax_adaptive(
            algorithm, logdensity_fn=logdensity_fn, adaptation=adaptation, **options
        )
    if logdensity_fn is not None or options:
        given = sorted(options) + (["logdensity_fn"] if logdensity_fn is not None else [])
        raise TypeError(
            f"from_blackjax: {given} apply only with adaptation= (one of {ADAPTATIONS}, "
            "blackjax's adaptation function or a built one); "
            "without adaptation pass a built algorithm, e.g. blackjax.nuts(logdensity_fn, "
            "step_size, inverse_mass_matrix)."
        )
    if isinstance(algorithm, Kernel):
        return algorithm
    if not is_sampling_algorithm(algorithm):
        raise TypeError(
            "from_blackjax: algorithm must be a blackjax SamplingAlgorithm with init and "
            f"step (e.g. blackjax.nuts(logdensity_fn, step_size, inverse_mass_matrix)), got "
            f"{type(algorithm).__name__}."
        )
    spec = _nuts_fsm.nuts_spec(algorithm)
    machine = None if spec is None else functools.partial(_nuts_fsm.chunk_machine, spec)
    # The algorithm's own functions (the same objects on every call: its traces are reused)
    return Kernel(init=algorithm.init, step=algorithm.step, machine=machine)


_DEFAULTS = {
    "window": {
        "is_mass_matrix_diagonal": True,
        "initial_step_size": 1.0,
        "target_acceptance_rate": 0.8,
    },
    "chees": {
        "step_size": 0.1,
        "learning_rate": 0.025,
        "jitter_amount": 1.0,
        "target_acceptance_rate": 0.651,
        "decay_rate": 0.5,
        "max_leapfrog_steps": 1000,
        "layout": "sharded",
    },
    "meads": {
        "num_folds": None,
        "step_size_multiplier": 0.5,
        "damping_slowdown": 1.0,
        "divergence_threshold": 1000,
        "layout": "sharded",
    },
}


def from_blackjax_adaptive(
    algorithm: Any, *, logdensity_fn: Callable | None, adaptation: Any, **options: Any
) -> Adapter:
    """``from_blackjax(algorithm, logdensity_fn=..., adaptation=...)``: see there.

    Args:
        algorithm: the blackjax factory the adaptation tunes (``blackjax.nuts``, ...).
        logdensity_fn: the log density of one chain's position.
        adaptation: a name (``ADAPTATIONS``), blackjax's adaptation function, or a built
            ``AdaptationAlgorithm``.
        **options: the adaptation's options (see ``from_blackjax``).

    Returns:
        A ``WindowAdaptation``, ``CrossChainAdaptation``, ``PooledFisherAdaptation`` or
        ``TunedAdaptation``.

    Raises:
        ValueError, TypeError: for an unknown adaptation, a missing ``logdensity_fn``,
            a factory the adaptation cannot adapt, or options it does not take.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> from chainrunner.adapters._blackjax import from_blackjax_adaptive
        >>> f = lambda x: -0.5 * jnp.sum(x**2)
        >>> a = from_blackjax_adaptive(blackjax.nuts, logdensity_fn=f, adaptation="window")
        >>> type(a).__name__
        'WindowAdaptation'
    """
    where = "from_blackjax"
    name = _adaptations.name_of(adaptation, where)
    if logdensity_fn is None or not callable(logdensity_fn):
        raise TypeError(
            f"{where}: adaptation={name if name != 'built' else adaptation!r} needs "
            "logdensity_fn=<callable> (the log density of one chain's position), got "
            f"{logdensity_fn!r}."
        )
    opts = _checked_options(name, algorithm, options, where)
    return _build(name, algorithm, logdensity_fn, adaptation, opts)


def _checked_options(name: str, algorithm: Any, options: dict, where: str) -> dict:
    """The adaptation's options with its defaults, after every check that needs no run."""
    import blackjax

    if name == "built":
        if options:
            raise TypeError(
                f"{where}: options {sorted(options)} apply to an adaptation by name; a built "
                "AdaptationAlgorithm carries its own (give them where you build it)."
            )
        if not callable(algorithm):
            raise TypeError(
                f"{where}: with a built AdaptationAlgorithm, algorithm is the factory its "
                "parameters build the sampler with (algorithm(logdensity_fn, "
                f"**parameters), e.g. blackjax.nuts), got {type(algorithm).__name__}."
            )
        return {}
    _adaptations.check_factory(name, algorithm, options, where)
    if name in ("chees", "meads"):
        if options.get("layout", "sharded") not in ("replicated", "sharded"):
            raise ValueError(
                f"{where}: layout must be 'replicated' or 'sharded', got {options['layout']!r}."
            )
        unknown = sorted(set(options) - set(_DEFAULTS[name]))
        if unknown:
            raise TypeError(
                f"{where}: unknown option(s) {unknown} for adaptation={name!r}; "
                f"known: {sorted(_DEFAULTS[name])}."
            )
        return {**_DEFAULTS[name], **options}
    if name in _adaptations.IN_LOOP:
        return _fisher_options(name, algorithm, options, where)
    if name == "window":
        _adaptations.check_options(name, None, algorithm, options, where)
        factory_keys = set(_adaptations.factory_parameters(algorithm) or options)
        unknown = sorted(set(options) - set(_adaptations.WINDOW_OPTIONS) - factory_keys)
        if unknown:
            raise TypeError(
                f"{where}: unknown option(s) {unknown} for adaptation='window' with "
                f"{_adaptations.factory_name(algorithm)}: the in-loop window takes "
                f"{list(_adaptations.WINDOW_OPTIONS)} and the factory's own keywords. For "
                "blackjax.window_adaptation's other options pass the built adaptation: "
                "adaptation=blackjax.window_adaptation(algorithm, logdensity_fn, ...)."
            )
        return {**_DEFAULTS[name], **options}
    function = getattr(blackjax, _adaptations.FUNCTIONS[name])
    _adaptations.check_options(name, function, algorithm, options, where)
    return dict(options)


def _fisher_options(name: str, algorithm: Any, options: dict, where: str) -> dict:
    """The Fisher adaptation's options with nutpie's defaults, checked."""
    own = {**_warmup_fisher.OPTIONS}
    if name == "fisher_low_rank":
        own.update(_warmup_fisher.LOW_RANK_OPTIONS)
    factory_keys = set(_adaptations.factory_parameters(algorithm) or options)
    factory_keys -= {"logdensity_fn", "step_size", "inverse_mass_matrix"}
    unknown = sorted(set(options) - set(own) - factory_keys)
    if unknown:
        window = sorted(set(unknown) & set(_adaptations.WINDOW_OPTIONS))
        hint = f" {window} are options of adaptation='window' (Stan's)." if window else ""
        raise TypeError(
            f"{where}: unknown option(s) {unknown} for adaptation={name!r} with "
            f"{_adaptations.factory_name(algorithm)}; it takes {sorted(own)} and the "
            f"factory's own keywords.{hint}"
        )
    opts = {**own, **options}
    for key in ("target_acceptance_rate", "early_window", "step_size_window"):
        if not 0.0 < float(opts[key]) < 1.0:
            raise ValueError(f"{where}: {key} must be in (0, 1), got {opts[key]!r}.")
    if float(opts["early_window"]) + float(opts["step_size_window"]) >= 1.0:
        raise ValueError(
            f"{where}: early_window + step_size_window must be below 1 (the rest of warmup "
            f"adapts the mass matrix in growing windows), got {opts['early_window']} + "
            f"{opts['step_size_window']}."
        )
    rank = ("max_rank",) if name == "fisher_low_rank" and opts["max_rank"] is not None else ()
    for key in ("early_switch_freq", "switch_freq", "update_freq", *rank):
        if (
            isinstance(opts[key], bool)
            or not isinstance(opts[key], (int, np.integer))
            or (opts[key] < 1)
        ):
            raise ValueError(f"{where}: {key} must be a positive integer, got {opts[key]!r}.")
    if float(opts["window_growth"]) < 1.0:
        raise ValueError(f"{where}: window_growth must be >= 1, got {opts['window_growth']!r}.")
    if not isinstance(opts["pooled"], (bool, np.bool_)):
        raise TypeError(f"{where}: pooled must be True or False, got {opts['pooled']!r}.")
    if not 0.0 <= float(opts["step_size_jitter"]) < 1.0:
        raise ValueError(
            f"{where}: step_size_jitter must be in [0, 1), got {opts['step_size_jitter']!r}."
        )
    return opts


def _build(name: str, algorithm: Any, logdensity_fn: Callable, adaptation: Any,
           opts: dict) -> Adapter:  # fmt: skip
    if name == "window":
        return WindowAdaptation(algorithm, logdensity_fn, opts)
    if name in _adaptations.IN_LOOP and opts["pooled"]:
        return PooledFisherAdaptation(algorithm, name, logdensity_fn, opts)
    if name in _adaptations.IN_LOOP:
        low_rank = name == "fisher_low_rank"

        def kernel_fn(algorithm, logdensity_fn, num_warmup, options):
            return _warmup_fisher.fisher_kernel(
                algorithm, logdensity_fn, num_warmup, options, low_rank
            )

        return WindowAdaptation(algorithm, logdensity_fn, opts, name, kernel_fn)
    if name in ("chees", "meads"):
        return CrossChainAdaptation(name, logdensity_fn, opts)
    if name == "mclmc":
        return TunedAdaptation(_warmup_tuned.mclmc_family(logdensity_fn, opts), logdensity_fn)
    if name == "adjusted_mclmc":
        family = _warmup_tuned.adjusted_mclmc_family(logdensity_fn, opts)
        return TunedAdaptation(family, logdensity_fn)
    if name == "built":
        family = _warmup_tuned.run_family(
            "built", lambda keep: adaptation, algorithm, logdensity_fn, {}, keeps_warmup=False
        )
        return TunedAdaptation(family, logdensity_fn)
    return TunedAdaptation(_named_run_family(name, algorithm, logdensity_fn, opts), logdensity_fn)


# What blackjax's adaptations keep of each step when the warmup draws are kept.
_KEPT_INFO = {
    "acceptance_rate", "is_divergent", "num_integration_steps", "num_trajectory_expansions",
    "energy",
}  # fmt: skip


def _named_run_family(name: str, algorithm: Any, logdensity_fn: Callable,
                      opts: dict) -> _warmup_tuned.Family:  # fmt: skip
    """blackjax's adaptation function of ``name`` built with ``opts``; the options its
    signature does not name go to the factory (blackjax passes them on too)."""
    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    function = getattr(blackjax, _adaptations.FUNCTIONS[name])
    own = set(inspect.signature(function).parameters)
    static = {k: v for k, v in opts.items() if k not in own}

    # window_adaptation_low_rank starts sampling from the last step's mu_star.
    adaptation_keys = {"mu_star"} if name == "window_low_rank" else set()

    def build(keep: bool) -> Any:
        info_fn = (
            get_filter_adapt_info_fn({"position", "logdensity"}, _KEPT_INFO, adaptation_keys)
            if keep
            else get_filter_adapt_info_fn(set(), set(), adaptation_keys)
        )
        return function(algorithm, logdensity_fn, adaptation_info_fn=info_fn, **opts)

    return _warmup_tuned.run_family(name, build, algorithm, logdensity_fn, static)
