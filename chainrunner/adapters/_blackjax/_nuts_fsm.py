"""blackjax's NUTS as a state machine: under ``vmap``, no chain waits for the slowest.

Under ``vmap``, blackjax's NUTS (nested ``while_loop``s: the doublings, the leapfrog steps
of each doubling, the U-turn checks of each step) runs every chain of a batch until the
longest trajectory of the batch ends: at every draw each chain waits for the slowest.
Dance, Glaser, Orbanz & Adams (ICML 2025) recast NUTS as a finite-state machine instead:
each vmapped *tick* advances every chain by one leapfrog step of its own trajectory, and a
chain whose transition ends stores its draw and starts its next transition. A batch then
waits for its slowest chain once per chunk of draws, not once per draw. (Here an ended
chain waits, frozen, until at least a quarter of its batch has ended, and their ends are
processed together: ``quorum``.)

This module is that machine, written from the paper's idea for blackjax's iterative NUTS
(``blackjax.nuts``: multinomial sampling within a doubling, biased progressive sampling
across doublings, numpyro's iterative U-turn checkpoints, the divergence threshold, the
maximum number of doublings), with blackjax's own integrator and metric, and the same
random numbers: a transition's key is split, folded and drawn exactly as blackjax's
kernel does, so a chain sees the same random numbers as under ``blackjax.nuts(...).step``
and its draws equal blackjax's to XLA's rounding (``tests/test_nuts_fsm.py``).

What makes a tick cheap (measured on CPU, ``benchmarks/bench_nuts_fsm.py``):

- each checkpoint keeps its velocity ``v_i``, ``w_i = S_i - r_i / 2`` (momentum sum less
  half the momentum) and ``v_i . w_i``; a U-turn check against all checkpoints is then two
  matrix-vector products, not a ``(depth, dim)`` array per tick (about half the tick);
- a transition's momentum and keys are drawn for the whole chunk before the loop;
- a chain's end (its draw stored, its next transition begun) runs under a ``lax.cond``,
  not as a ``select`` at every tick, and once at least a quarter of the batch has ended
  (``quorum``): until then an ended chain waits, its result frozen (its ``end`` masked);
- a leaf's uniform is drawn by ``core/_threefry``'s written-out hash, not XLA's loop.

``nuts_spec(algorithm)`` recognises a built ``blackjax.nuts(...)``;
``chunk_machine(spec, extract, chunk_len)`` is the batch's chunk of draws. A kernel that
wraps NUTS in a chain state of its own (an in-loop adaptation,
``_warmup_window.adaptive_kernel``: the window's and the diagonal Fisher's; the low-rank
Fisher keeps the plain loop) gives an
``Adaptive``: where the machine reads each
chain's step size and inverse mass matrix at a transition's start, and how a chain's state
moves on (its adaptation updated) when a transition ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ...core import _threefry

__all__ = ["Adaptive", "Spec", "chunk_machine", "nuts_spec"]


class Adaptive(NamedTuple):
    """A chain state that wraps NUTS's and carries its parameters (one chain's functions).

    Attributes:
        inner: ``inner(state) -> HMCState``: the NUTS state inside.
        params: ``params(state) -> (step_size, inverse_mass_matrix)`` the next transition
            runs with (before jitter); the matrix a diagonal ``(d,)`` or dense ``(d, d)``
            array or a ``LowRankInverseMassMatrix`` (blackjax's ``default_metric``).
        finish: ``finish(state, new, info, step_size, adapt) -> (state, extract_info)``:
            the chain state after a transition from ``state`` ended at ``new`` (an
            ``HMCState``) with ``info`` at ``step_size``, and what the kernel's ``extract``
            takes with it; ``adapt=False`` (a Python bool) leaves the adaptation as it is.
        adapting: ``adapting(state) -> bool``: whether ``finish`` from ``state`` adapts
            (``False``: ``finish(..., adapt=False)`` gives the same). The machine skips
            the adaptation while no ending chain adapts (after warmup).
        jitter: the step size is ``step_size * (1 + jitter * u)``, ``u`` uniform in
            ``[-1, 1]`` from the second half of the transition key's split (the first goes to
            NUTS); 0: no split.
    """

    inner: Callable
    params: Callable
    finish: Callable
    adapting: Callable
    jitter: float = 0.0


class Spec(NamedTuple):
    """What a ``blackjax.nuts(...)`` algorithm is built from (``nuts_spec``); with
    ``adaptive``, ``step_size`` and ``metric`` are unused (each chain's come from its state)."""

    logdensity_fn: Callable
    step_size: Any
    metric: Any
    max_num_doublings: int
    divergence_threshold: float
    integrator: Callable
    adaptive: Adaptive | None = None


def nuts_spec(algorithm: Any) -> Spec | None:
    """The ``Spec`` of a ``blackjax.nuts(...)`` ``SamplingAlgorithm``, else ``None``.

    Read from the closures blackjax builds (``build_sampling_algorithm``'s ``step_fn`` over
    ``nuts.build_kernel``'s ``kernel``). Only a Euclidean metric qualifies (the U-turn
    checkpoints keep velocities ``M^-1 p``); anything else, or a blackjax whose closures
    read differently, gives ``None`` and the kernel runs as it is.

    Examples:
        >>> import blackjax, jax.numpy as jnp
        >>> spec = nuts_spec(blackjax.nuts(lambda x: -0.5 * x @ x, 0.5, jnp.ones(2)))
        >>> spec.max_num_doublings, spec.divergence_threshold
        (10, 1000)
        >>> nuts_spec(blackjax.hmc(lambda x: -0.5 * x @ x, 0.5, jnp.ones(2), 3)) is None
        True
    """
    step = getattr(algorithm, "step", None)
    cells = _closure(step)
    kernel = cells.get("kernel")
    if kernel is None or not _made_by(kernel, "blackjax.mcmc.nuts", "build_kernel"):
        return None
    args, logdensity_fn = cells.get("kernel_args"), cells.get("logdensity_fn")
    built = _closure(kernel)
    if not isinstance(args, tuple) or len(args) != 3 or not callable(logdensity_fn):
        return None
    step_size, metric, depth = args
    if not _made_by(getattr(metric, "kinetic_energy", None), "blackjax.mcmc.metrics",
                    "gaussian_euclidean"):  # fmt: skip
        return None
    if "integrator" not in built or "divergence_threshold" not in built:
        return None
    return Spec(logdensity_fn, step_size, metric, int(depth), built["divergence_threshold"],
                built["integrator"])  # fmt: skip


def _closure(fn: Any) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    try:
        return {n: c.cell_contents for n, c in zip(code.co_freevars, cells, strict=True)}
    except ValueError:  # an empty cell
        return {}


def _made_by(fn: Any, module: str, builder: str) -> bool:
    return (getattr(fn, "__module__", None) == module
            and getattr(fn, "__qualname__", "").startswith(builder + ".<locals>."))  # fmt: skip


class Machine(NamedTuple):
    """One chain's transition in progress (flat vectors; batched under the loop).

    ``h``: the transition's step size; ``imm``: its inverse mass matrix (``None``: the
    spec's fixed metric);
    ``ends``: the trajectory's left and right ``(q, p, g)`` rows, ``lends`` their log
    densities; ``front``/``lfront``: the state the current doubling integrates from;
    ``psum``: the merged trajectory's momentum sum, ``n`` its leapfrog steps;
    ``spsum``/``leaf``: the current doubling's; ``prop``/``pstat``: the proposal's
    ``(q, g)`` and ``(logdensity, energy, weight, sum_log_p_accept)``, ``sub``/``sstat``
    the doubling's; ``ck``: checkpoints ``(v, w, v.w)``; ``e0``: initial energy; ``p0``:
    initial momentum; ``right``: the doubling's direction; ``rights``, ``tkeys``, ``us``: each
    doubling's direction, trajectory key (its data) and merge uniform, drawn from the
    transition's key as blackjax draws them; ``count``: draws stored; ``waiting``: its
    transition ended and waits, frozen, for the batch to process its end (``quorum``).
    """

    h: Any
    imm: Any
    ends: Any
    lends: Any
    front: Any
    lfront: Any
    psum: Any
    n: Any
    spsum: Any
    leaf: Any
    doubling: Any
    prop: Any
    pstat: Any
    sub: Any
    sstat: Any
    ck: Any
    e0: Any
    p0: Any
    right: Any
    rights: Any
    tkeys: Any
    us: Any
    turning: Any
    diverging: Any
    count: Any
    waiting: Any


class Parts(NamedTuple):
    """One chain's functions on flat vectors, from a ``Spec`` and an unravel."""

    logdensity: Callable
    unravel: Callable
    key_impl: Any


def _parts(spec: Spec, unravel: Callable, key_impl: Any) -> Parts:
    def logdensity(x):
        return spec.logdensity_fn(unravel(x))

    return Parts(logdensity, unravel, key_impl)


def _metric(spec: Spec, imm: Any) -> Any:
    """The transition's metric: the spec's, or blackjax's of ``imm`` (``default_metric``: a
    diagonal or dense matrix, or a ``LowRankInverseMassMatrix``)."""
    if imm is None:
        return spec.metric
    from blackjax.mcmc import metrics

    return metrics.default_metric(imm)


def _kinetic(metric: Any, p: jax.Array) -> tuple:
    """``(K, M^-1 p)``: blackjax's kinetic energy and its gradient."""
    return jax.value_and_grad(metric.kinetic_energy)(p)


def _randomness(key: jax.Array, depth: int, dtype: Any) -> tuple:
    """A transition's random numbers from its key, as blackjax's kernel draws them:
    ``(momentum key, rights, trajectory keys' data, merge uniforms)``, one per doubling
    (``split(key)``, then ``split(fold_in(integrator key, j), 3)`` for doubling ``j``: its
    direction, the key its leaves fold in, and the uniform of its ``bernoulli`` merge)."""
    momentum_key, integrator_key = jax.random.split(key, 2)

    def doubling(j):
        direction_key, tkey, pkey = jax.random.split(jax.random.fold_in(integrator_key, j), 3)
        u = jax.random.uniform(pkey, dtype=dtype)
        return jax.random.bernoulli(direction_key), jax.random.key_data(tkey), u

    return (momentum_key, *jax.vmap(doubling)(jnp.arange(depth)))


def _begin(spec: Spec, q, lq, g, p, h, imm, rights, tkeys, us, count) -> Machine:
    """A transition from ``(q, lq, g)`` with momentum ``p``, step size ``h`` and inverse
    mass matrix ``imm`` (blackjax's kernel's start)."""
    depth, dim = spec.max_num_doublings, q.shape[0]
    kinetic, _ = _kinetic(_metric(spec, imm), p)
    e0 = -lq + kinetic
    qpg = jnp.stack([q, p, g])
    zero, false = jnp.zeros((), q.dtype), jnp.bool_(False)
    zero_int = jnp.zeros((), int)  # blackjax's counts: int64 where x64 is on
    return Machine(
        h=h, imm=imm, ends=jnp.stack([qpg, qpg]), lends=jnp.stack([lq, lq]), front=qpg, lfront=lq,
        psum=p, n=zero_int, spsum=jnp.zeros_like(p), leaf=zero_int,
        doubling=zero_int, prop=jnp.stack([q, g]),
        pstat=jnp.stack([lq, e0, zero, jnp.full((), -jnp.inf, q.dtype)]),
        sub=jnp.stack([q, g]), sstat=jnp.stack([lq, e0, zero, zero]),
        ck=(jnp.zeros((depth, dim), q.dtype), jnp.zeros((depth, dim), q.dtype),
            jnp.zeros((depth,), q.dtype)),
        e0=e0, p0=p, right=rights[0], rights=rights, tkeys=tkeys, us=us, turning=false,
        diverging=false, count=count, waiting=false,
    )  # fmt: skip


def _leaf(parts: Parts, spec: Spec, m: Machine) -> tuple:
    """One leapfrog step of the doubling and its multinomial sample (``add_one_state``)."""
    from blackjax.mcmc import integrators

    q, p, g = m.front
    h = jnp.where(m.right, 1, -1) * m.h
    metric = _metric(spec, m.imm)
    step = spec.integrator(parts.logdensity, metric.kinetic_energy)
    new = step(integrators.IntegratorState(q, p, m.lfront, g), h)
    kinetic, v = _kinetic(metric, new.momentum)
    energy = -new.logdensity + kinetic
    w = m.e0 - energy
    w = jnp.where(jnp.isnan(w), -jnp.inf, w)
    first = m.leaf == 0
    u = _leaf_uniform(parts, m.tkeys[m.doubling], m.leaf, w.dtype)
    take = first | (u < jax.scipy.special.expit(w - m.sstat[2]))
    sw = jnp.where(first, w, jnp.logaddexp(m.sstat[2], w))
    sa = jnp.where(first, jnp.minimum(w, 0.0), jnp.logaddexp(m.sstat[3], jnp.minimum(w, 0.0)))
    sub = jnp.where(take, jnp.stack([new.position, new.logdensity_grad]), m.sub)
    sl = jnp.where(take, new.logdensity, m.sstat[0])
    sstat = jnp.stack([sl, jnp.where(take, energy, m.sstat[1]), sw, sa])
    return new, v, sub, sstat, -w > spec.divergence_threshold


def _leaf_uniform(parts: Parts, tkey: jax.Array, leaf: jax.Array, dtype: Any) -> jax.Array:
    """The uniform of a doubling's leaf ``leaf`` (``uniform(fold_in(tkey, leaf))``), from
    ``core/_threefry`` for threefry keys and float32 (the same bits; written out, not the
    rolled hash loop XLA makes of JAX's on CPU)."""
    if _threefry.is_threefry_impl(parts.key_impl) and jnp.dtype(dtype) == jnp.float32:
        return _threefry.uniform(_threefry.fold_in(tkey, leaf))
    tkey = jax.random.wrap_key_data(tkey, impl=parts.key_impl)
    return jax.random.uniform(jax.random.fold_in(tkey, leaf), dtype=dtype)


def _checkpoints(m: Machine, p, v, spsum) -> tuple:
    """numpyro's iterative U-turn check at leaf ``m.leaf`` (``iterative_uturn_numpyro``).

    With ``rho_i = S - S_i + r_i - (r + r_i) / 2 = x - w_i`` (``x = S - r / 2``), the two
    tests ``v_i . rho_i <= 0`` and ``v . rho_i <= 0`` read ``v_i . x - v_i . w_i`` and
    ``v . x - w_i . v``."""
    n = m.leaf
    idx_max = jax.lax.population_count(n >> 1)
    idx_min = idx_max - jax.lax.population_count((~n & (n + 1)) - 1) + 1
    x = spsum - 0.5 * p
    rows = jnp.arange(m.ck[0].shape[0])
    put = (rows == idx_max) & (n % 2 == 0)
    V = jnp.where(put[:, None], v, m.ck[0])
    W = jnp.where(put[:, None], x, m.ck[1])
    c = jnp.where(put, v @ x, m.ck[2])
    turned = (V @ x - c <= 0) | (v @ x - W @ v <= 0)
    return (V, W, c), jnp.any(turned & (rows >= idx_min) & (rows <= idx_max))


def _tick(parts: Parts, spec: Spec, m: Machine) -> Machine:
    """One leapfrog step; where the doubling ends, its merge (``expand_once``'s end) and
    the next doubling's start. A chain whose transition ends
    waits (``waiting``) until the batch processes its end."""
    new, v, sub, sstat, diverging = _leaf(parts, spec, m)
    spsum = m.spsum + new.momentum
    ck, sub_turning = _checkpoints(m, new.momentum, v, spsum)
    leaf = m.leaf + 1
    # A chain whose transition ended waits, its result frozen, until its end is processed.
    end = ((leaf >= (1 << m.doubling)) | sub_turning | diverging) & ~m.waiting
    rejected = diverging | sub_turning
    u = m.us[m.doubling]
    accept = end & ~rejected & (u < jnp.clip(jnp.exp(sstat[2] - m.pstat[2]), max=1))
    pw = jnp.where(end & ~rejected, jnp.logaddexp(m.pstat[2], sstat[2]), m.pstat[2])
    pa = jnp.where(end, jnp.logaddexp(m.pstat[3], sstat[3]), m.pstat[3])
    pstat = jnp.stack([jnp.where(accept, sstat[0], m.pstat[0]),
                       jnp.where(accept, sstat[1], m.pstat[1]), pw, pa])  # fmt: skip
    qpg = jnp.stack([new.position, new.momentum, new.logdensity_grad])
    side = m.right.astype(jnp.int32)
    ends = m.ends.at[side].set(jnp.where(end, qpg, m.ends[side]))
    lends = m.lends.at[side].set(jnp.where(end, new.logdensity, m.lends[side]))
    psum = m.psum + jnp.where(end, spsum, 0)
    turning = sub_turning | _metric(spec, m.imm).check_turning(ends[0, 1], ends[1, 1], psum)
    doubling = m.doubling + end
    done = end & ((doubling >= spec.max_num_doublings) | diverging | turning)
    right = m.rights[jnp.minimum(doubling, spec.max_num_doublings - 1)]
    nside = right.astype(jnp.int32)
    # A waiting chain integrates the same step again rather than marching on (after a
    # divergence, far out): nothing of it is read until its next transition begins.
    step_on = jnp.where(m.waiting, m.front, qpg), jnp.where(m.waiting, m.lfront, new.logdensity)
    m = m._replace(
        ends=ends, lends=lends, front=jnp.where(end, ends[nside], step_on[0]),
        lfront=jnp.where(end, lends[nside], step_on[1]), psum=psum,
        n=m.n + jnp.where(end, leaf, 0), spsum=jnp.where(end, 0, spsum),
        leaf=jnp.where(end, 0, leaf), doubling=doubling,
        prop=jnp.where(accept, sub, m.prop), pstat=pstat, sub=sub, sstat=sstat, ck=ck,
        right=jnp.where(end, right, m.right),
        turning=jnp.where(end, turning, m.turning),
        diverging=jnp.where(end, diverging, m.diverging), waiting=m.waiting | done,
    )  # fmt: skip
    return m


def _result(parts: Parts, m: Machine) -> tuple[Any, Any]:
    """``(HMCState, NUTSInfo)`` of an ended transition, as ``blackjax.nuts`` returns them."""
    from blackjax.mcmc import hmc, integrators, nuts

    u = parts.unravel

    def end(i):
        q, p, g = m.ends[i]
        return integrators.IntegratorState(u(q), u(p), m.lends[i], u(g))

    state = hmc.HMCState(u(m.prop[0]), m.pstat[0], u(m.prop[1]))
    acceptance = jnp.exp(m.pstat[3]) / m.n
    info = nuts.NUTSInfo(u(m.p0), m.diverging, m.turning, m.pstat[1], end(0), end(1),
                         m.doubling, m.n, acceptance)  # fmt: skip
    return state, info


def _sqrt_mass(metric: Any) -> Any:
    """``sqrt(M)`` as blackjax's Gaussian metric samples momenta with, or ``None``."""
    return _closure(getattr(metric, "sample_momentum", None)).get("mass_matrix_sqrt")


def _normals(keys: jax.Array, q: jax.Array) -> jax.Array:
    """The standard normals of each transition's momentum, ``(chain, draw, dim)``, as
    blackjax's ``generate_gaussian_noise`` draws them; from ``core/_threefry`` where the
    keys are threefry's and the positions float32."""
    if _threefry.is_threefry(keys) and q.dtype == jnp.float32:
        return _threefry.normal(jax.random.key_data(keys), q.shape[-1])
    return jax.vmap(jax.vmap(lambda k: jax.random.normal(k, q.shape[-1:], q.dtype)))(keys)


def _momenta(spec: Spec, parts: Parts, keys: jax.Array, q: jax.Array) -> jax.Array:
    """Each transition's momentum under the spec's fixed metric, ``(chain, draw, dim)``:
    blackjax's ``sample_momentum`` (``sqrt(M) @ normal(key)``), by ``_normals`` where the
    metric's square root can be read (``gaussian_euclidean``'s)."""
    from blackjax.util import linear_map

    sqrt_m = _sqrt_mass(spec.metric)
    if sqrt_m is None:

        def momentum(key, q):
            return ravel_pytree(spec.metric.sample_momentum(key, parts.unravel(q)))[0]

        return jax.vmap(jax.vmap(momentum, (0, None)))(keys, q)
    return 0.0 + jax.vmap(jax.vmap(lambda z: linear_map(sqrt_m, z)))(_normals(keys, q))


def _scaled(spec: Spec, imm: Any, z: jax.Array) -> jax.Array:
    """One chain's momentum from its standard normals ``z`` under inverse mass matrix
    ``imm``: ``M^(1/2) z`` (the metric's ``scale``), as its ``sample_momentum`` makes it
    from the same normals."""
    return 0.0 + _metric(spec, imm).scale(z, z, inv=False, trans=False)


def _chunk_randomness(step_keys: jax.Array, steps: jax.Array, depth: int, dtype: Any,
                      jitter: float = 0.0) -> tuple:  # fmt: skip
    """``_randomness`` of every chain's transitions ``steps`` (keys ``fold_in(step_key,
    t)``), each output with leading axes ``(chain, draw)``, and the jitter uniforms in
    ``[-1, 1]`` (``None`` without jitter: the transition key goes to NUTS whole, else the
    first half of its split, as ``_warmup_window.jittered`` does). For threefry keys and
    float32, from ``core/_threefry`` (the same bits, a fraction of the compile)."""
    if not (_threefry.is_threefry(step_keys) and jnp.dtype(dtype) == jnp.float32):
        keys = jax.vmap(lambda k: jax.vmap(jax.random.fold_in, (None, 0))(k, steps))(step_keys)
        jitters = None
        if jitter:
            pairs = jax.vmap(jax.vmap(jax.random.split))(keys)
            keys = pairs[..., 0]
            jitters = jax.vmap(jax.vmap(
                lambda k: jax.random.uniform(k, (), dtype, -1.0, 1.0)))(pairs[..., 1])  # fmt: skip
        return (*jax.vmap(jax.vmap(lambda k: _randomness(k, depth, dtype)))(keys), jitters)
    keys = _threefry.fold_in(jax.random.key_data(step_keys)[:, None, :], steps)
    jitters = None
    if jitter:
        halves = _threefry.split(keys, 2)
        keys, jitters = halves[..., 0, :], _threefry.uniform(halves[..., 1, :], -1.0, 1.0)
    pair = _threefry.split(keys, 2)
    doublings = _threefry.fold_in(pair[..., 1, None, :], np.arange(depth, dtype=np.uint32))
    direction, tkey, pkey = jnp.moveaxis(_threefry.split(doublings, 3), -2, 0)
    momentum_keys = jax.random.wrap_key_data(pair[..., 0, :], impl="threefry2x32")
    return (momentum_keys, _threefry.uniform(direction) < 0.5, tkey, _threefry.uniform(pkey),
            jitters)  # fmt: skip


def _starter(spec: Spec, parts: Parts, step_keys: jax.Array, start: jax.Array, q: jax.Array,
             chunk_len: int) -> Callable:  # fmt: skip
    """``begin_at(count, q, lq, g, states)``: each chain's transition number ``count`` of the
    chunk begun from ``(q, lq, g)`` (chain states ``states`` give the adapted parameters),
    its random numbers drawn for the whole chunk here, before the loop."""
    ad = spec.adaptive
    rows = jnp.arange(q.shape[0])
    steps = start + jnp.arange(chunk_len)
    momentum_keys, *subtrees, jitters = _chunk_randomness(
        step_keys, steps, spec.max_num_doublings, q.dtype, 0.0 if ad is None else ad.jitter
    )
    if ad is None:
        momenta = _momenta(spec, parts, momentum_keys, q)
        h = jnp.full(q.shape[0], spec.step_size)
    else:
        normals = _normals(momentum_keys, q)
    begin = jax.vmap(lambda *a: _begin(spec, *a))

    def begin_at(count, q, lq, g, states):
        at = jnp.minimum(count, chunk_len - 1)
        drawn = (x[rows, at] for x in subtrees)
        if ad is None:
            return begin(q, lq, g, momenta[rows, at], h, None, *drawn, count)
        step_size, imm = jax.vmap(ad.params)(states)
        if jitters is not None:
            step_size = step_size * (1.0 + ad.jitter * jitters[rows, at])
        p = jax.vmap(lambda i, z: _scaled(spec, i, z))(imm, normals[rows, at])
        return begin(q, lq, g, p, step_size, imm, *drawn, count)

    return begin_at


def _finisher(spec: Spec, parts: Parts, extract: Callable) -> Callable:
    """``result(m, states, fin) -> (states, (draws, stats))`` of every chain's ended
    transition (``fin``: the chains whose end counts; the adaptation runs only where one
    of them adapts)."""
    ad = spec.adaptive

    def result(m, states, fin):
        state, info = jax.vmap(lambda m: _result(parts, m))(m)
        if ad is not None:

            def finish(adapt):
                return jax.vmap(lambda *a: ad.finish(*a, adapt))(states, state, info, m.h)

            adapting = jnp.any(fin & jax.vmap(ad.adapting)(states))
            state, info = jax.lax.cond(adapting, lambda: finish(True), lambda: finish(False))
        return state, jax.vmap(extract)(state, info)

    return result


def quorum(width: int) -> int:
    """How many chains of a batch of ``width`` wait, their transitions ended, before the
    batch processes their ends together (fewer if fewer chains still draw).

    A chain's end (its draw stored, its adaptation, its next transition begun) runs for the
    whole batch, so processing it at every tick where one chain ended costs as much as a
    tick on short trajectories; a waiting chain loses its ticks. A quarter of the batch
    measured best (``bench_nuts_fsm.py --quorums``, ``docs/batches.md``): 1.22-1.32x on
    window-adapted eight schools at 8-32 chains per device, 0.96-1.09x elsewhere. A
    function of the width only, and the draws are the same whatever it is.
    """
    return max(1, width // 4)


def chunk_machine(spec: Spec, extract: Callable, chunk_len: int) -> Callable:
    """The batch's chunk loop: ``loop(states, step_keys, start, n_valid) -> (states,
    (draws, stats))`` for ``b`` chains at once (leading axis ``b`` on ``states`` and
    ``step_keys``; ``start``, ``n_valid`` scalars), as ``programs.chunk_loop``'s loop
    vmapped: draw ``i`` of a chain is the transition with key ``fold_in(step_key, start
    + i)``; ``n_valid`` draws are stored, the other rows of the ``chunk_len`` stay zeros.
    ``extract(state, info)`` gives a draw's ``(draw, stats)``. With ``spec.adaptive`` the
    states are the wrapper's, and each transition runs at its chain's parameters.
    """

    def loop(states, step_keys, start, n_valid):
        inner = states if spec.adaptive is None else jax.vmap(spec.adaptive.inner)(states)
        unravel = ravel_pytree(jax.tree.map(lambda x: x[0], inner.position))[1]
        parts = _parts(spec, unravel, jax.random.key_impl(step_keys))
        flat = jax.vmap(lambda x: ravel_pytree(x)[0])
        q, g, lq = flat(inner.position), flat(inner.logdensity_grad), inner.logdensity
        b, rows = q.shape[0], jnp.arange(q.shape[0])
        wait_for = quorum(b)
        begin_at = _starter(spec, parts, step_keys, start, q, chunk_len)
        result = _finisher(spec, parts, extract)
        m = begin_at(jnp.zeros(b, jnp.int32), q, lq, g, states)
        shapes = jax.eval_shape(result, m, states, jnp.ones(b, bool))[1]
        buffers = jax.tree.map(lambda s: jnp.zeros((b, chunk_len, *s.shape[1:]), s.dtype),
                               shapes)  # fmt: skip

        def ended(carry, fin):
            # ``last`` holds each chain's state at its transition's start until it ends.
            m, last, buffers = carry
            at = jnp.where(fin, m.count, chunk_len)  # out of range: dropped
            state, out = result(m, last, fin)
            buffers = jax.tree.map(lambda buf, o: buf.at[rows, at].set(o, mode="drop"),
                                   buffers, out)  # fmt: skip
            last = jax.tree.map(lambda a, b_: _select(fin, a, b_), state, last)
            count = m.count + fin
            nxt = begin_at(count, m.prop[:, 0], m.pstat[:, 0], m.prop[:, 1], last)
            # The checkpoints and the doubling's sample are written before they are read.
            nxt = nxt._replace(ck=m.ck, sub=m.sub, sstat=m.sstat)
            m = jax.tree.map(lambda a, b_: _select(fin, a, b_), nxt, m)
            return m, last, buffers

        def body(carry):
            # A chain with all its draws ticks on until its extra transition ends, then
            # waits, frozen; nothing of it is stored any more.
            m, last, buffers = carry
            m = jax.vmap(lambda m: _tick(parts, spec, m))(m)
            running = m.count < n_valid
            fin = running & m.waiting
            due = jnp.sum(fin) >= jnp.minimum(wait_for, jnp.sum(running))
            return jax.lax.cond(due, ended, lambda c, f: c, (m, last, buffers), fin)

        _, last, buffers = jax.lax.while_loop(
            lambda c: jnp.any(c[0].count < n_valid), body, (m, states, buffers)
        )
        return last, buffers

    return loop


def _select(flag: jax.Array, a: Any, b: Any) -> Any:
    """``a`` where ``flag`` (one per chain, the leading axis), else ``b``."""
    return jnp.where(flag.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
