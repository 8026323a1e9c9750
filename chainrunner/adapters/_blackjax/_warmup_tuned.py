"""blackjax's own adaptations, run for every chain on its own device before sampling.

``cr.from_blackjax(factory, logdensity_fn=..., adaptation=...)`` lands here for the
adaptations blackjax runs as one call per chain: ``window_adaptation_low_rank``,
``staged_adaptation``, ``pathfinder_adaptation``, a built ``AdaptationAlgorithm`` (its
``run(rng_key, position, num_steps)``), and the two MCLMC tuners
(``mclmc_find_L_and_step_size`` with ``blackjax.mclmc``,
``adjusted_mclmc_find_L_and_step_size`` with ``blackjax.adjusted_mclmc_dynamic``).

One program runs the adaptation of every chain under ``shard_map``, batched like sampling
(``_mesh.local_map``), a chunk of its steps per call (``chunk_program``): the MCLMC
tuners as steps (``_warmup_mclmc``, ``_warmup_adjusted_mclmc``), the others as blackjax's
own ``run`` cut around its scan (``split_family``, ``programs/_split``). A ``run``
without such a scan runs whole, as one step (``tune_program``).

Each chain gets its own parameters: they travel in its state
(``Tuned.parameters``, a leading chain axis across chains), so padding, checkpoints,
continued traces and ``final_state`` hold them like any state. Chain ``i``'s adaptation key
is ``fold_in(init_key_i, 0)``, where ``init_key_i`` is chain ``i``'s init key
(``_programs.chain_key_pair``; its retries fold in 1, 2, ...): blackjax's own ``run`` with
that key and chain ``i``'s position gives the same result, within float rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...core._kernel import (
    Adapter,
    CrossChainWarmup,
    Kernel,
    WarmupChunks,
    WarmupRequest,
    default_extract,
    default_logdensity,
    library_attrs,
)
from ...core._naming import info_stats
from ...layout import _distributed, _mesh
from ...programs import _split
from ...programs._compile import compiled
from ...programs._programs import chain_key_pair
from ._warmup_adjusted_mclmc import adjusted_steps, total_steps
from ._warmup_mclmc import PerChain, mclmc_steps, phases

LABEL = "warmup (each chain)"  # the bar's, while the tuners run


class Pending(NamedTuple):
    """A chain before its warmup: its position and log density (checked to be finite)."""

    position: Any
    logdensity: jax.Array


class Tuned(NamedTuple):
    """The chain state of a per-chain tuned kernel.

    Attributes:
        state: the sampler's state (``Pending`` before the warmup).
        parameters: this chain's adapted parameters (``step_size``,
            ``inverse_mass_matrix``, ``L``, ...), as blackjax's adaptation returned them;
            across chains they have a leading chain axis.
    """

    state: Any
    parameters: Any


class Family(NamedTuple):
    """How one adaptation tunes a chain and builds its sampler.

    Attributes:
        name: the adaptation's name (trace attrs, errors).
        tune: ``tune(rng_key, position, num_warmup, keep) -> (state, parameters, info)``;
            ``info`` is blackjax's per-step ``AdaptationInfo`` when ``keep`` (else ignored).
        sampler: ``sampler(parameters) -> SamplingAlgorithm`` (its ``step`` is used).
        keeps_warmup: whether ``tune`` can return the warmup draws.
        steps: ``None`` (``tune`` runs the warmup as one step), or ``steps(rng_key,
            position, num_warmup) -> PerChain`` (``_warmup_mclmc``): the warmup as steps,
            which ``run`` drives in chunks; ``tune`` is then ``None``.
        length: with ``steps``, ``length(num_warmup)``: how many steps they are.
    """

    name: str
    tune: Callable | None
    sampler: Callable
    keeps_warmup: bool
    steps: Callable | None = None
    length: Callable | None = None


def array_parameters(parameters: dict) -> dict:
    """The entries of blackjax's parameters that are arrays (the rest are the factory's
    static extras, e.g. an integrator, given again when the sampler is built)."""

    def is_array(v: Any) -> bool:
        leaves = jax.tree.leaves(v)
        return bool(leaves) and all(isinstance(x, jax.Array | np.ndarray | float | int)
                                    for x in leaves)  # fmt: skip

    return {k: v for k, v in parameters.items() if is_array(v)}


def run_family(name: str, build: Callable, factory: Callable, logdensity_fn: Callable,
               static: dict, keeps_warmup: bool = True) -> Family:  # fmt: skip
    """An adaptation with blackjax's ``AdaptationAlgorithm.run``; ``build(keep)`` makes it."""

    def tune(rng_key, position, num_warmup, keep):
        results, info = build(keep).run(rng_key, position, num_warmup)
        return results.state, array_parameters(results.parameters), info

    def sampler(parameters):
        return factory(logdensity_fn, **{**static, **parameters})

    return Family(name, tune, sampler, keeps_warmup)


def tuning_steps(num_warmup: int, fractions: tuple[float, ...]) -> int:
    """The MCLMC tuners' ``num_steps`` (the run they tune for) whose tuning phases,
    ``sum(fractions) * num_steps`` steps, are ``num_warmup`` steps."""
    total = float(sum(fractions))
    if total <= 0:
        raise ValueError(f"from_blackjax: the MCLMC tuning fractions {fractions} sum to 0.")
    return max(round(num_warmup / total), 1)


def mclmc_family(logdensity_fn: Callable, options: dict) -> Family:
    """``blackjax.mclmc`` tuned by ``mclmc_find_L_and_step_size`` (``options`` go to it,
    ``integrator`` to the kernel too)."""
    import blackjax
    from blackjax.mcmc import mclmc

    opts = dict(options)
    integrator = opts.pop("integrator", mclmc.isokinetic_mclachlan)
    fractions = tuple(opts.get(f, 0.1) for f in ("frac_tune1", "frac_tune2", "frac_tune3"))
    kernel = mclmc.build_kernel(integrator=integrator)
    build = mclmc_steps(kernel, logdensity_fn, mclmc.init, opts)

    def steps(rng_key, position, num_warmup):
        return build(rng_key, position, tuning_steps(num_warmup, fractions))

    def length(num_warmup):
        return phases(tuning_steps(num_warmup, fractions), opts).total

    def sampler(parameters):
        return blackjax.mclmc(logdensity_fn, integrator=integrator, **parameters)

    return Family("mclmc", None, sampler, False, steps, length)


def adjusted_mclmc_family(logdensity_fn: Callable, options: dict) -> Family:
    """``blackjax.adjusted_mclmc_dynamic`` tuned by ``adjusted_mclmc_find_L_and_step_size``
    (random trajectory lengths of mean ``L / step_size``; ``target=0.9`` by default)."""
    import blackjax
    from blackjax.mcmc import adjusted_mclmc_dynamic as amd

    opts = {"target": 0.9, **options}
    integrator = opts.pop("integrator", amd.integrators.isokinetic_mclachlan)
    steps_fn = amd.make_random_trajectory_length_fn(True)
    fractions = tuple(opts.get(f, d) for f, d in
                      (("frac_tune1", 0.1), ("frac_tune2", 0.1), ("frac_tune3", 0.0)))  # fmt: skip

    kernel = amd.build_kernel(integration_steps_fn=steps_fn, integrator=integrator)
    build = adjusted_steps(kernel, logdensity_fn, amd.init, opts)

    def steps(rng_key, position, num_warmup):
        return build(rng_key, position, tuning_steps(num_warmup, fractions))

    def length(num_warmup):
        return total_steps(tuning_steps(num_warmup, fractions), opts)

    def sampler(parameters):
        return blackjax.adjusted_mclmc_dynamic(
            logdensity_fn, step_size=parameters["step_size"],
            inverse_mass_matrix=parameters["inverse_mass_matrix"], integrator=integrator,
            integration_steps_fn=steps_fn,
            integration_steps_params=(parameters["L"] / parameters["step_size"],),
        )  # fmt: skip

    return Family("adjusted_mclmc", None, sampler, False, steps, length)


def tuned_kernel(family: Family, logdensity_fn: Callable) -> Kernel:
    """The one ``Kernel`` of a tuned adaptation: ``init`` gives a ``Pending`` chain (the
    warmup program tunes it), ``step`` samples with the chain's own parameters."""

    def init(position, rng_key):
        return Tuned(Pending(position, jnp.asarray(logdensity_fn(position))), {})

    def step(rng_key, s):
        state, info = family.sampler(s.parameters).step(rng_key, s.state)
        return Tuned(state, s.parameters), info

    def extract(s, info):
        draw, stats = default_extract(s.state, info)
        if "step_size" in s.parameters:
            stats["step_size"] = jnp.asarray(s.parameters["step_size"])
        return draw, stats

    def logdensity(s):
        return default_logdensity(s.state)

    return Kernel(init=init, step=step, extract=extract, logdensity=logdensity)


def adaptation_key(rng_key: jax.Array, chain: Any) -> jax.Array:
    """Chain ``chain``'s adaptation key: ``fold_in(init_key, 0)`` of its init key (the
    module's docstring).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> adaptation_key(jax.random.key(0), jnp.uint32(3)).shape
        ()
    """
    return jax.random.fold_in(chain_key_pair(rng_key, chain)[0], 0)


def tune_program(family: Family, mesh: Any, batch_size: int | None, num_warmup: int,
                 keep: bool) -> Callable:  # fmt: skip
    """``(state, chain, rng_key) -> (Tuned state, info)``: every chain's warmup, sharded."""

    def body(state, chain, rng_key):
        def one(args):
            s, chain = args
            key = adaptation_key(rng_key, chain)
            new, parameters, info = family.tune(key, s.state.position, num_warmup, keep)
            if not keep:
                return Tuned(new, parameters), None
            return Tuned(new, parameters), (info.state.position, jax.vmap(info_stats)(info.info))

        return _mesh.local_map(one, batch_size)((state, chain))

    return _mesh.shard_chains(body, mesh, num_chained=2, num_replicated=1)


def chunk_program(family: Family, mesh: Any, batch_size: int | None, num_warmup: int,
                  chunk: int, keep: bool = False) -> Callable:  # fmt: skip
    """``(carry, state, chain, rng_key, first, count) -> (carry, Tuned state, kept)``:
    tuning steps ``first .. first + count - 1`` of every chain (``Family.steps``), sharded.

    The carry comes in and goes out split over ``'chain'``; at ``first=0`` it is not read
    (each chain starts from its ``Pending`` state: ``PerChain.carry``, computed in that
    chunk only). The tuned state holds the parameters adapted so far. ``count`` is a
    run-time number: every chunk runs the one program, so chunks of any length give the
    same bits (a scan of each length was compiled apart, and XLA rounded the tuners'
    steps differently in some of them). With ``keep``, ``kept`` is the warmup draws and
    stats of ``chunk`` steps from ``min(first, length - chunk)`` (else ``None``).
    """

    def body(carry, state, chain, rng_key, first, count):
        def one(args):
            c, s, chain = args
            key = adaptation_key(rng_key, chain)
            position = s.state.position

            def fresh():
                return first_carry(family.steps(key, position, num_warmup))

            c = jax.lax.cond(first == 0, fresh, lambda: c)
            steps = family.steps(key, position, num_warmup)

            def step(j, c):
                i = first + j
                k = (
                    None
                    if steps.keys is None
                    else jax.lax.dynamic_index_in_dim(steps.keys, i, 0, False)
                )
                return steps.step(c, (i, k))[0]

            c = jax.lax.fori_loop(0, count, step, c)
            # strongly typed, as the same state read from a checkpoint (a literal in
            # blackjax's parameters would be weakly typed: another sampling program)
            tuned = jax.tree.map(strong, Tuned(*steps.finish(c, first + count)))
            if not keep:
                return c, tuned, None
            at = jnp.minimum(first, family.length(num_warmup) - chunk)
            kept = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, at, chunk), steps.kept(c))
            return c, tuned, kept

        return _mesh.local_map(one, batch_size)((carry, state, chain))

    return _mesh.shard_chains(body, mesh, num_chained=3, num_replicated=3)


def first_carry(steps: PerChain) -> Any:
    """A chain's carry before its first step (``PerChain.carry``, or what its function
    gives)."""
    return steps.carry() if callable(steps.carry) else steps.carry


def strong(x: Any) -> jax.Array:
    """``x`` as a strongly typed array (of its dtype); a key array as it is."""
    x = jnp.asarray(x)
    return x if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else jnp.asarray(x, x.dtype)


def split_family(family: Family, rng_key: jax.Array, position: Any, num_warmup: int,
                 keep: bool) -> Family | None:  # fmt: skip
    """``family`` (a ``run_family``: blackjax's ``run`` as one call) as steps: its
    ``run`` cut around its ``lax.scan`` of ``num_warmup`` steps (``_split``), or ``None``
    where it has none. ``position``: one chain's (shapes will do)."""
    key = jax.eval_shape(lambda k: adaptation_key(k, jnp.uint32(0)), rng_key)

    def run(k, p):  # the warmup draws (blackjax's info) only where kept
        state, parameters, info = family.tune(k, p, num_warmup, keep)
        return (state, parameters, info) if keep else (state, parameters)

    cut = _split.split_scan(run, num_warmup, key, position)
    if cut is None:
        return None

    def steps(rng_key, position, n):
        def step(c, x):
            return cut.step(c, x[0]), None

        def finish(c, done):
            return cut.finish(c, done)[:2]

        def kept(c):
            info = cut.finish(c, num_warmup)[2]
            return info.state.position, jax.vmap(info_stats)(info.info)

        start = functools.partial(cut.start, rng_key, position)  # traced where it runs
        return PerChain(start, step, None, finish, kept if keep else None)

    return family._replace(tune=None, steps=steps, length=lambda n: n)


def scaled_chunk(chunk: int, num_warmup: int, length: int) -> int:
    """The chunk of a tuning of ``length`` steps for ``num_warmup``'s ``chunk``: as many
    of its steps, the longest that divides it where one of at least half does.

    Examples:
        >>> from chainrunner.adapters._blackjax._warmup_tuned import scaled_chunk
        >>> scaled_chunk(150, 300, 333)  # 333 = 3 x 111: one program
        111
    """
    c = max(1, min(length, round(chunk * length / num_warmup)))
    return next((d for d in range(c, (c - 1) // 2, -1) if length % d == 0), c)


def zeros(rng_key: jax.Array, like: Any) -> Any:
    """Zeros of ``like``'s shape and dtype, in numpy; a key array of ``rng_key``'s kind
    (adjusted MCLMC's state holds one) wraps zero key data."""
    if not jax.dtypes.issubdtype(like.dtype, jax.dtypes.prng_key):
        return np.zeros(like.shape, like.dtype)
    data = np.zeros((*like.shape, *jax.random.key_data(rng_key).shape), np.uint32)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(rng_key))


def carry_like(family: Family, num_warmup: int, rng_key: jax.Array, state: Any) -> Any:
    """The shapes and dtypes of ``chunk_program``'s carry and tuned states (every chain)."""

    def one(s):
        key = adaptation_key(rng_key, jnp.uint32(0))
        steps = family.steps(key, s.state.position, num_warmup)
        carry = first_carry(steps)
        return carry, Tuned(*steps.finish(carry, 0))

    return jax.eval_shape(jax.vmap(one), state)


class TunedAdaptation(Adapter):
    """A blackjax kernel whose parameters each chain's own blackjax warmup sets.

    Build it with ``cr.from_blackjax(factory, logdensity_fn=..., adaptation=...)`` for
    ``"window_low_rank"``, ``"staged"``, ``"pathfinder"``, ``"mclmc"``,
    ``"adjusted_mclmc"``, blackjax's functions of those names, or a built
    ``AdaptationAlgorithm``. ``cr.run`` initialises the chains, runs every chain's warmup
    over the mesh in chunks (``cross_chain_warmup``: a warmup before sampling, per
    chain), then samples each chain with its own parameters (in ``Tuned.parameters``;
    ``cr.adapted_parameters(trace)`` reads them with a leading chain axis).

    Attributes:
        family: how the adaptation tunes a chain and builds its sampler.
        name: the adaptation's name (``family.name``).

    Examples:
        >>> import blackjax, jax, jax.numpy as jnp
        >>> import chainrunner as cr
        >>> f = lambda x: -0.5 * jnp.sum(x**2)
        >>> k = cr.from_blackjax(blackjax.nuts, logdensity_fn=f, adaptation="window_low_rank")
        >>> trace = cr.run(k, jax.random.key(0), jnp.zeros((3, 2)), 20, num_warmup=40,
        ...                progress=False)
        >>> cr.adapted_parameters(trace)["step_size"].shape
        (3,)
    """

    has_cross_chain_warmup = True
    needs_warmup = True

    def __init__(self, family: Family, logdensity_fn: Callable):
        self.family, self.name = family, family.name
        self._kernel = tuned_kernel(family, logdensity_fn)

    def __repr__(self) -> str:
        return f"TunedAdaptation({self.family.name!r})"

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """Every chain's parameters, as blackjax's adaptation returned them (``Tuned``)."""
        if not isinstance(state, Tuned) or not state.parameters:
            return None
        return jax.tree.map(np.asarray, dict(_distributed.to_host(state.parameters)))

    def attrs(self) -> dict[str, Any]:
        return library_attrs("blackjax")

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The one kernel: fresh chains start ``Pending``, tuned ones sample on."""
        return self._kernel

    def cross_chain_warmup(self, request: WarmupRequest) -> WarmupChunks:
        """Tunes every chain (padding ones too, discarded later), in chunks of steps; a
        built adaptation whose ``run`` has no scan of its steps as one step."""
        r = request
        if r.keep_warmup and not self.family.keeps_warmup:
            raise ValueError(
                f"run: keep_warmup=True, but adaptation={self.family.name!r} returns no "
                "warmup draws (blackjax's tuner gives only its final state); pass "
                "keep_warmup=False."
            )
        family = self.family
        if family.steps is None:  # blackjax's run, cut around its scan where it has one
            like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                                r.state.state.position)  # fmt: skip
            family = split_family(family, r.rng_key, like, r.num_warmup, bool(r.keep_warmup))
        if family is None:
            return WarmupChunks.whole(r.num_warmup, lambda: self._tune(r), LABEL)
        return self._chunks(r, family)

    def _chunks(self, r: WarmupRequest, family: Family) -> WarmupChunks:
        """The tuning in chunks (``Family.steps``): ``((carry, tuned state), ...)``."""
        mesh, keep = r.mesh, bool(r.keep_warmup)
        length = family.length(r.num_warmup)
        padded = int(jax.tree.leaves(r.state)[0].shape[0])
        b, _ = _mesh.auto_batch_size(r.batch_size, mesh, r.num_chains)
        chains = _mesh.place(_mesh.chain_ids(r.num_chains, padded), mesh)
        key = _mesh.replicate(r.rng_key, mesh)
        chunk = scaled_chunk(r.chunk_size or r.num_warmup, r.num_warmup, length)
        program = chunk_program(family, mesh, b, r.num_warmup, chunk, keep)

        def start() -> Any:  # numpy zeros, placed: no program compiled for them
            like = carry_like(family, r.num_warmup, r.rng_key, r.state)
            return _mesh.place(jax.tree.map(functools.partial(zeros, r.rng_key), like), mesh)

        def arguments(carry: Any, first: int, count: int) -> tuple:
            numbers = _mesh.replicate((jnp.int32(first), jnp.int32(count)), mesh)
            return (carry[0], r.state, chains, key, *numbers)

        @functools.cache
        def executable() -> Any:  # one for every chunk (``count`` is an argument)
            return compiled("warmup", program, arguments(start(), 0, chunk))[0]

        def step(carry: Any, first: int, count: int) -> tuple:
            c, tuned, kept = executable()(*arguments(carry, first, count))
            if kept is None:
                return (c, tuned), None, None
            at = first - min(first, length - chunk)  # the chunk's first row in ``kept``
            kept = jax.tree.map(lambda x: x[: r.num_chains, at : at + count],
                                _distributed.to_host(kept))  # fmt: skip
            return (c, tuned), *kept

        def finish(carry: Any) -> CrossChainWarmup:
            return CrossChainWarmup(carry[1], self._kernel, None, None,
                                    {"adaptation": family.name})  # fmt: skip

        def fingerprint() -> str:
            return executable().digest

        return WarmupChunks(chunk, start, step, finish, fingerprint, length, LABEL)

    def _tune(self, r: WarmupRequest) -> CrossChainWarmup:
        """The tuning program, compiled and run: the tuned states (and warmup draws)."""
        padded = int(jax.tree.leaves(r.state)[0].shape[0])
        b, _ = _mesh.auto_batch_size(r.batch_size, r.mesh, r.num_chains)
        shape = (r.mesh, b, r.num_warmup, bool(r.keep_warmup))
        chains = _mesh.place(_mesh.chain_ids(r.num_chains, padded), r.mesh)
        args = (r.state, chains, _mesh.replicate(r.rng_key, r.mesh))
        program, _ = compiled("warmup", tune_program(self.family, *shape), args)
        state, kept = program(*args)
        draws = stats = None
        if kept is not None:
            draws, stats = jax.tree.map(lambda x: x[: r.num_chains], _distributed.to_host(kept))
        return CrossChainWarmup(state, self._kernel, draws, stats, {"adaptation": self.family.name})
