"""numpyro's ensemble kernels (``AIES``, ``ESS``, any ``EnsembleSampler``) as ensembles.

numpyro's own step runs unchanged (every move it offers, their mixtures, its split of
the walkers in halves and its tuning of ``ESS``'s scale ``mu``), replicated on every
device; only its batch log density, the expensive part, is replaced by one spread
over the devices (``Ensemble``'s ``evaluate``). So a run with ``randomize_split=False``
(``AIES``'s default) gives numpyro's own vectorized draws, walker for walker, up to
the round-off of the batch width.

With ``randomize_split=True`` (``ESS``'s default) numpyro shuffles the walkers before
every step and leaves them shuffled: its chain ``i`` is slot ``i``, a different walker
at every step. chainrunner puts every walker back in its slot after the step (the
inverse of numpyro's permutation, from the same key), so chain ``i`` is walker ``i``'s
trajectory and R-hat, ESS and trace plots read as they do for chains. Which walkers
pair up in a move is as random as before, so the sampler is the same Markov chain on
the ensemble; the draws differ from numpyro's by that relabelling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.infer.ensemble import EnsembleSamplerState
from numpyro.infer.ensemble_util import batch_ravel_pytree
from numpyro.infer.initialization import init_to_value
from numpyro.infer.util import initialize_model

from ..core._kernel import Ensemble

# Salt of the keys that turn given constrained positions into unconstrained values.
_POSITION_SALT = 0x1417


def _walkers(state: Any) -> int:
    return int(jax.tree.leaves(state.z)[0].shape[0])


def rows(state: Any) -> Any:
    """One row per walker: its position, and the ensemble's key and statistics."""
    n = _walkers(state)
    shared = (state.inner_state, state.rng_key)
    inner, key = jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), shared)
    return EnsembleSamplerState(state.z, inner, key)


def whole(walkers: Any) -> Any:
    """The ensemble state of ``rows`` (the shared values from the first row)."""
    inner, key = jax.tree.map(lambda x: x[0], (walkers.inner_state, walkers.rng_key))
    return EnsembleSamplerState(walkers.z, inner, key)


def _unshuffle(new: Any) -> Any:
    """Walkers back in their slots after numpyro's ``randomize_split`` permutation.

    numpyro permutes the flattened walkers with ``random.permutation(key, z, axis=0)``,
    ``key`` being the one the new state carries: ``z[perm]``, ``perm`` =
    ``random.permutation(key, n)``.
    """
    n = _walkers(new)
    inverse = jnp.argsort(jax.random.permutation(new.rng_key, n))
    return new._replace(z=jax.tree.map(lambda x: x[inverse], new.z))


def _stats(old: Any, new: Any) -> dict[str, jax.Array]:
    """Per-walker stats: AIES's acceptance (did the walker move), ESS's scale ``mu``."""
    n = _walkers(new)
    out = {}
    if hasattr(new.inner_state, "accept_prob"):
        moved = [
            jnp.any((a != b).reshape(n, -1), axis=1)
            for a, b in zip(jax.tree.leaves(old.z), jax.tree.leaves(new.z), strict=True)
        ]
        out["acceptance_rate"] = jnp.any(jnp.stack(moved), axis=0).astype(jnp.float32)
    if hasattr(new.inner_state, "mu"):
        out["mu"] = jnp.broadcast_to(jnp.asarray(new.inner_state.mu, jnp.float32), (n,))
    return out


def build(nk: Any, unpack: Callable, num_warmup: int) -> tuple:
    """``(init, step, extract, logdensity, Ensemble)`` for a private numpyro kernel ``nk``."""
    model = getattr(nk, "model", None)
    moves = list(nk._moves)  # numpyro replaces them with moves built for the walker count

    def setup(keys, z, params, evaluate):
        """``nk.init`` in this program (its closures), log densities through ``evaluate``."""
        nk._moves = list(moves)  # numpyro builds its DE moves for the walker count
        state = nk.init(keys, num_warmup, z, *unpack(params))
        unravel, potential = batch_ravel_pytree(state.z)[1], nk._potential_fn
        nk._batch_log_density = lambda flat: -evaluate(potential, unravel(flat))
        return state

    def unconstrained(rng_key, positions, args, kwargs):
        def one(key, position):
            info = initialize_model(
                key, model, init_strategy=init_to_value(values=dict(position)),
                model_args=args, model_kwargs=kwargs, validate_grad=False,
            )  # fmt: skip
            return info[0].z

        n = int(jax.tree.leaves(positions)[0].shape[0])
        keys = jax.random.split(jax.random.fold_in(rng_key, _POSITION_SALT), n)
        return jax.vmap(one)(keys, positions)

    def init(positions, rng_key, num_walkers, params, evaluate):
        # One key per walker, as numpyro's MCMC(chain_method="vectorized") splits its key.
        keys = jax.random.split(rng_key, num_walkers)
        z = positions
        if positions is not None and model is not None:
            z = unconstrained(rng_key, positions, *unpack(params))
        return setup(keys, z, params, evaluate)

    def prepare(state, params, evaluate):
        # Side effects only: the closures for the program being traced (XLA drops the
        # unused initialisation).
        setup(jax.random.split(jax.random.key(0), _walkers(state)), state.z, params, evaluate)

    def step(state, params, evaluate):
        new = nk.sample(state, *unpack(params))
        if nk._randomize_split:
            new = _unshuffle(new)
        return new, _stats(state, new)

    def extract(row, info, params):
        draw = nk.postprocess_fn(*unpack(params))(row.z) if model is not None else row.z
        return draw, dict(info)

    def logdensity(row, params):
        return -nk._potential_fn(row.z)

    ensemble = Ensemble(init=init, step=step, rows=rows, whole=whole, prepare=prepare)
    return init, step, extract, logdensity, ensemble
