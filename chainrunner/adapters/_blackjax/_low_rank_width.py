"""The low-rank metric at the width its informative directions need.

nutpie's low-rank metric ``M⁻¹ = diag(sigma) (I + U (Λ - I) Uᵀ) diag(sigma)`` keeps up to
``rank_of`` directions, a constant of the program (blackjax's ``LowRankInverseMassMatrix``:
``U`` is ``(d, rank)``). The directions inside the cutoff band are masked (``λ = 1``) and
sorted last, so they change nothing, yet blackjax's metric multiplies by every column on
every leapfrog step: measured on a radon-like 89-d model whose warmup keeps 2 of 89
directions, 34.7 µs per gradient against 10.6 µs for the diagonal metric.

``following_metric`` computes the same operator with only the leading ``w`` columns, ``w``
the smallest of ``widths(rank)`` that holds every unmasked direction (a column whose
``λ`` is 1 adds an exact zero). Each chain takes the width its own metric needs
(``lazy_switch``): its draws do not depend on which chains share its batch, the same on
every layout. The widths are 8, where it is at most half of every direction, then every
direction (``WIDTHS`` has the measurements).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.flatten_util import ravel_pytree

from ...core._lazy import lazy_switch

WIDTHS = (8,)
"""The widths below every direction that a metric's step may run at.

Each width is one more copy of the metric's products in the program, at every place NUTS
calls them. Measured on the radon-like model (Python 3.12, 4 chains x (1000 + 1000), 2 CPU
devices, no program cache), first compile / warmup and sampling, in seconds: every column
(blackjax's) 4.8 / 2.6; widths 8 and 89: 5.3 / 1.2; 4 and 89: 5.0 / 1.3; 0, 4, 16 and 89:
5.7 / 1.2; 0, 4, 16, 64 and 89: 6.2 / 1.3. One width below every direction keeps the
compile where it was; 8 holds the few directions a hierarchical model's warmup keeps.

A width runs only where it is at most half of every direction: on a small model the
narrow copy saves little per step and still costs its compile. Eight schools (10
directions, none kept), first compile over three fresh processes each, interleaved:
widths 8 and 10, 4.5-4.8 s; every column only, 4.1-4.4 s."""


def widths(rank: int) -> tuple[int, ...]:
    """The widths a metric of ``rank`` columns runs at: each of ``WIDTHS`` that is at most
    half of ``rank``, then ``rank``.

    Examples:
        >>> widths(89), widths(16), widths(10), widths(4)
        ((8, 89), (8, 16), (10,), (4,))
    """
    return (*(w for w in WIDTHS if 2 * w <= rank), rank)


def width_index(lam: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
    """The index in ``sizes`` of the smallest width that holds every column whose ``λ``
    is not 1 (the masked and padded columns of the Fisher metric are 1 exactly).

    Examples:
        >>> import jax.numpy as jnp
        >>> int(width_index(jnp.array([3.0, 0.2, 1.0, 1.0, 1.0]), (1, 2, 5)))
        1
    """
    used = jnp.max(jnp.where(lam != 1, jnp.arange(1, lam.shape[0] + 1), 0), initial=0)
    return jnp.searchsorted(jnp.asarray(sizes), used).astype(jnp.int32)


def _metric(width: int, sigma: jax.Array, u: jax.Array, lam: jax.Array) -> Any:
    from blackjax.mcmc.metrics import gaussian_euclidean_low_rank

    return gaussian_euclidean_low_rank(sigma, u[:, :width], lam[:width])


def _velocity(width: int, sigma: jax.Array, u: jax.Array, lam: jax.Array,
              p: jax.Array) -> jax.Array:  # fmt: skip
    """``M⁻¹ p = sigma (q + U (Λ - 1) Uᵀ q)``, ``q = sigma p``, at the leading ``width``
    columns."""
    q, u, lam = sigma * p, u[:, :width], lam[:width]
    return sigma * (q + u @ ((lam - 1) * (u.T @ q)))


def _at_width(sizes: tuple[int, ...], sigma: jax.Array, u: jax.Array, lam: jax.Array,
              fn: Any, *args: Any) -> Any:  # fmt: skip
    """``fn(width, sigma, u, lam, *args)`` at the width ``lam`` needs (per chain)."""
    branches = [lambda o, w=w: fn(w, *o[:3], *o[3]) for w in sizes]
    return lazy_switch(width_index(lam, sizes), branches, (sigma, u, lam, args))


def _with_metric(method: Any) -> Any:
    """``fn`` for ``_at_width`` that calls ``method(metric at the width, *args)``."""
    return lambda w, sigma, u, lam, *args: method(_metric(w, sigma, u, lam), *args)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _kinetic(sizes: tuple[int, ...], p: jax.Array, sigma: jax.Array, u: jax.Array,
             lam: jax.Array) -> jax.Array:  # fmt: skip
    return _at_width(sizes, sigma, u, lam, _with_metric(lambda m, p: m.kinetic_energy(p)), p)


def _kinetic_jvp(sizes: tuple[int, ...], primals: tuple, tangents: tuple) -> tuple:
    """``∂K/∂p = M⁻¹ p`` at the same width; a tangent of ``sigma``, ``U`` or ``λ`` (nothing in
    NUTS differentiates them) goes through blackjax's every-column formula."""
    p, sigma, u, lam = primals
    out = _kinetic(sizes, p, sigma, u, lam)
    dp = tangents[0]
    if isinstance(dp, SymbolicZero):
        tangent = jnp.zeros_like(out)
    else:
        tangent = jnp.dot(_at_width(sizes, sigma, u, lam, _velocity, p), dp)
    if not all(isinstance(t, SymbolicZero) for t in tangents[1:]):
        rest = tuple(jnp.zeros_like(x) if isinstance(t, SymbolicZero) else t
                     for t, x in zip(tangents[1:], primals[1:], strict=True))  # fmt: skip
        full = lambda s, v, lm: _metric(v.shape[1], s, v, lm).kinetic_energy(p)  # noqa: E731
        tangent = tangent + jax.jvp(full, (sigma, u, lam), rest)[1]
    return out, tangent


_kinetic.defjvp(_kinetic_jvp, symbolic_zeros=True)


def _turning(width: int, sigma: jax.Array, u: jax.Array, lam: jax.Array, left: Any,
             right: Any, total: Any) -> jax.Array:  # fmt: skip
    """blackjax's U-turn criterion, ``(M⁻¹p_l)·rho <= 0 or (M⁻¹p_r)·rho <= 0`` with
    ``rho = p_sum - (p_l + p_r)/2``, as ``p_l·(M⁻¹rho)`` and ``p_r·(M⁻¹rho)``: ``M⁻¹`` is
    symmetric, so one product where blackjax's metric takes two. NUTS checks several
    pairs per leapfrog step: measured on the dense 100-d Gaussian (every column, Python
    3.12, 4 chains x (1000 + 1000)), warmup and sampling took 4.1 s against 4.5 s."""
    p_l, _ = ravel_pytree(left)
    p_r, _ = ravel_pytree(right)
    p_sum, _ = ravel_pytree(total)
    w = _velocity(width, sigma, u, lam, p_sum - (p_r + p_l) / 2)
    return (jnp.dot(p_l, w) <= 0) | (jnp.dot(p_r, w) <= 0)


def following_metric(imm: Any) -> Any:
    """blackjax's low-rank ``Metric`` of ``imm``, each operation at the width ``imm``'s
    unmasked directions need (``widths``); any other ``imm``, or one whose rank is the
    only width, is returned as it is.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from blackjax.mcmc.metrics import LowRankInverseMassMatrix, default_metric
        >>> lam = jnp.ones(16).at[0].set(4.0)  # one direction kept of 16
        >>> imm = LowRankInverseMassMatrix(jnp.ones(20), jnp.eye(20)[:, :16], lam)
        >>> p = jnp.arange(20.0)
        >>> a = following_metric(imm).kinetic_energy(p)
        >>> b = default_metric(imm).kinetic_energy(p)
        >>> bool(jnp.allclose(a, b))
        True
    """
    from blackjax.mcmc.metrics import LowRankInverseMassMatrix, Metric

    if not isinstance(imm, LowRankInverseMassMatrix):
        return imm
    sizes = widths(imm.U.shape[1])
    if len(sizes) == 1:
        return imm

    def sample_momentum(rng_key, position):
        from blackjax.util import generate_gaussian_noise

        noise = generate_gaussian_noise(rng_key, position)
        return scale(position, noise, inv=False, trans=False)

    def kinetic_energy(momentum, position=None):
        p, _ = ravel_pytree(momentum)
        return _kinetic(sizes, p, imm.sigma, imm.U, imm.lam)

    def check_turning(left, right, total, position_left=None, position_right=None):
        return _at_width(sizes, *imm, _turning, left, right, total)

    def scale(position, element, *, inv, trans):
        scaled = _with_metric(lambda m, e: m.scale(None, e, inv=inv, trans=trans))
        return _at_width(sizes, *imm, scaled, element)

    return Metric(sample_momentum, kinetic_energy, check_turning, scale)
