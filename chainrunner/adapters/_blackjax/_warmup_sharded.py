"""ChEES and MEADS, the one implementation of both layouts (``"sharded"``, ``"replicated"``).

blackjax's ``chees_adaptation`` and ``meads_adaptation`` step every chain with one
``vmap`` and update the shared parameters from the whole ensemble. Here the same
algorithms (blackjax 1.7.1's steps, keys and updates, with blackjax's kernels and
``base()`` functions) run inside ``shard_map`` over ``'chain'`` (``_collective``):

- the ensemble (every chain's state), the adaptation state and the key are replicated:
  every device holds the same bits;
- each step's per-chain work (initialisation, the kernel step) goes through
  ``_collective.spread``: a device steps its block of chains in batches of exactly the
  batch width (``_rows``), and ``all_gather`` hands every chain's new state back to every
  device, in chain order, the padding rows dropped;
- the adaptation update then runs on every device from the same full arrays of the
  real chains.

So the results are bitwise the same on any device count and any padding as long as the
batch width is the same, and the kernel steps, the costly part, are split over the
devices. With ``layout="replicated"`` (``Shape.replicated``) every device steps all
chains in one ``vmap`` instead (``_all_rows``): bitwise blackjax's own ``run``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ...core._naming import warmup_stats
from ...layout import _collective, _distributed, _mesh
from ...programs._compile import compiled

Rows = Callable[[Callable, Any], Any]


class Steps(NamedTuple):
    """A cross-chain warmup as its steps: what a ``method`` returns.

    ``carry``: the state before the first step (the chains' states first);
    ``step(carry, step_key) -> (carry, Record)``: one warmup step; ``keys``: every
    step's key, in order; ``params(carry)``: the adapted parameters for sampling.
    A chunk of steps ``first .. first + count - 1`` runs ``step`` over those keys:
    chunks in a row give the same carry as the whole warmup in one loop.
    """

    carry: Any
    step: Callable
    keys: Any
    params: Callable


class Record(NamedTuple):
    """What one warmup step keeps with ``keep_warmup``: every real chain's values."""

    position: Any
    logdensity: Any
    acceptance_rate: Any
    is_divergent: Any
    step_size: Any
    n_steps: Any = None


def chees_jitter(jitter_amount: float) -> Callable:
    """ChEES's Halton jitter of the trajectory length, with 20 bits.

    blackjax's ``chees_adaptation`` uses ``halton_sequence(i, ceil(log2(num_warmup +
    max_sampling_steps)))``; chainrunner asks for ``max_sampling_steps = 2**20 -
    num_warmup``, so 20 bits, and the sampling kernel continues the same sequence.

    Examples:
        >>> from chainrunner.adapters._blackjax._warmup_sharded import chees_jitter
        >>> import jax.numpy as jnp
        >>> float(chees_jitter(1.0)(jnp.int32(0)))
        0.5
    """
    import blackjax.mcmc.dynamic_hmc as dynamic_hmc

    max_bits = np.float64(20.0)

    def jitter(i):
        return dynamic_hmc.halton_sequence(i, max_bits) * jitter_amount + (1.0 - jitter_amount)

    return jitter


def _record(states, info, step_size) -> Record:
    return Record(
        states.position, states.logdensity, info.acceptance_rate, info.is_divergent, step_size
    )


def chees(logdensity_fn: Callable, o: dict, n: int, num_warmup: int, key, positions, rows: Rows):
    """blackjax 1.7.1's ChEES run (identity mass matrix), kernel steps through ``rows``,
    as ``Steps``."""
    import blackjax.mcmc.dynamic_hmc as dynamic_hmc
    import optax
    from blackjax.adaptation.chees_adaptation import base

    jitter = chees_jitter(o["jitter_amount"])

    def integration_steps_fn(random_generator_arg, num_leapfrog_steps):
        return jnp.asarray(jnp.ceil(jitter(random_generator_arg) * num_leapfrog_steps), dtype=int)

    step_fn = dynamic_hmc.build_kernel(
        next_random_arg_fn=lambda i: i + 1, integration_steps_fn=integration_steps_fn
    )
    init, update = base(
        jitter,
        lambda i: i + 1,
        optax.adam(o["learning_rate"]),
        o["target_acceptance_rate"],
        o["decay_rate"],
        o["max_leapfrog_steps"],
        True,
    )
    num_dim = ravel_pytree(jax.tree.map(lambda x: x[0], positions))[0].shape[0]
    imm = jnp.ones(num_dim)

    def one_step(carry, step_key):
        states, a = carry
        keys = jax.random.split(step_key, n)

        def one_chain(args):
            k, s = args
            steps = (a.trajectory_length / a.step_size,)
            return step_fn(k, s, logdensity_fn, a.step_size, imm, integration_steps_params=steps)

        new, info = rows(one_chain, (keys, states))
        new_a = update(
            a,
            info.proposal.position,
            info.proposal.momentum,
            states.position,
            info.acceptance_rate,
            info.is_divergent,
            imm,
        )
        return (new, new_a), _record(new, info, new_a.step_size)

    def params(carry):
        a = carry[1]
        return {
            "step_size": jnp.exp(a.log_step_size_moving_average),
            "num_leapfrog_steps": jnp.exp(
                a.log_trajectory_length_moving_average - a.log_step_size_moving_average
            ),
        }

    states = rows(lambda p: dynamic_hmc.init(p, logdensity_fn, 0), positions)
    carry = (states, init(0, o["step_size"]))
    return Steps(carry, one_step, jax.random.split(key, num_warmup), params)


class _FoldParams(NamedTuple):
    """MEADS's per-chain kernel parameters of one step, and the new adaptation state."""

    step_size: Any
    scale: Any
    alpha: Any
    delta: Any
    state: Any


def _meads_parameters(states, t, num_folds: int, o: dict) -> _FoldParams:
    """blackjax 1.7.1 ``meads_adaptation``'s one_step parameters (diagonal metric)."""
    from blackjax.adaptation.meads_adaptation import MEADSAdaptationState, maximum_eigenvalue

    n_per_fold = jax.tree.leaves(states.position)[0].shape[0] // num_folds

    def to_folds(x):
        return x.reshape((num_folds, n_per_fold, *x.shape[1:]))

    folded_pos = jax.tree.map(to_folds, states.position)
    folded_grads = jax.tree.map(to_folds, states.logdensity_grad)
    folded_scales = jax.tree.map(lambda p: p.std(axis=1), folded_pos)
    precond_grads = jax.tree.map(
        lambda g, s: g * jnp.expand_dims(s, axis=1), folded_grads, folded_scales
    )

    def fold_step_size(grads_k):
        eig = maximum_eigenvalue(grads_k)
        return jnp.minimum(o["step_size_multiplier"] / jnp.sqrt(eig), 1.0)

    step_size_rolled = jnp.roll(jax.vmap(fold_step_size)(precond_grads), 1)
    scales_rolled = jax.tree.map(lambda s: jnp.roll(s, 1, axis=0), folded_scales)

    def fold_damping(pos_k, eps_k):
        pos_k_centered = jax.tree.map(lambda p: p - p.mean(axis=0), pos_k)
        gamma = jnp.maximum(
            1.0 / jnp.sqrt(maximum_eigenvalue(pos_k_centered)),
            o["damping_slowdown"] / ((t + 1) * eps_k),
        )
        alpha = 1.0 - jnp.exp(-2.0 * eps_k * gamma)
        return alpha, alpha / 2

    precond_pos = jax.tree.map(
        lambda p, s: p / jnp.expand_dims(s, axis=1), folded_pos, folded_scales
    )
    alphas, deltas = jax.vmap(fold_damping)(precond_pos, step_size_rolled)
    return _FoldParams(
        jnp.repeat(step_size_rolled, n_per_fold),
        jax.tree.map(lambda s: jnp.repeat(s, n_per_fold, axis=0), scales_rolled),
        jnp.repeat(alphas, n_per_fold),
        jnp.repeat(deltas, n_per_fold),
        MEADSAdaptationState(t + 1, step_size_rolled, scales_rolled, alphas, deltas),
    )


def _meads_after(new_states, states, t, shuffle_key, num_folds: int):
    """MEADS's skipped fold (restored) and its reshuffle every ``num_folds`` steps."""
    if num_folds == 1:
        return new_states
    n = jax.tree.leaves(states.position)[0].shape[0]
    skipped = jnp.repeat(jnp.arange(num_folds) == t % num_folds, n // num_folds)

    def restore(new, old):
        return jnp.where(skipped.reshape(skipped.shape + (1,) * (new.ndim - 1)), old, new)

    new_states = jax.tree.map(restore, new_states, states)
    perm = jax.random.permutation(shuffle_key, n)
    return jax.lax.cond(
        (t + 1) % num_folds == 0,
        lambda s: jax.tree.map(lambda x: x[perm], s),
        lambda s: s,
        new_states,
    )


def meads(logdensity_fn: Callable, o: dict, n: int, num_warmup: int, key, positions, rows: Rows):
    """blackjax 1.7.1's MEADS run (diagonal metric), kernel steps through ``rows``, as
    ``Steps``; ``o["num_folds"]`` is the resolved fold count."""
    import blackjax.mcmc.ghmc as ghmc
    from blackjax.adaptation.meads_adaptation import base

    num_folds = o["num_folds"]
    kernel = ghmc.build_kernel()

    def one_step(carry, step_key):
        states, a = carry
        t = a.current_iteration
        keys = jax.random.split(step_key, n + 1)
        f = _meads_parameters(states, t, num_folds, o)

        def one_chain(args):
            k, s, eps, scale, alpha, delta = args
            return kernel(k, s, logdensity_fn, eps, scale, alpha, delta)

        new, info = rows(one_chain, (keys[:n], states, f.step_size, f.scale, f.alpha, f.delta))
        new = _meads_after(new, states, t, keys[n], num_folds)
        return (new, f.state), _record(new, info, f.state.step_size.mean(axis=-1))

    key_init, key_adapt = jax.random.split(key)
    chain_keys = jax.random.split(key_init, n)
    states = rows(lambda a: ghmc.init(a[0], logdensity_fn, a[1]), (positions, chain_keys))
    adapt_init, _ = base(num_folds, o["step_size_multiplier"], o["damping_slowdown"])
    carry = (states, adapt_init(positions, states.logdensity_grad))

    def params(carry):
        a = carry[1]
        return {
            "step_size": a.step_size.mean(),
            "momentum_inverse_scale": jax.tree.map(lambda s: s.mean(axis=0), a.position_sigma),
            "alpha": a.alpha.mean(),
            "delta": a.delta.mean(),
        }

    return Steps(carry, one_step, jax.random.split(key_adapt, num_warmup), params)


METHODS = {"chees": chees, "meads": meads}


class Shape(NamedTuple):
    """What a compiled warmup depends on, besides the adapter.

    ``replicated``: every device steps every chain in one ``vmap`` (``layout=
    "replicated"``; ``batch_size`` then plays no part) rather than its block of them.
    """

    num_chains: int
    padded: int
    num_warmup: int
    keep: bool
    mesh: Any
    batch_size: int | str | None
    replicated: bool = False


def _rows(devices: int, batch_size: int | str | None, num_chains: int) -> Rows:
    """``fn`` over the rows of a replicated batch, spread over ``devices`` (``spread``).

    The width: the run's ``batch_size`` when it is a number; ``"auto"``: an eighth of
    the chains (``_collective.auto_width``; ChEES and MEADS step every chain the same
    number of leapfrog steps, so a ``vmap`` loses nothing to lock-step); ``None``: one
    batch per device. The first two do not depend on the device count.
    """
    width = _collective.auto_width(num_chains) if batch_size == "auto" else batch_size

    def rows(fn: Callable, xs: Any) -> Any:
        return _collective.spread(fn, xs, devices=devices, width=width)

    return rows


def _all_rows(fn: Callable, xs: Any) -> Any:
    """``fn`` over every row of ``xs`` in one ``vmap``, on every device (as blackjax's ``run``)."""
    return jax.vmap(fn)(xs)


def _chain_block(tree: Any, n: int, padded: int, per: int) -> Any:
    """This device's ``per`` rows of ``tree``'s ``n`` rows padded to ``padded``."""
    return _collective.mine(_mesh.pad(tree, n, padded), per)


class Program(NamedTuple):
    """A sharded warmup's programs: ``chunk(length)``, the ``jit(shard_map(...))`` of
    ``length`` steps, ``(carry, key, state, first) -> outputs``; ``carry_like(key,
    state)``, the shapes and dtypes of its carry and of the adapted parameters (one
    device's copy)."""

    chunk: Callable[[int], Callable]
    carry_like: Callable


def program(method: Callable, logdensity_fn: Callable, o: dict, s: Shape, salt: int) -> Program:
    """The sharded warmup's ``Program``: steps ``first .. first + length - 1`` per call.

    ``key`` and ``state`` (the padded chain states) come in replicated, ``first`` as a
    scalar; ``carry`` with a leading device axis, every device's copy of the same bits
    (at ``first=0`` its values are unused: the warmup starts from ``state``). Every output
    is split over ``'chain'`` (``_mesh.shard_chains``): the carry after the chunk and the
    adapted parameters with a leading device axis; the chains' states and, with
    ``keep``, the chunk's draws and stats as padded chain-sharded arrays.

    The steps run as a ``lax.scan`` of ``length`` (a loop whose trip count is a
    run-time argument rounds otherwise on jax 0.10: ChEES's draws parted from the
    second step), so a warmup whose length is not a whole number of chunks compiles a
    second program for its last chunk (``_loop.warmup_chunk`` picks a chunk that divides
    the warmup where one does).
    """
    devices = s.mesh.shape[_mesh.AXIS]
    per = s.padded // devices
    n = s.num_chains

    rows = _all_rows if s.replicated else _rows(devices, s.batch_size, n)

    def steps_of(rng_key, state, rows):
        real = jax.tree.map(lambda x: x[:n], state)  # the padding chains never enter
        key = jax.random.fold_in(rng_key, salt)
        return real, method(logdensity_fn, o, n, s.num_warmup, key, real.position, rows)

    def carry_like(rng_key, state):  # (the same shapes whatever the rows' layout)
        def start(k, x):
            steps = steps_of(k, x, _all_rows)[1]
            return steps.carry, steps.params(steps.carry)

        return jax.eval_shape(start, rng_key, state)

    def body(length, carry, rng_key, state, first):
        real, steps = steps_of(rng_key, state, rows)
        carry = jax.tree.map(  # the start is computed on every chunk, used on the first
            lambda fresh, c: jnp.where(first == 0, fresh, c[0]), steps.carry, carry
        )
        keys = jax.lax.dynamic_slice_in_dim(steps.keys, first, length)
        carry, records = jax.lax.scan(steps.step, carry, keys)
        last = jax.tree.map(lambda new, old: new.astype(old.dtype), carry[0], real)
        params = jax.tree.map(lambda x: jnp.asarray(x)[None], steps.params(carry))
        out = (jax.tree.map(lambda x: x[None], carry), params, _chain_block(last, n, s.padded, per))
        if not s.keep:
            return *out, None, None
        draws = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), records.position)
        return *out, *_chain_block((draws, _stats(records, n)), n, s.padded, per)

    def chunk(length: int) -> Callable:
        return _mesh.shard_chains(functools.partial(body, length), s.mesh, 1, 3)

    return Program(chunk, carry_like)


class Chunks(NamedTuple):
    """A sharded warmup as ``run`` drives it: ``WarmupChunks``' functions but ``finish``,
    whose part here, ``last(carry) -> (new state, params)``, the adapter completes."""

    start: Callable
    step: Callable
    last: Callable
    fingerprint: Callable


def run_chunks(program: Program, rng_key: jax.Array, state: Any, num_chains: int,
               mesh: Any, chunk: int) -> Chunks:  # fmt: skip
    """A ``program``'s warmup in chunks of ``chunk`` steps, each length's program compiled
    once (on its first chunk, or by ``fingerprint``: the digest of the first's text).

    The carry: ``((chain states, params), warmup carry)``, the states padded and split
    over ``'chain'``, the rest with a leading device axis. ``last`` gives ``(new state,
    params)``, the parameters once (every device returns the same copy); a chunk's draws
    and stats come to the host, cut to the ``num_chains`` real chains (``None`` unless
    kept).
    """
    key, replicated = _mesh.replicate(rng_key, mesh), _mesh.replicate(state, mesh)
    devices = mesh.shape[_mesh.AXIS]
    executables: dict[int, Any] = {}

    @functools.cache
    def start() -> Any:  # (asked again by a checkpoint: traced once)
        carry, params = program.carry_like(rng_key, state)
        # numpy zeros, placed: no program compiled for them (jnp.zeros compiles one per shape)
        zeros = jax.tree.map(lambda x: np.zeros((devices, *x.shape), x.dtype), (params, carry))
        params, carry = _mesh.place(zeros, mesh)
        return (state, params), carry

    def executable(count: int, args: tuple) -> Any:
        if count not in executables:
            executables[count] = compiled("warmup", program.chunk(count), args)[0]
        return executables[count]

    def arguments(carry: Any, first: int) -> tuple:
        return (carry[1], key, replicated, _mesh.replicate(jnp.int32(first), mesh))

    def step(carry: Any, first: int, count: int) -> tuple:
        args = arguments(carry, first)
        c, params, new_state, draws, stats = executable(count, args)(*args)
        if draws is not None:
            kept = _distributed.to_host((draws, stats))
            draws, stats = jax.tree.map(lambda x: x[:num_chains], kept)
        return ((new_state, params), c), draws, stats

    def last(carry: Any) -> tuple:
        (new_state, params), _ = carry
        return new_state, jax.tree.map(lambda x: x[0], _distributed.to_host(params))

    def fingerprint() -> str:
        return executable(chunk, arguments(start(), 0)).digest

    return Chunks(start, step, last, fingerprint)


def _stats(records: Record, n: int) -> dict[str, Any]:
    """The warmup stats, ``(chain, draw)`` each, from the records ``(draw, chain)``."""
    info = SimpleNamespace(
        state=SimpleNamespace(logdensity=records.logdensity),
        info=SimpleNamespace(
            acceptance_rate=records.acceptance_rate, is_divergent=records.is_divergent
        ),
    )
    step_size = records.step_size  # (draw,) shared, or (draw, chain)
    step_size = (
        step_size.T if step_size.ndim == 2 else jnp.broadcast_to(step_size, (n, *step_size.shape))
    )
    stats = warmup_stats(info, step_size)
    if records.n_steps is not None:
        stats["n_steps"] = records.n_steps.T
    return stats
