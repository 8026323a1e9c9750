"""blackjax kernels for ``cr.run``: fixed parameters, or adapted during warmup.

``from_blackjax(algorithm)`` wraps a built ``SamplingAlgorithm`` as a ``Kernel``;
``from_blackjax(factory, logdensity_fn=..., adaptation=...)`` gives an ``Adapter``: window
adaptation per chain (``_warmup_window``) or ChEES/MEADS across chains
(``_warmup_cross_chain``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ...core._kernel import Adapter, Kernel
from ...core._lru import LRU
from ...layout import _distributed
from ._warmup_cross_chain import CrossChainAdaptation
from ._warmup_window import WindowAdaptation, WindowState

__all__ = ["adapted_parameters", "from_blackjax", "is_sampling_algorithm"]

ADAPTATIONS = ("window", "chees", "meads")
"""The values of ``from_blackjax(..., adaptation=...)``."""

# Adapted kernels are cached on the identity of what they wrap, so that passing the same
# blackjax algorithm twice reuses the same Kernel and hence the same compiled program.
_ADAPTED = LRU(64)


def is_sampling_algorithm(obj: Any) -> bool:
    """A blackjax ``SamplingAlgorithm`` (or any NamedTuple with callable init/step)."""
    return (
        isinstance(obj, tuple)
        and hasattr(obj, "_fields")
        and callable(getattr(obj, "init", None))
        and callable(getattr(obj, "step", None))
    )


def _factory_name(factory: Any) -> str:
    """``blackjax.mala`` for blackjax's factory objects (they have no ``__name__``)."""
    module = getattr(getattr(factory, "differentiable", None), "__module__", "") or ""
    if module.startswith("blackjax."):
        return "blackjax." + module.rsplit(".", 1)[-1]
    return getattr(factory, "__name__", type(factory).__name__)


def _takes_mass_matrix(factory: Callable) -> bool:
    """Whether ``factory(logdensity_fn, step_size, inverse_mass_matrix)`` fits its signature.

    blackjax factories are ``GenerateSamplingAPI`` objects whose ``differentiable``
    attribute has the real signature.
    """
    try:
        params = inspect.signature(getattr(factory, "differentiable", factory)).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: let blackjax decide
    return "step_size" in params and "inverse_mass_matrix" in params


def from_blackjax(
    algorithm: Any,
    *,
    logdensity_fn: Callable | None = None,
    adaptation: str | None = None,
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
    ``num_warmup`` steps instead (see docs/warmup.md); ``algorithm`` is then the
    blackjax *factory* and ``logdensity_fn`` is required:

    - ``"window"``: Stan's window adaptation of the step size and inverse mass
      matrix, per chain, inside the sampling program. ``algorithm`` is called as
      ``algorithm(logdensity_fn, step_size, inverse_mass_matrix, **extra)``
      (``blackjax.nuts``, ``blackjax.hmc``, ...). Options:
      ``is_mass_matrix_diagonal=True``, ``initial_step_size=1.0``,
      ``target_acceptance_rate=0.8``; other options go to the factory (e.g.
      ``num_integration_steps`` for HMC).
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
        adaptation: ``None`` (fixed parameters), ``"window"``, ``"chees"`` or ``"meads"``.
        **options: the adaptation's options (above).

    Returns:
        A ``Kernel``; the same one for the same algorithm object, so repeated runs
        reuse the compiled program. With ``adaptation``: an object ``cr.run`` accepts
        as a kernel, the same one for the same arguments.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = blackjax.nuts(lambda x: -0.5 * jnp.sum(x**2), 0.5, jnp.ones(2))
        >>> kernel = cr.from_blackjax(nuts)
        >>> kernel is cr.from_blackjax(nuts)
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
            f"from_blackjax: {given} apply only with adaptation='window'|'chees'|'meads'; "
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

    def build(alg):
        def init(position, rng_key):
            return alg.init(position, rng_key)

        return Kernel(init=init, step=alg.step)

    return _ADAPTED.get(id(algorithm), lambda: build(algorithm), owner=algorithm)


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

_FACTORY = {"chees": "dynamic_hmc", "meads": "ghmc"}

_OBJECTS = LRU(64)


def _options_key(options: dict) -> tuple:
    items = []
    for k, v in sorted(options.items()):
        try:
            hash(v)
            items.append((k, "v", v))
        except TypeError:
            items.append((k, "id", id(v)))
    return tuple(items)


def from_blackjax_adaptive(
    algorithm: Any, *, logdensity_fn: Callable | None, adaptation: str, **options: Any
) -> WindowAdaptation | CrossChainAdaptation:
    """``from_blackjax(algorithm, logdensity_fn=..., adaptation=...)``: see there.

    Args:
        algorithm: the blackjax factory (``blackjax.nuts``, ``blackjax.hmc``, ... for
            ``"window"``; ``blackjax.dynamic_hmc`` for ``"chees"``; ``blackjax.ghmc`` for
            ``"meads"``).
        logdensity_fn: the log density of one chain's position.
        adaptation: ``"window"``, ``"chees"`` or ``"meads"``.
        **options: the adaptation's options (see ``from_blackjax``); for ``"window"``
            others are passed to the factory (e.g. ``num_integration_steps``).

    Returns:
        A ``WindowAdaptation`` or ``CrossChainAdaptation``; the same object for the
        same arguments, so repeated runs reuse the compiled programs.

    Raises:
        ValueError, TypeError: for an unknown adaptation, a missing ``logdensity_fn``,
            a factory that does not fit the adaptation, or unknown options.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> from chainrunner.adapters._blackjax import from_blackjax_adaptive
        >>> f = lambda x: -0.5 * jnp.sum(x**2)
        >>> a = from_blackjax_adaptive(blackjax.nuts, logdensity_fn=f, adaptation="window")
        >>> a is from_blackjax_adaptive(blackjax.nuts, logdensity_fn=f, adaptation="window")
        True
    """
    where = "from_blackjax"
    if adaptation not in ADAPTATIONS:
        raise ValueError(
            f"{where}: adaptation must be None or one of {ADAPTATIONS}, got {adaptation!r}."
        )
    if logdensity_fn is None or not callable(logdensity_fn):
        raise TypeError(
            f"{where}: adaptation={adaptation!r} needs logdensity_fn=<callable> (the log "
            f"density of one chain's position), got {logdensity_fn!r}."
        )
    if adaptation == "window":
        if not callable(algorithm) or not hasattr(algorithm, "build_kernel"):
            raise TypeError(
                f"{where}: adaptation='window' takes a blackjax algorithm factory called as "
                "algorithm(logdensity_fn, step_size, inverse_mass_matrix) (e.g. blackjax.nuts "
                f"or blackjax.hmc), got {type(algorithm).__name__}."
            )
        if not _takes_mass_matrix(algorithm):
            raise TypeError(
                f"{where}: adaptation='window' adapts a step size and an inverse mass matrix, "
                f"but {_factory_name(algorithm)} takes no "
                "inverse_mass_matrix. Window adaptation supports factories called as "
                "algorithm(logdensity_fn, step_size, inverse_mass_matrix) (blackjax.nuts, "
                "blackjax.hmc, blackjax.barker_proposal); pass a built algorithm with a fixed "
                "step size instead (e.g. cr.from_blackjax(blackjax.mala(logdensity_fn, 0.1)))."
            )
    else:
        import blackjax

        expected = getattr(blackjax, _FACTORY[adaptation])
        if algorithm is not expected:
            raise TypeError(
                f"{where}: adaptation={adaptation!r} samples with "
                f"blackjax.{_FACTORY[adaptation]}; pass algorithm=blackjax."
                f"{_FACTORY[adaptation]}, got {algorithm!r}."
            )
        if options.get("layout", "sharded") not in ("replicated", "sharded"):
            raise ValueError(
                f"{where}: layout must be 'replicated' or 'sharded', got {options['layout']!r}."
            )
        unknown = sorted(set(options) - set(_DEFAULTS[adaptation]))
        if unknown:
            raise TypeError(
                f"{where}: unknown option(s) {unknown} for adaptation={adaptation!r}; "
                f"known: {sorted(_DEFAULTS[adaptation])}."
            )
    opts = {**_DEFAULTS[adaptation], **options}
    key = (id(algorithm), id(logdensity_fn), adaptation, _options_key(opts))

    def build() -> Adapter:
        if adaptation == "window":
            return WindowAdaptation(algorithm, logdensity_fn, opts)
        return CrossChainAdaptation(adaptation, logdensity_fn, opts)

    return _OBJECTS.get(key, build, owner=(algorithm, logdensity_fn))


def adapted_parameters(trace: Any) -> dict[str, np.ndarray]:
    """The adapted step size and inverse mass matrix of a run with warmup.

    For ``adaptation="window"`` they are per chain, read from ``trace.final_state``:
    ``step_size`` ``(chain,)`` and ``inverse_mass_matrix`` ``(chain, d)`` (or
    ``(chain, d, d)`` for a dense matrix). For ``"chees"``/``"meads"`` they are shared
    and read from ``trace.attrs`` (``adapted_*`` entries).

    Args:
        trace: a ``cr.Trace``.

    Returns:
        ``{name: numpy array}``.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> nuts = cr.from_blackjax(blackjax.nuts, logdensity_fn=lambda x: -0.5 * jnp.sum(x**2),
        ...                         adaptation="window")
        >>> trace = cr.run(nuts, jax.random.key(0), jnp.zeros((4, 3)), 10, num_warmup=30,
        ...                progress=False)
        >>> {k: v.shape for k, v in cr.adapted_parameters(trace).items()}
        {'step_size': (4,), 'inverse_mass_matrix': (4, 3)}
    """
    state = trace.final_state
    if isinstance(state, WindowState):
        a = _distributed.to_host(state.adaptation)
        return {
            "step_size": np.asarray(a.step_size),
            "inverse_mass_matrix": np.asarray(a.inverse_mass_matrix),
        }
    found = {
        k[len("adapted_") :]: np.asarray(v)
        for k, v in trace.attrs.items()
        if k.startswith("adapted_")
    }
    if not found:
        raise ValueError(
            "adapted_parameters: this trace has no adapted parameters (run a kernel from "
            "cr.from_blackjax(..., adaptation=...) with num_warmup > 0)."
        )
    return found
