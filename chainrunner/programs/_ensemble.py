"""Ensemble samplers over the mesh: walkers that move together (numpyro's AIES and ESS).

Every move of a walker reads the walkers of the other half of the ensemble, so the
ensemble runs as ``_collective`` lays out: every device holds every walker's position
and the ensemble's own key, runs the sampler's step replicated, and the log densities,
the expensive part, are spread over the devices (``Ensemble.init``/``step`` get
``evaluate``, a ``_collective.spread`` for this mesh and width). Between chunks, and in
the draws, each device keeps its own block of walkers, padded like any chain state
(``Ensemble.rows``): the padding rows are copies of the last walker, dropped by
``gather`` before the ensemble is rebuilt, so they never enter another walker's move.

The ensemble draws its random numbers from its own key (numpyro's: the run's key split
into one key per walker, as ``MCMC(..., chain_method="vectorized")``), carried in the
state: continuing a trace, chunks and checkpoints give the draws of one long run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from ..core._kernel import Kernel
from ..layout import _collective, _mesh


def auto_width(num_walkers: int) -> tuple[int, str]:
    """``batch_size="auto"`` for an ensemble: a width from the walker count alone.

    Half the walkers move at a time; their log densities are spread in batches of an
    eighth of that half (``_collective.auto_width``), the same on any device count.
    """
    width = _collective.auto_width(num_walkers // 2)
    return width, (
        f"auto: ensemble of {num_walkers} walkers: log densities in batches of {width} "
        "(an eighth of the moving half; the same on any device count)"
    )


def check(plan: Any, num_walkers: int) -> None:
    """The run options an ensemble cannot take, as clear errors before any work."""
    if num_walkers < 4 or num_walkers % 2:
        raise ValueError(
            f"run: an ensemble sampler needs an even number of walkers (chains), at least "
            f"4; got {num_walkers}. Use at least twice the number of parameters."
        )
    if plan.superchains is not None:
        raise ValueError(
            "run: superchains start the chains of a superchain at one point; an "
            "ensemble's walkers must start apart (its moves use their differences). "
            "Pass superchains=None."
        )
    if plan.on_bad_init == "reinit":
        raise ValueError(
            "run: on_bad_init='reinit' is not available for ensemble samplers (the "
            "walkers start together from the model's init strategy, which already "
            "retries); use 'raise' or 'warn', or pass initial positions."
        )


def draw_shape(kernel: Kernel, extract_of: Callable, position: Any, state: Any, n: int) -> Any:
    """Shape structs of one walker's draw and stats, from an abstract trace of the ensemble's
    init (where ``state`` is ``None``) or of ``state``'s first ``n`` rows, one step and the
    walker's extract.

    The log densities are mapped with a plain ``vmap`` here: how they are spread over the
    devices changes no shape.
    """
    ens, key = kernel.ensemble, jax.random.key(0)

    def evaluate(fn, xs):
        return jax.vmap(fn)(xs)

    def probe(position, state, params):
        if state is None:
            whole = ens.init(position, key, n, params, evaluate)
        else:  # the real walkers only: a placed state carries the mesh's padding rows
            whole = ens.whole(jax.tree.map(lambda x: x[:n], state))
        if ens.prepare is not None:
            ens.prepare(whole, params, evaluate)
        whole, info = ens.step(whole, params, evaluate)
        row = jax.tree.map(lambda x: x[0], (ens.rows(whole), info))
        return extract_of(params)(*row)

    return jax.eval_shape(probe, position, state, kernel.params)


def _evaluate(mesh: Mesh, width: int | None) -> Callable:
    return functools.partial(_collective.spread, devices=mesh.shape[_mesh.AXIS], width=width)


def _local(tree: Any, n: int, devices: int, per: int) -> Any:
    """This device's ``per`` rows of the ``n`` rows of ``tree`` (padded as the layout)."""
    return _collective.mine(_mesh.pad(tree, n, devices * per), per)


def init_program(
    kernel: Kernel, mesh: Mesh, width: int | None, n: int, trace_counts: dict
) -> Callable:
    """``(position, chain, tries, rng_key, params) -> (rows, lp)`` for ``n`` walkers."""
    ens, devices = kernel.ensemble, mesh.shape[_mesh.AXIS]

    def body(position, chain, tries, rng_key, params):
        trace_counts["init"] += 1
        per = chain.shape[0]
        full = None if position is None else _collective.gather(position, n)
        state = ens.init(full, rng_key, n, params, _evaluate(mesh, width))
        rows = _local(ens.rows(state), n, devices, per)
        k = kernel.bind(params)
        if k.logdensity is None:
            return rows, jnp.zeros(per)
        return rows, _mesh.local_map(k.logdensity, width)(rows)

    return _mesh.shard_chains(body, mesh, num_chained=3, num_replicated=2)


def chunk_program(
    kernel: Kernel, mesh: Mesh, width: int | None, n: int, chunk_len: int,
    thinning: int, extract_of: Callable, trace_counts: dict,
) -> Callable:  # fmt: skip
    """``(rows, chain, rng_key, start, n_valid, params) -> (rows, (draws, stats))``.

    The ensemble is rebuilt from every device's rows, runs ``n_valid`` draws of
    ``thinning`` steps replicated, and each device stores its own walkers' draws
    (``extract_of(params)`` maps one walker's row and info to its draw and stats).
    ``chunk_len``: the draws a call holds.
    """
    ens, devices = kernel.ensemble, mesh.shape[_mesh.AXIS]

    def body(rows, chain, rng_key, start, n_valid, params):
        trace_counts["chunk"] += 1
        per, evaluate = chain.shape[0], _evaluate(mesh, width)
        extract = extract_of(params)

        def advance(state):
            if thinning > 1:
                state = jax.lax.fori_loop(
                    0, thinning - 1, lambda _, s: ens.step(s, params, evaluate)[0], state
                )
            state, info = ens.step(state, params, evaluate)
            mine = _local((ens.rows(state), info), n, devices, per)
            return state, _mesh.local_map(lambda a: extract(*a), width)(mine)

        state = ens.whole(_collective.gather(rows, n))
        if ens.prepare is not None:
            ens.prepare(state, params, evaluate)
        shapes = jax.eval_shape(advance, state)[1]
        buffers = jax.tree.map(lambda s: jnp.zeros((chunk_len, *s.shape), s.dtype), shapes)

        def one(i, carry):
            state, buffers = carry
            state, out = advance(state)
            buffers = jax.tree.map(
                lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, i, 0), buffers, out
            )
            return state, buffers

        state, buffers = jax.lax.fori_loop(0, n_valid, one, (state, buffers))
        # (draw, walker) -> (walker, draw), as the chains' programs return them
        out = jax.tree.map(lambda b: jnp.swapaxes(b, 0, 1), buffers)
        return _local(ens.rows(state), n, devices, per), out

    return _mesh.shard_chains(body, mesh, num_chained=2, num_replicated=4)
