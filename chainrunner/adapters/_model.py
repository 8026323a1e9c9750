"""A model's log density sampled by a blackjax adapter: the part PyMC and numpyro share.

``cr.from_pymc(model)`` and ``cr.from_numpyro(model, adaptation=...)`` both sample a
model's log density in its unconstrained space with a blackjax adapter
(``from_blackjax(factory, logdensity_fn=..., adaptation=...)``), start the chains where the
modelling library would, and store the draws as that library returns them (constrained,
named as the model's variables). ``ModelAdapter`` is that shape once: the sampler's
kernel with its ``init`` starting from the model's own starting points and its
``extract`` constraining the draws. A front end gives it two functions of one chain:

- ``start(position, rng_key) -> unconstrained position``: ``position`` is what the user
  gave ``cr.run`` for that chain (or ``None``), ``rng_key`` the chain's init key;
- ``constrain(unconstrained position) -> draws``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..core._kernel import (
    Adapter,
    CrossChainWarmup,
    FixedKernel,
    Kernel,
    WarmupChunks,
    WarmupRequest,
)
from ._blackjax._adaptations import SAMPLERS, name_of

__all__ = ["ModelAdapter", "build_sampler", "with_target_accept", "wrap"]


def wrap(kernel: Kernel, start: Callable, constrain: Callable) -> Kernel:
    """``kernel`` starting from ``start``'s positions and storing ``constrain``'s draws."""
    init, _, extract, _ = kernel.functions

    def model_init(position, rng_key, *params):
        return init(start(position, rng_key), rng_key, *params)

    def model_extract(state, info, *params):
        draw, stats = extract(state, info, *params)
        return constrain(draw), stats

    return kernel._replace(init=model_init, extract=model_extract, needs_position=False)


def _host(tree: Any) -> Any:
    return jax.tree.map(np.asarray, jax.device_get(tree))


class ModelAdapter(Adapter):
    """A model's log density sampled by ``sampler``, with the model's starts and draws.

    Subclasses (``PymcModel``, ``NumpyroModel``) add the model's ArviZ groups, dims,
    coords and attrs.

    Attributes:
        sampler: the blackjax adapter that samples the log density (``from_blackjax``).
        start: ``start(position, rng_key) -> unconstrained position`` for one chain.
        constrain: ``constrain(unconstrained position) -> draws`` for one draw.

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> from chainrunner.adapters._model import ModelAdapter
        >>> sampler = cr.from_blackjax(blackjax.nuts, adaptation="window",
        ...                            logdensity_fn=lambda z: -0.5 * jnp.sum(z**2))
        >>> start = lambda position, key: jnp.zeros(2) if position is None else position
        >>> positive = ModelAdapter(sampler, start, lambda z: {"x": jnp.exp(z)})
        >>> trace = cr.run(positive, jax.random.key(0), None, 50, num_warmup=50,
        ...                num_chains=2, progress=False)
        >>> bool((trace.draws["x"] > 0).all())
        True
    """

    def __init__(self, sampler: Adapter, start: Callable, constrain: Callable):
        self.sampler, self.start, self.constrain = sampler, start, constrain
        self._batched: dict[str, Callable] = {}

    @property
    def has_cross_chain_warmup(self) -> bool:  # type: ignore[override]
        return self.sampler.has_cross_chain_warmup

    @property
    def needs_warmup(self) -> bool:  # type: ignore[override]
        return self.sampler.needs_warmup

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """The sampler's adapted parameters (in the sampler's space: unconstrained)."""
        return self.sampler.adapted(state, params)

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The sampler's kernel, starting from the model's starts, with its draws."""
        kernel = self.sampler.build_kernel(num_warmup=num_warmup, previous_params=previous_params)
        return wrap(kernel, self.start, self.constrain)

    def cross_chain_warmup(self, request: WarmupRequest) -> WarmupChunks:
        """The sampler's cross-chain warmup (ChEES, MEADS, pooled, tuners): each chunk's
        kept draws constrained, the kernel it ends with wrapped."""
        w = self.sampler.cross_chain_warmup(request)

        def step(carry: Any, first: int, count: int) -> tuple:
            carry, draws, stats = w.step(carry, first, count)
            if draws is not None:
                draws = self.over_draws("constrain", self.constrain)(draws)
            return carry, draws, stats

        def finish(carry: Any) -> CrossChainWarmup:
            out = w.finish(carry)
            return out._replace(kernel=wrap(out.kernel, self.start, self.constrain))

        return w._replace(step=step, finish=finish)

    def over_draws(self, name: str, fn: Callable) -> Callable:
        """``fn`` of one draw, jitted over ``(chain, draw)``, results on the host."""
        if name not in self._batched:
            self._batched[name] = jax.jit(jax.vmap(jax.vmap(fn)))
        batched = self._batched[name]
        return lambda draws: _host(batched(draws))


def with_target_accept(
    adaptation: Any, target_accept: float | None, options: dict, where: str,
    given_as: str = "target_accept",
) -> dict:  # fmt: skip
    """``options`` with a target acceptance rate under the adaptation's name for it.

    ``target_accept`` is ``pm.sample``'s name (numpyro's ``NUTS(target_accept_prob=...)``
    comes here too, named by ``given_as``): ``target_acceptance_rate`` for the HMC-family
    adaptations, ``target`` for ``"adjusted_mclmc"``; an error for adaptations that tune
    no step size to an acceptance rate, or when the option is also given by its own name.
    """
    if target_accept is None:
        return options
    name = None if adaptation is None else name_of(adaptation, where)
    if name in (None, "mclmc", "meads"):
        raise ValueError(
            f"{where}: {given_as}={target_accept!r} does not apply to adaptation="
            f"{name!r} (it tunes no step size to an acceptance rate)."
        )
    if not 0 < float(target_accept) < 1:
        raise ValueError(f"{where}: {given_as} must be in (0, 1), got {target_accept!r}.")
    option = "target" if name == "adjusted_mclmc" else "target_acceptance_rate"
    if option in options:
        raise TypeError(f"{where}: pass {given_as} or {option}, not both.")
    return {**options, option: float(target_accept)}


def build_sampler(
    algorithm: Any, adaptation: Any, logdensity_fn: Callable, options: dict, where: str
) -> Adapter:
    """The blackjax adapter that samples a model's log density (``from_blackjax``).

    ``algorithm=None`` takes the adaptation's own factory (``blackjax.nuts``,
    ``dynamic_hmc`` for ChEES, ...); ``adaptation=None`` builds ``algorithm(logdensity_fn,
    **options)`` with fixed parameters.
    """
    import blackjax

    from ._blackjax import from_blackjax

    if algorithm is None:
        name = None if adaptation is None else name_of(adaptation, where)
        algorithm = getattr(blackjax, SAMPLERS.get(name, "nuts"))
    if adaptation is not None:
        return from_blackjax(
            algorithm, logdensity_fn=logdensity_fn, adaptation=adaptation, **options
        )
    if not callable(algorithm):
        raise TypeError(
            f"{where}: with adaptation=None, algorithm is a blackjax factory called as "
            "algorithm(logdensity_fn, **options) (e.g. blackjax.mala with step_size=...), got "
            f"{type(algorithm).__name__}."
        )
    kernel = from_blackjax(algorithm(logdensity_fn, **options))
    return FixedKernel(kernel, library="blackjax")
