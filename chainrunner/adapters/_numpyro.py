"""numpyro kernels (NUTS, HMC, BarkerMH, SA, ...) as chainrunner kernels.

numpyro's ``MCMCKernel`` objects are stateful: ``kernel.init`` builds the sampler's
closures (potential function, warmup adapter for ``num_warmup`` steps) and
``kernel.sample`` uses them. chainrunner traces ``init`` and ``step`` in two compiled
programs, once per chain inside ``shard_map`` + ``vmap``, so this module:

- keeps one private copy of the numpyro kernel per ``(kernel, num_warmup, structure of
  the model arguments)``, so that runs with another ``num_warmup`` never share closures;
- calls ``kernel.init`` once per chain inside the trace (this is what numpyro's own
  ``chain_method='parallel'`` does), and again, for its side effects only, at the start of
  every other trace that samples, so that the closures never hold values of a finished
  trace (XLA drops the unused initialisation);
- passes the model's array arguments as ``Kernel.params``: data enter the compiled
  program as arguments, and new data of the same shapes reuse it;
- replaces the numpyro state's ``rng_key`` by chainrunner's per-step key before each
  ``kernel.sample``, so chain ``i``, step ``t`` sees the same random numbers whatever
  the layout.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.infer.initialization import init_to_uniform, init_to_value
from numpyro.infer.mcmc import MCMCKernel

from ..core._kernel import Adapter, Kernel
from ..core._lru import LRU
from ..core._naming import numpyro_stats
from ..layout import _distributed
from ._numpyro_ensemble import build as ensemble_functions

__all__ = [
    "NumpyroKernel",
    "bare_nuts",
    "check_model_arguments",
    "check_sites",
    "from_numpyro",
    "model_trace",
]

# Closures that numpyro kernels build in ``init``; reset in the private copies.
_CLOSURE_ATTRS = ("_init_fn", "_sample_fn", "_potential_fn_gen", "_postprocess_fn", "_wa_update")

# id(model function) -> NUTS(model): a bare model maps to one NUTS kernel.
_BARE = LRU(64)


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def _split_args(model_args: tuple, model_kwargs: dict) -> tuple[list, Any, tuple, tuple]:
    """Array leaves (traced params) vs the rest (static, closed over)."""
    leaves, treedef = jax.tree.flatten((tuple(model_args), dict(model_kwargs)))
    mask = tuple(_is_array(x) for x in leaves)
    params = [jnp.asarray(x) for x, m in zip(leaves, mask, strict=True) if m]
    statics = tuple(None if m else x for x, m in zip(leaves, mask, strict=True))
    return params, treedef, mask, statics


DATA_MODES = ("auto", "inputs", "constants")

# What numpy (or Python) code on a traced array raises: the model needs concrete data.
_NEEDS_CONCRETE = (
    jax.errors.TracerArrayConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def _data_mode(model: Any, data: str, split: tuple) -> tuple[str, str]:
    """``(mode, why)``: the model's array arguments as program inputs, or closed over.

    ``"auto"`` traces the model abstractly with its data as inputs (``eval_shape``: no
    computation); a model that runs numpy (or Python control flow) on its data cannot be
    traced so, and gets its data closed over as constants, as numpyro's own ``MCMC`` does
    by default (``jit_model_args=False``).
    """
    params, treedef, mask, statics = split
    if data != "auto":
        return data, "chosen (data=...)"
    if model is None or not params:
        return "inputs", "no array data"

    def probe(params):
        args, kwargs = _merge(list(params), treedef, mask, statics)
        model_trace(model, args, kwargs)

    try:
        jax.eval_shape(probe, params)
    except _NEEDS_CONCRETE as e:
        return "constants", (
            f"the model needs concrete data ({type(e).__name__}): its data are closed over, "
            "and new data recompile"
        )
    except Exception:  # any other failure shows when the kernel runs, as before
        pass
    return "inputs", "the model traces with its data as program inputs"


def _merge(params: list, treedef: Any, mask: tuple, statics: tuple) -> tuple[tuple, dict]:
    it = iter(params)
    leaves = [next(it) if m else s for m, s in zip(mask, statics, strict=True)]
    args, kwargs = jax.tree.unflatten(treedef, leaves)
    return args, kwargs


def _private_copy(kernel: Any) -> Any:
    """A shallow copy of a numpyro kernel whose ``init`` builds its own closures."""
    nk = copy.copy(kernel)
    for attr in _CLOSURE_ATTRS:
        if hasattr(nk, attr):
            setattr(nk, attr, None)
    if getattr(nk, "model", None) is not None and hasattr(nk, "_potential_fn"):
        nk._potential_fn = None  # BarkerMH stores the model's potential here
    return nk


@contextlib.contextmanager
def _init_strategy(nk: Any, strategy: Any) -> Iterator[None]:
    old = nk._init_strategy
    nk._init_strategy = strategy
    try:
        yield
    finally:
        nk._init_strategy = old


def model_trace(model: Any, args: tuple, kwargs: dict) -> Any:
    # Latent values as numpyro's init_to_uniform: works for improper priors too.
    model = handlers.substitute(handlers.seed(model, rng_seed=0), substitute_fn=init_to_uniform)
    return handlers.trace(model).get_trace(*args, **kwargs)


def _observed_values(model: Any, args: tuple, kwargs: dict) -> dict[str, np.ndarray]:
    """``{site: value}`` of the observed sites, read from an abstract trace of the model.

    Tracing under ``jax.eval_shape`` runs no computation (an eager trace compiles a few
    dozen small XLA programs, ~0.5 s on a CPU); observed values are the arrays the model
    was given. A value computed inside the model falls back to an eager trace.
    """

    def observed(tr: Any) -> dict[str, Any]:
        return {
            name: site["value"]
            for name, site in tr.items()
            if site["type"] == "sample"
            and site["is_observed"]
            # numpyro.factor terms are observed "Unit" sites, not data
            and not (site.get("infer") or {}).get("is_auxiliary", False)
        }

    found: dict[str, Any] = {}
    jax.eval_shape(lambda: found.update(observed(model_trace(model, args, kwargs))))
    if any(isinstance(v, jax.core.Tracer) for v in found.values()):
        with jax.ensure_compile_time_eval():
            found = observed(model_trace(model, args, kwargs))
    return {name: np.asarray(value) for name, value in found.items()}


def _plate_dims(model: Any, args: tuple, kwargs: dict) -> dict[str, list[str]]:
    """``{site: plate names (outermost first) + event dims}`` from an abstract trace."""
    found: dict[str, list[str]] = {}

    def collect() -> None:
        for name, site in model_trace(model, args, kwargs).items():
            if site["type"] not in ("sample", "deterministic"):
                continue
            frames = sorted(site.get("cond_indep_stack", ()), key=lambda f: f.dim)
            event = list((site.get("infer") or {}).get("event_dims", []))
            names = [f.name for f in frames] + event
            if names:
                found[name] = names

    try:
        jax.eval_shape(collect)
    except Exception:  # a model that cannot be traced abstractly: no dims, as before
        return {}
    return found


def check_sites(model: Any, position: Mapping, args: tuple, kwargs: dict) -> None:
    tr = model_trace(model, args, kwargs)
    latent = [
        name for name, site in tr.items() if site["type"] == "sample" and not site["is_observed"]
    ]
    deterministic = {name for name, site in tr.items() if site["type"] == "deterministic"}
    unknown = [k for k in position if k not in latent and k not in deterministic]
    if unknown:
        observed = [k for k in unknown if k in tr and tr[k]["type"] == "sample"]
        detail = f" ({observed} observed)" if observed else ""
        raise ValueError(
            f"run: initial_position has site(s) {unknown}{detail} that are not latent sample "
            f"sites of the model; its latent sites are {latent}."
        )
    for name in position:
        want, got = np.shape(tr[name]["value"]), np.shape(position[name])
        if name in latent and got != want:
            raise ValueError(
                f"run: initial_position[{name!r}] has shape {got} per chain (after the "
                f"leading chain axis), but the model's site {name!r} has shape {want}."
            )


def _init_state(nk: Any, model: Any, rng_key, num_warmup: int, position, args, kwargs) -> Any:
    """``nk.init`` for one chain: from the init strategy, or from ``position``."""
    if model is None:
        if position is None:
            raise ValueError(
                "run: this numpyro kernel has a potential_fn and no model; give "
                "initial_position (unconstrained values with a leading chain axis)."
            )
        return nk.init(rng_key, num_warmup, position, args, kwargs)
    if position is None:
        return nk.init(rng_key, num_warmup, None, args, kwargs)
    if not isinstance(position, Mapping):
        raise TypeError(
            "run: initial_position for a numpyro model must be a dict "
            "{site name: constrained values with a leading chain axis}, got "
            f"{type(position).__name__}."
        )
    check_sites(model, position, args, kwargs)
    with _init_strategy(nk, init_to_value(values=dict(position))):
        return nk.init(rng_key, num_warmup, None, args, kwargs)


def _logdensity(state: Any, params: Any) -> jax.Array | None:
    """``-potential_energy``, ``nan`` where the gradient is not finite (as numpyro's init)."""
    pe = getattr(state, "potential_energy", None)
    if pe is None or jnp.ndim(pe) != 0:
        return None
    lp = -pe
    grad = getattr(state, "z_grad", None)
    if grad is not None:
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grad)]))
        lp = jnp.where(finite, lp, jnp.nan)
    return lp


def _build(kernel: Any, treedef: Any, mask: tuple, statics: tuple, num_warmup: int) -> tuple:
    """``(init, step, extract, logdensity)`` for one numpyro kernel and ``num_warmup``."""
    nk = _private_copy(kernel)
    model = getattr(nk, "model", None)
    algo = getattr(nk, "_algo", None)
    max_depth = getattr(nk, "_max_tree_depth", None)
    if isinstance(max_depth, tuple):  # (warmup, sampling) depths: report the sampling one
        max_depth = max_depth[-1]
    field = getattr(nk, "sample_field", "z")
    # The trace and params leaves that nk's closures were last built in (by identity):
    # any other trace (another program, eval_shape, a loop body) re-initialises, so the
    # closures never hold values of another trace (HMCECS's proxy computes from the data).
    bound: list[Any] = [None]

    def unpack(params):
        return _merge(list(params), treedef, mask, statics)

    def bind(params, z):
        now = [_current_trace(), *params]
        last = bound[0]
        same_trace = last is not None and len(last) == len(now) and last[0] == now[0]
        if same_trace and all(map(_same, last[1:], now[1:])):
            return
        args, kwargs = unpack(params)
        # Side effects only: rebuilds nk's closures in this trace; the result is unused.
        nk.init(jax.random.key(0), num_warmup, None if model is not None else z, args, kwargs)
        bound[0] = now

    def init(position, rng_key, params):
        args, kwargs = unpack(params)
        state = _init_state(nk, model, rng_key, num_warmup, position, args, kwargs)
        bound[0] = [_current_trace(), *params]
        return state

    def step(rng_key, state, params):
        bind(params, getattr(state, field))
        args, kwargs = unpack(params)
        state = nk.sample(state._replace(rng_key=rng_key), args, kwargs)
        return state, state

    def extract(state, info, params):
        bind(params, getattr(state, field))
        args, kwargs = unpack(params)
        z = getattr(state, field)
        draw = nk.postprocess_fn(args, kwargs)(z) if model is not None else z
        return draw, numpyro_stats(state, algo, max_depth)

    return init, step, extract, _logdensity


def _is_ensemble(kernel: Any) -> bool:
    return bool(getattr(kernel, "is_ensemble_kernel", False))


def _build_ensemble(kernel: Any, treedef: Any, mask: tuple, statics: tuple, num_warmup: int):
    """``(init, step, extract, logdensity, Ensemble)`` for an AIES/ESS kernel."""

    def unpack(params):
        return _merge(list(params), treedef, mask, statics)

    return ensemble_functions(_private_copy(kernel), unpack, num_warmup)


def _same(a: Any, b: Any) -> bool:
    return a is b


def _current_trace() -> Any:
    """What identifies the JAX trace being built now (``jax.extend``'s public handle)."""
    return jax.extend.core.get_opaque_trace_state(None)


class NumpyroKernel(Adapter):
    """A numpyro ``MCMCKernel`` with its model arguments, as ``cr.run`` takes it.

    Build it with ``cr.from_numpyro``. ``cr.run`` calls ``build_kernel`` with
    its ``num_warmup``: numpyro's own adaptation (step size, mass matrix) then runs
    during the first ``num_warmup`` steps of every chain.

    Attributes:
        kernel: the numpyro kernel (e.g. ``numpyro.infer.NUTS(model)``).
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.

    Examples:
        >>> import numpyro, numpyro.distributions as dist
        >>> import chainrunner as cr
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal())
        ...     numpyro.sample("y", dist.Normal(mu), obs=y)
        >>> wrapped = cr.from_numpyro(numpyro.infer.NUTS(model), model_args=(1.5,))
        >>> wrapped.build_kernel(num_warmup=100).needs_position
        False
    """

    def __init__(
        self,
        kernel: Any,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        log_likelihood: bool = False,
        data: str = "auto",
    ):
        self.kernel = kernel
        self.want_log_likelihood = bool(log_likelihood)
        self.model_args = tuple(model_args)
        self.model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        split = _split_args(self.model_args, self.model_kwargs)
        self.data, self.data_reason = _data_mode(getattr(kernel, "model", None), data, split)
        if self.data == "constants":  # every leaf closed over: no program inputs
            leaves = jax.tree.leaves((self.model_args, self.model_kwargs))
            split = ([], split[1], (False,) * len(leaves), tuple(leaves))
        params, treedef, mask, statics = split
        self._params = tuple(params)
        self._structure = (treedef, mask, statics)
        self._observed: dict[str, np.ndarray] | None = None
        self._dims: dict[str, list[str]] | None = None

    def __repr__(self) -> str:
        return f"NumpyroKernel({type(self.kernel).__name__}, {len(self.model_args)} model_args)"

    init_error_hint = (
        "numpyro: Cannot find valid initial parameters (100 tries of the init strategy, "
        "or the given initial values, give a non-finite potential energy or gradient). "
        "Please check your model again."
    )

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The ``cr.Kernel`` that runs this kernel with ``num_warmup`` adaptation steps.

        The data arrays of the model arguments are the program's inputs (``params``),
        not its constants: data of the same shapes and dtypes reuse the compiled program.

        Args:
            num_warmup: the number of steps during which numpyro adapts.
            previous_params: unused: a continued run samples with this wrapper's data.

        Returns:
            A ``cr.Kernel`` whose ``params`` are the array leaves of the model arguments.

        Examples:
            >>> import numpyro, numpyro.distributions as dist
            >>> import chainrunner as cr
            >>> def model():
            ...     numpyro.sample("x", dist.Normal())
            >>> wrapped = cr.from_numpyro(numpyro.infer.NUTS(model))
            >>> wrapped.build_kernel(num_warmup=10).params
            ()
        """
        treedef, mask, statics = self._structure
        build = _build_ensemble if _is_ensemble(self.kernel) else _build
        init, step, extract, logdensity, *ensemble = build(
            self.kernel, treedef, mask, statics, int(num_warmup)
        )
        return Kernel(
            init=init,
            step=step,
            extract=extract,
            logdensity=logdensity,
            params=self._params,
            needs_position=getattr(self.kernel, "model", None) is None,
            ensemble=ensemble[0] if ensemble else None,
        )

    def dims(self) -> dict[str, list[str]]:
        """Dims of the model's sites from its plates and ``infer={"event_dims": ...}``.

        As ArviZ's numpyro converter infers them: for each sample and deterministic site,
        the names of its plates (outermost first), then its event dims.
        """
        if self._dims is None:
            model = getattr(self.kernel, "model", None)
            self._dims = {} if model is None else _plate_dims(model, self.model_args,
                                                               self.model_kwargs)  # fmt: skip
        return dict(self._dims)

    def adapted(self, state: Any, params: Any) -> dict[str, Any] | None:
        """numpyro's adapted ``step_size`` and ``inverse_mass_matrix`` of every chain (its
        ``adapt_state``: NUTS, HMC, BarkerMH); ``None`` for kernels without one."""
        adapt = getattr(state, "adapt_state", None)
        if adapt is None or not hasattr(adapt, "step_size"):
            return None
        adapt = _distributed.to_host(adapt)
        return {
            "step_size": np.asarray(adapt.step_size),
            "inverse_mass_matrix": jax.tree.map(np.asarray, adapt.inverse_mass_matrix),
        }

    def attrs(self) -> dict[str, Any]:
        return {
            "inference_library": "numpyro",
            "inference_library_version": numpyro.__version__,
            "numpyro_data": self.data,
            "numpyro_data_reason": self.data_reason,
        }

    def groups(self, draws: Any, *, complete: bool) -> dict[str, dict[str, Any]]:
        """``observed_data`` from the model arguments; ``log_likelihood`` when asked for.

        The log likelihood is left out of an interrupted run (``complete=False``).
        """
        out: dict[str, dict[str, Any]] = {}
        observed = self.observed_data()
        if observed:
            out["observed_data"] = observed
        if self.want_log_likelihood and complete:
            try:
                out["log_likelihood"] = self.log_likelihood(draws)
            except Exception as e:  # the draws stand: the extra group is what fails
                from ..output._diagnostics import ChainrunnerWarning, caller_stacklevel

                warnings.warn(
                    "from_numpyro(log_likelihood=True): the log likelihood could not be "
                    f"computed from the draws ({type(e).__name__}: {e}); keep= may have left "
                    "out latent sites it needs. The trace has no log_likelihood group.",
                    ChainrunnerWarning,
                    stacklevel=caller_stacklevel(),
                )
        return out

    def observed_data(self) -> dict[str, np.ndarray]:
        """The observed sites of the model and their values (ArviZ ``observed_data``).

        Returns:
            ``{site name: numpy array}``; empty for a kernel built from a potential.

        Examples:
            >>> import numpyro, numpyro.distributions as dist
            >>> import chainrunner as cr
            >>> def model(y):
            ...     numpyro.sample("y", dist.Normal(numpyro.sample("mu", dist.Normal())), obs=y)
            >>> wrapped = cr.from_numpyro(numpyro.infer.NUTS(model), model_args=(2.0,))
            >>> {k: float(v) for k, v in wrapped.observed_data().items()}
            {'y': 2.0}
        """
        if self._observed is None:
            model = getattr(self.kernel, "model", None)
            if model is None:
                self._observed = {}
            else:
                self._observed = _observed_values(model, self.model_args, self.model_kwargs)
        return dict(self._observed)

    def log_likelihood(self, draws: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Pointwise log likelihood of the observed sites at each draw (ArviZ ``log_likelihood``).

        Args:
            draws: ``trace.draws`` of a run of this kernel: ``{site: (chain, draw, ...)}``.

        Returns:
            ``{observed site: numpy array (chain, draw, *site shape)}``.

        Examples:
            >>> import numpy as np, numpyro, numpyro.distributions as dist
            >>> import chainrunner as cr
            >>> def model(y):
            ...     numpyro.sample("y", dist.Normal(numpyro.sample("mu", dist.Normal())), obs=y)
            >>> wrapped = cr.from_numpyro(numpyro.infer.NUTS(model), model_args=(np.zeros(3),))
            >>> wrapped.log_likelihood({"mu": np.zeros((2, 5))})["y"].shape
            (2, 5, 3)
        """
        model = getattr(self.kernel, "model", None)
        if model is None:
            raise ValueError("log_likelihood: this numpyro kernel has no model (potential_fn).")
        out = numpyro.infer.util.log_likelihood(
            model, dict(draws), *self.model_args, batch_ndims=2, **self.model_kwargs
        )
        return {k: np.asarray(v) for k, v in out.items()}


def from_numpyro(
    kernel: Any,
    *,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    log_likelihood: bool = False,
    data: str = "auto",
) -> NumpyroKernel:
    """Wraps a numpyro ``MCMCKernel`` (or a model function, run with NUTS) for ``cr.run``.

    numpyro's adaptation (step size, mass matrix) runs during ``cr.run``'s
    ``num_warmup`` steps. Chains start from numpyro's init strategy (``cr.run(...,
    initial_position=None, num_chains=n)``) or from constrained values
    ``{site: array with a leading chain axis}`` (sites left out start as
    ``init_to_value`` does). Draws are in constrained space and include deterministic
    sites; stats use ArviZ names (``lp`` = -potential energy, ``acceptance_rate``,
    ``diverging``, ``n_steps``, ``tree_depth``, ``energy``, ``step_size``).

    The array leaves of ``model_args``/``model_kwargs`` (numpy or JAX arrays) are
    inputs of the compiled program: new data of the same shapes does not recompile.
    Other leaves (Python numbers, strings, ``None``) are constants of the program:
    pass sizes as Python ints.

    Args:
        kernel: a numpyro ``MCMCKernel`` (``NUTS``, ``HMC``, ``BarkerMH``, ``SA``, ...;
            the ensemble kernels ``AIES`` and ``ESS`` run their walkers as chains, over
            the mesh: see [ensemble samplers](ensembles.md)), a model function (wrapped in
            ``NUTS``), or an existing ``NumpyroKernel`` (rebound to the new arguments,
            if any are given).
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.
        data: how the array leaves of the model arguments enter the compiled program:
            ``"inputs"`` (arguments: new data of the same shapes reuse it),
            ``"constants"`` (closed over, as numpyro's ``MCMC`` does by default: for
            models that run numpy on their data; new data recompile), or ``"auto"`` (the
            default): inputs if the model traces with its data as inputs, else
            constants. ``trace.attrs["numpyro_data"]`` records the mode and
            ``["numpyro_data_reason"]`` why.
        log_likelihood: also compute the pointwise log likelihood of the observed
            sites at every draw (ArviZ's ``log_likelihood`` group, for LOO/WAIC).

    Returns:
        A ``NumpyroKernel``: pass it to ``cr.run`` / ``cr.sample``.

    Raises:
        TypeError: for anything else than the above, or malformed
            ``model_args``/``model_kwargs``.

    Examples:
        >>> import jax, numpyro, numpyro.distributions as dist
        >>> import chainrunner as cr
        >>> def model():
        ...     numpyro.sample("x", dist.Normal())
        >>> kernel = cr.from_numpyro(numpyro.infer.NUTS(model))
        >>> trace = cr.run(kernel, jax.random.key(0), None, 20, num_warmup=20, num_chains=2,
        ...                progress=False)
        >>> trace.draws["x"].shape
        (2, 20)
    """
    where = "from_numpyro"
    if not isinstance(model_args, (tuple, list)):
        raise TypeError(
            f"{where}: model_args must be a tuple of the model's positional arguments, got "
            f"{type(model_args).__name__}."
        )
    if model_kwargs is not None and not isinstance(model_kwargs, Mapping):
        raise TypeError(
            f"{where}: model_kwargs must be a dict or None, got {type(model_kwargs).__name__}."
        )
    if data not in DATA_MODES:
        raise ValueError(f"{where}: data must be one of {DATA_MODES}, got {data!r}.")
    if isinstance(kernel, NumpyroKernel):
        same = log_likelihood == kernel.want_log_likelihood and data in ("auto", kernel.data)
        if not model_args and not model_kwargs and same:
            return kernel
        return NumpyroKernel(
            kernel.kernel,
            model_args or kernel.model_args,
            model_kwargs if model_kwargs is not None else kernel.model_kwargs,
            log_likelihood,
            data,
        )
    if isinstance(kernel, types.FunctionType):
        kernel = bare_nuts(kernel)
    if isinstance(kernel, numpyro.infer.MCMC):
        raise TypeError(
            f"{where}: got a numpyro MCMC object; pass its kernel instead (mcmc.sampler, "
            "e.g. numpyro.infer.NUTS(model)); num_warmup and num_chains go to cr.run."
        )
    if not isinstance(kernel, MCMCKernel):
        raise TypeError(
            f"{where}: kernel must be a numpyro MCMCKernel (e.g. numpyro.infer.NUTS(model)) or "
            f"a model function, got {type(kernel).__name__}."
        )
    check_model_arguments(kernel, model_args, model_kwargs)
    return NumpyroKernel(kernel, model_args, model_kwargs, log_likelihood, data)


def bare_nuts(model: Any) -> Any:
    """``NUTS(model)``, one per model function: a bare model maps to one kernel."""
    return _BARE.get(id(model), lambda: numpyro.infer.NUTS(model), owner=model)


def check_model_arguments(kernel: Any, model_args: tuple, model_kwargs: dict | None) -> None:
    """A ``TypeError`` now, before any tracing, where the model cannot take its arguments
    (a model with data passed without them), naming the model and how to pass them."""
    model = getattr(kernel, "model", None)
    try:
        signature = inspect.signature(model)
    except (TypeError, ValueError):  # no model (a potential_fn kernel), or a builtin
        return
    try:
        signature.bind(*model_args, **(model_kwargs or {}))
    except TypeError as e:
        name = getattr(model, "__name__", "model")
        given = f"model_args={tuple(model_args)!r}" if model_args else "no model_args"
        raise TypeError(
            f"from_numpyro: the numpyro model {name}{signature} cannot be called with {given} and "
            f"model_kwargs={model_kwargs or {}!r}: {e}. Pass the model's data with "
            f"cr.from_numpyro({type(kernel).__name__}({name}), model_args=(...), "
            "model_kwargs={...}) and give that to cr.run."
        ) from None


def is_model(fn: Any) -> bool:
    """Whether ``fn()`` (no arguments) runs as a numpyro model with a latent sample site.

    Traced abstractly (``jax.eval_shape``: nothing is computed). A function that fails
    to run so, or samples nothing, is not taken for a model.
    """
    found: list[bool] = []

    def probe() -> None:
        tr = handlers.trace(handlers.seed(fn, rng_seed=0)).get_trace()
        found.append(any(s["type"] == "sample" and not s["is_observed"] for s in tr.values()))

    try:
        jax.eval_shape(probe)
    except Exception:
        return False
    return bool(found and found[0])
