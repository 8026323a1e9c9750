"""PyMC models for ``cr.run``: PyMC's own JAX conversion, sampled with blackjax.

``from_pymc(model)`` takes everything from PyMC's JAX helpers (``pymc.sampling.jax``),
as ``pm.sample(nuts_sampler="numpyro"|"blackjax")`` does, and derives nothing itself:

- the log density of the model's value variables (unconstrained space), from
  ``get_jaxified_logp``; the sampler is a blackjax adapter (``from_blackjax``) on it;
- the initial points: PyMC's initial-point expression (``support_point`` or the model's
  ``initval``, moved to the unconstrained space, plus ``U(-1, 1)`` jitter), compiled to JAX
  with ``get_jaxified_graph``; the jitter is drawn from the chain's init key, so chains
  start reproducibly, on the mesh, with no host work; up to ``jitter_max_retries`` new
  jitters where the log density is not finite, as ``pm.sample`` does;
- the draws as ``pm.sample`` returns them: constrained, named as the model's variables,
  with its ``Deterministic``s (``get_jaxified_graph`` of ``model.unobserved_value_vars``,
  in the kernel's ``extract``);
- ArviZ groups, coords and dims from ``pymc.backends.arviz`` (``observed_data``,
  ``constant_data``, the model's ``coords`` and dims), and the pointwise log likelihood
  as ``pm.compute_log_likelihood`` computes it (the model without value transforms, on the
  constrained draws), compiled to JAX.

Importing PyMC's JAX helpers has two global effects, as with ``pm.sample``'s JAX samplers:
PyTensor turns on ``jax_enable_x64`` (PyMC models are float64), and ``pymc.sampling.jax``
sets ``XLA_FLAGS``. chainrunner puts both back as they were. A float64 model's kernel
says ``x64``, and ``run`` (and the log likelihood) run it under JAX's scoped
``jax.enable_x64(True)``: 64 bits for that call, and the process's setting unchanged, so
a float32 kernel before or after a PyMC run samples in float32.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core._kernel import Adapter, Kernel
from ..core._settings import x64_scope
from ..core._words import reject_pm_sample_words
from ._blackjax._adaptations import name_of
from ._model import ModelAdapter, build_sampler, with_target_accept

__all__ = ["PymcModel", "from_pymc", "is_pymc_model"]

INSTALL = 'cr.from_pymc needs PyMC: pip install "chainrunner[pymc]"'


def _pymc() -> Any:
    """``pymc`` with its JAX helpers imported; an ``ImportError`` naming the extra if absent.

    ``pymc.sampling.jax`` rewrites ``XLA_FLAGS`` on import (a CPU device count of 100),
    and PyTensor's JAX backend turns ``jax_enable_x64`` on for the process: chainrunner
    restores both, so the user's device count and JAX setting stand.
    """
    try:
        import pymc
    except ImportError as e:
        raise ImportError(f"{INSTALL} ({e}).") from e
    if not {"pymc.sampling.jax", "pytensor.link.jax.dispatch"} <= sys.modules.keys():
        _import_jax_helpers()
    return pymc


@contextlib.contextmanager
def _no_blas_probe() -> Iterator[None]:
    """Inside, PyTensor's ``blas__ldflags`` reads as ``""`` where nobody has set or read it.

    Its default is found by compiling test programs with the C compiler: 0.3 s of every
    process's ``from_pymc``, measured on PyMC 5 and 6. PyTensor's JAX conversion reads the
    flag (the condition of a sparse rewrite that makes a C-only op, which JAX cannot run)
    and never uses it, so ``""`` leaves the JAX functions as they were (the same draws,
    bitwise). Afterwards the flag is unset again: PyTensor's C backend, where the process
    uses it, finds the default as usual (and warns there if it finds no BLAS). A flag set
    by the user (``PYTENSOR_FLAGS``, ``.pytensorrc``) or already read is left alone.
    """
    import pytensor

    config = pytensor.config
    param = getattr(config, "_config_var_dict", {}).get("blas__ldflags")
    if param is None or hasattr(param, "val") or _user_set(config, "blas__ldflags"):
        yield
        return
    param.val = ""
    try:
        yield
    finally:
        if getattr(param, "val", None) == "":  # (unless it was set meanwhile)
            del param.val


def _user_set(config: Any, name: str) -> bool:
    """Whether the user set PyTensor's flag ``name`` (in ``PYTENSOR_FLAGS`` or a config file)."""
    try:
        config.fetch_val_for_key(name)
    except (KeyError, AttributeError):
        return False
    return True


def _import_jax_helpers() -> None:
    """Imports ``pymc.sampling.jax`` and PyTensor's JAX backend, then puts ``XLA_FLAGS``
    and the process's ``jax_enable_x64`` back (read on a fresh thread: this one may be in
    a scoped setting)."""
    flags, x64 = os.environ.get("XLA_FLAGS"), _process_x64()
    try:
        import pymc.sampling.jax  # noqa: F401
        import pytensor.link.jax.dispatch  # noqa: F401  (sets jax_enable_x64 on import)
    finally:
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags
        jax.config.update("jax_enable_x64", x64)


def _process_x64() -> bool:
    """The process's ``jax_enable_x64``, whatever scoped setting this thread is in."""
    found: list[bool] = []
    probe = threading.Thread(target=lambda: found.append(bool(jax.config.jax_enable_x64)))
    probe.start()
    probe.join()
    return found[0]


def _float64() -> bool:
    """Whether PyMC models are float64 (PyTensor's ``floatX``): their kernels then trace
    and run with 64-bit types only."""
    import pytensor

    return pytensor.config.floatX == "float64"


def is_pymc_model(obj: Any) -> bool:
    """Whether ``obj`` is a ``pm.Model`` (PyMC is imported only for objects from PyMC)."""
    if not (type(obj).__module__ or "").startswith("pymc."):
        return False
    import pymc

    return isinstance(obj, pymc.Model)


class Compiled(NamedTuple):
    """A PyMC model's functions in JAX, from PyMC's JAX conversion.

    Attributes:
        value_names: the value variables (unconstrained: ``tau_log__``), in model order.
        logdensity_fn: ``{value name: array} -> log density``.
        constrain: ``{value name: array} -> {variable: array}``: the draws as ``pm.sample``
            gives them (constrained, with the ``Deterministic``s).
        initial_point: ``rng_key -> {value name: array}``: PyMC's jittered initial point.
        log_likelihood: ``{variable: array} -> {observed: pointwise log likelihood}``.
    """

    value_names: tuple[str, ...]
    logdensity_fn: Callable
    constrain: Callable
    initial_point: Callable
    log_likelihood: Callable


def _jax_graph(inputs: list, outputs: list) -> Callable:
    from pymc.sampling.jax import get_jaxified_graph

    with _no_blas_probe():
        return get_jaxified_graph(inputs=inputs, outputs=outputs)


def _logdensity(model: Any, names: tuple[str, ...]) -> Callable:
    from pymc.sampling.jax import get_jaxified_logp

    # The log density itself (negative_logp=True), jitted: a run traces it several times
    # (init, the step-size search, the step), and JAX keeps the trace of a jitted
    # function by its argument types, so PyTensor's generated Python runs once per type.
    with _no_blas_probe():
        logp = jax.jit(get_jaxified_logp(model))

    def logdensity_fn(position: Mapping[str, jax.Array]) -> jax.Array:
        return logp([position[name] for name in names])

    return logdensity_fn


def _constrain(model: Any) -> Callable:
    from pymc.util import get_default_varnames

    outputs = list(get_default_varnames(model.unobserved_value_vars, include_transformed=False))
    names = [v.name for v in outputs]
    fn = _jax_graph(model.value_vars, outputs)
    inputs = [v.name for v in model.value_vars]

    def constrain(position: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        values = fn(*[position[name] for name in inputs])
        return dict(zip(names, values, strict=True))

    return constrain


def _log_likelihood(model: Any) -> Callable:
    """As ``pm.compute_log_likelihood``: the model without value transforms, elementwise."""
    from pymc.model.transform.conditioning import remove_value_transforms

    umodel = remove_value_transforms(model)
    observed = list(umodel.observed_RVs)
    fn = _jax_graph(umodel.value_vars, umodel.logp(observed, sum=False))
    inputs = [v.name for v in umodel.value_vars]

    def log_likelihood(draw: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        values = fn(*[draw[name] for name in inputs])
        return {rv.name: value for rv, value in zip(observed, values, strict=True)}

    return log_likelihood


def _jitter_variables(outputs: list, free_rvs: list) -> dict[str, Any]:
    """``{rv name: its U(-1, 1) jitter variable}`` in PyMC's initial-point expression."""
    from pytensor.graph.traversal import ancestors

    wanted = {f"{rv.name}_jitter": rv.name for rv in free_rvs}
    return {wanted[v.name]: v for v in ancestors(outputs) if v.name in wanted}


def _initial_point_graph(model: Any, initvals: Mapping | None, jitter: bool) -> tuple:
    """PyMC's transformed initial-point expression, with its jitter draws as inputs.

    Returns ``(fn, shapes)``: ``fn(*jitters) -> transformed values`` in JAX, and the
    ``(name, shape, dtype)`` of each jitter input (none without ``jitter``).
    """
    import pytensor.tensor as pt
    from pymc.initial_point import convert_str_to_rv_dict, make_initial_point_expression
    from pytensor.graph.replace import clone_replace

    free = list(model.free_RVs)
    outputs = make_initial_point_expression(
        free_rvs=free,
        rvs_to_transforms=model.rvs_to_transforms,
        initval_strategies={
            **model.rvs_to_initial_values,
            **convert_str_to_rv_dict(model, dict(initvals or {})),
        },
        jitter_rvs=set(free) if jitter else set(),
        return_transformed=True,
    )
    shapes = {
        v.name: np.shape(x) for v, x in zip(model.value_vars, _start_values(model), strict=True)
    }
    found = _jitter_variables(outputs, free)
    inputs, replace, specs = [], {}, []
    for rv, value in zip(free, model.value_vars, strict=True):
        if rv.name in found:
            j = found[rv.name]
            x = pt.tensor(name=j.name, dtype=j.dtype, shape=shapes[value.name])
            inputs.append(x)
            replace[j] = x
            specs.append((j.name, shapes[value.name], j.dtype))
    try:
        fn = _jax_graph(inputs, clone_replace(outputs, replace=replace))
    except ValueError as e:  # a random draw left in the graph: initval="prior"
        raise NotImplementedError(
            "from_pymc: PyMC's initial point of this model has random draws left in it "
            '(initval="prior", or a distribution whose support point PyMC draws, such as '
            "ZeroSumNormal, LKJCorr or LKJCholeskyCov), which its JAX conversion cannot "
            "compile; give those variables initvals (from_pymc(model, initvals={name: "
            "value})), or pass initial_position to cr.run ({value variable: unconstrained "
            f"values with a leading chain axis}}). PyMC said: {e}"
        ) from e
    return fn, specs


def _start_values(model: Any) -> list[np.ndarray]:
    """The model's (unjittered) initial point, in value-variable order: its shapes."""
    point = model.initial_point(random_seed=0)
    return [np.asarray(point[v.name]) for v in model.value_vars]


def _initial_point(model: Any, initvals, jitter: bool, retries: int, logdensity_fn) -> Callable:
    """``rng_key -> {value name: array}``, retried while the log density is not finite."""
    fn, specs = _initial_point_graph(model, initvals, jitter)
    names = [v.name for v in model.value_vars]

    def point(rng_key: jax.Array, attempt: jax.Array) -> dict[str, jax.Array]:
        keys = jax.random.split(jax.random.fold_in(rng_key, attempt), max(len(specs), 1))
        noise = [
            jax.random.uniform(k, shape, dtype, minval=-1.0, maxval=1.0)
            for k, (_, shape, dtype) in zip(keys[: len(specs)], specs, strict=True)
        ]
        values = fn(*noise)
        return {n: jnp.asarray(v) for n, v in zip(names, values, strict=True)}

    def initial_point(rng_key: jax.Array) -> dict[str, jax.Array]:
        if not specs or retries <= 0:
            return point(rng_key, jnp.int32(0))

        def again(carry):
            attempt, _, ok = carry
            return jnp.logical_and(~ok, attempt < retries)

        def retry(carry):
            attempt = carry[0] + 1
            p = point(rng_key, attempt)
            return attempt, p, jnp.isfinite(logdensity_fn(p))

        # One loop makes every try, the first included: the program holds the
        # initial-point expression and the log density once each.
        shapes = jax.eval_shape(point, rng_key, jnp.int32(0))
        none = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return jax.lax.while_loop(again, retry, (jnp.int32(-1), none, jnp.bool_(False)))[1]

    return initial_point


def compile_model(
    model: Any,
    *,
    initvals: Mapping | None = None,
    jitter: bool = True,
    jitter_max_retries: int = 10,
) -> Compiled:
    """The model's log density, initial points, constraining map and log likelihood in JAX.

    Args:
        model: a ``pm.Model``.
        initvals: initial values ``{variable or name: value}`` for every chain (as
            ``pm.sample(initvals=...)``), over the model's own ``initval``s.
        jitter: add PyMC's ``U(-1, 1)`` jitter to the initial points.
        jitter_max_retries: new jitters for a chain whose start has a non-finite log density.

    Returns:
        A ``Compiled``.

    Examples:
        >>> import pymc as pm
        >>> from chainrunner.adapters._pymc import compile_model
        >>> with pm.Model() as model:
        ...     sigma = pm.HalfNormal("sigma")
        >>> c = compile_model(model)
        >>> c.value_names, sorted(c.constrain({"sigma_log__": 0.0}))
        (('sigma_log__',), ['sigma'])
    """
    _pymc()
    names = tuple(v.name for v in model.value_vars)
    logdensity_fn = _logdensity(model, names)
    return Compiled(
        value_names=names,
        logdensity_fn=logdensity_fn,
        constrain=_constrain(model),
        initial_point=_lazy(
            lambda: _initial_point(model, initvals, jitter, jitter_max_retries, logdensity_fn)
        ),
        log_likelihood=_log_likelihood(model),
    )


def _lazy(build: Callable[[], Callable]) -> Callable:
    """``build()``'s function, built at its first call: PyMC's initial-point expression is
    compiled only when a run needs it (not with ``initial_position`` given)."""
    made: list[Callable] = []

    def call(*args: Any) -> Any:
        if not made:
            made.append(build())
        return made[0](*args)

    return call


_JITTER_SALT = 0x70796D63  # "pymc": the jitter's keys are not the kernel's init keys


def _start(compiled: Compiled) -> Callable:
    """One chain's start: PyMC's jittered initial point, or the given unconstrained values."""
    names = set(compiled.value_names)

    def start(position: Any, rng_key: jax.Array) -> Any:
        if position is None:
            return compiled.initial_point(jax.random.fold_in(rng_key, _JITTER_SALT))
        if not isinstance(position, Mapping) or set(position) != names:
            got = sorted(position) if isinstance(position, Mapping) else type(position).__name__
            raise ValueError(
                "run: initial_position for a PyMC model is a dict {value variable: "
                "unconstrained values with a leading chain axis} with the keys "
                f"{sorted(names)}; got {got}. Or pass None for PyMC's jittered initial points."
            )
        return {k: _as_model_float(v) for k, v in position.items()}

    return start


def _as_model_float(value: Any) -> jax.Array:
    """A start's values in the model's float type (float64 under its run's x64 scope,
    whatever the user's arrays were made with: their process may be float32)."""
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.floating):
        return value.astype(jnp.result_type(float))
    return value


class PymcModel(ModelAdapter):
    """A PyMC model as ``cr.run`` takes it: PyMC's JAX log density, sampled by blackjax.

    Build it with ``cr.from_pymc``. Sampling is in PyMC's unconstrained value space
    (``tau_log__``); ``trace.draws`` are the model's variables, constrained, with its
    ``Deterministic``s. ``to_arviz`` gets the model's coords and dims, ``observed_data``,
    ``constant_data`` (``pm.Data``) and, if asked for, ``log_likelihood``.

    Attributes:
        model: the ``pm.Model``.
        sampler: the blackjax adapter that samples the log density (``from_blackjax``).
        compiled: the model's functions in JAX (``Compiled``).

    Examples:
        >>> import pymc as pm
        >>> import chainrunner as cr
        >>> with pm.Model(coords={"g": ["a", "b"]}) as model:
        ...     mu = pm.Normal("mu", dims="g")
        >>> adapter = cr.from_pymc(model)
        >>> adapter.dims(), adapter.coords()
        ({'mu': ['g']}, {'g': ['a', 'b']})
        >>> adapter.x64  # its runs are 64-bit, the process's JAX setting unchanged
        True
    """

    def __init__(self, model: Any, sampler: Adapter, compiled: Compiled, log_likelihood: bool):
        from pymc.backends.arviz import (
            coords_and_dims_for_inferencedata,
            find_constants,
            find_observations,
        )

        super().__init__(sampler, _start(compiled), compiled.constrain)
        self.model, self.compiled = model, compiled
        self.want_log_likelihood = bool(log_likelihood)
        self.x64 = _float64()
        coords, dims = coords_and_dims_for_inferencedata(model)
        self._coords = {k: list(np.asarray(v).tolist()) for k, v in coords.items()}
        self._dims = {k: list(v) for k, v in dims.items()}
        self._observed = {k: np.asarray(v) for k, v in (find_observations(model) or {}).items()}
        self._constants = {k: np.asarray(v) for k, v in (find_constants(model) or {}).items()}
        self._data = data_values(model)  # as compiled: pm.set_data later is an error

    def __repr__(self) -> str:
        return f"PymcModel({self.model.name or 'model'!r}, {self.sampler!r})"

    init_error_hint = (
        "PyMC: the log density is not finite at the start (PyMC's jittered initial point, "
        "retried jitter_max_retries times, or initial_position); check the model's initvals "
        "with model.point_logps(), or try from_pymc(..., jitter=False)."
    )

    def build_kernel(self, *, num_warmup: int, previous_params: Any = None) -> Kernel:
        """The sampler's kernel, starting from PyMC's initial points, with constrained draws.

        Raises:
            ValueError: where the model's ``pm.Data`` or dim lengths changed since
                ``from_pymc`` (``pm.set_data``, ``set_dim``): the compiled program holds
                the data it was built with.
        """
        changed = self._changed_data()
        if changed:
            raise ValueError(
                f"run: the PyMC model's data {changed} changed since cr.from_pymc (pm.set_data "
                "or set_dim), and this kernel holds the data it was built with. Call "
                "cr.from_pymc(model, ...) again after pm.set_data: it builds the kernel for the "
                "new data."
            )
        return super().build_kernel(num_warmup=num_warmup, previous_params=previous_params)

    def _changed_data(self) -> list[str]:
        """The model's ``pm.Data`` containers and dims changed since ``from_pymc``
        (``pm.set_data``, ``set_dim``)."""
        return changed_data(self._data, data_values(self.model))

    def log_likelihood(self, draws: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Pointwise log likelihood of the observed variables at each draw.

        As ``pm.compute_log_likelihood``: the model's observed variables' elementwise log
        density, given the constrained draws.

        Args:
            draws: ``trace.draws`` of a run of this model: ``{variable: (chain, draw, ...)}``.

        Returns:
            ``{observed variable: numpy array (chain, draw, *its shape)}``.
        """
        free = {rv.name for rv in self.model.free_RVs}
        with x64_scope(self):
            return self.over_draws("log_likelihood", self.compiled.log_likelihood)(
                {k: v for k, v in draws.items() if k in free}
            )

    def groups(self, draws: Any, *, complete: bool) -> dict[str, dict[str, Any]]:
        """``observed_data``, ``constant_data`` and (when asked for) ``log_likelihood``."""
        out: dict[str, dict[str, Any]] = {}
        if self._observed:
            out["observed_data"] = dict(self._observed)
        if self._constants:
            out["constant_data"] = dict(self._constants)
        if self.want_log_likelihood and complete:
            missing = sorted({rv.name for rv in self.model.free_RVs} - set(draws))
            if missing:  # keep= left them out: the draws stand, the group cannot be made
                from ..output._diagnostics import ChainrunnerWarning, caller_stacklevel

                warnings.warn(
                    f"from_pymc(log_likelihood=True): the draws have no {missing} (keep= "
                    "left them out), which the log likelihood needs; the trace has no "
                    "log_likelihood group. Keep every free variable to get it.",
                    ChainrunnerWarning,
                    stacklevel=caller_stacklevel(),
                )
            else:
                out["log_likelihood"] = self.log_likelihood(draws)
        return out

    def dims(self) -> dict[str, list[str]]:
        """The model's dims, as ``pm.sample`` gives them to ArviZ."""
        return {k: list(v) for k, v in self._dims.items()}

    def coords(self) -> dict[str, Any]:
        """The model's coords, as ``pm.sample`` gives them to ArviZ."""
        return {k: list(v) for k, v in self._coords.items()}

    def attrs(self) -> dict[str, Any]:
        """The sampler's library, and PyMC as the modeling interface."""
        pymc = _pymc()
        return {
            **self.sampler.attrs(),
            "modeling_interface": "pymc",
            "modeling_interface_version": pymc.__version__,
        }


def data_values(model: Any) -> dict[str, tuple]:
    """A digest of each of the model's ``pm.Data`` containers and dim lengths (what
    ``pm.set_data`` and ``model.set_dim`` change), by name (``_digest``)."""
    found = {str(var.name): var for var in getattr(model, "data_vars", ())}
    found.update({f"dim {k}": v for k, v in getattr(model, "dim_lengths", {}).items()})
    out = {}
    for name, var in found.items():
        get = getattr(var, "get_value", None)
        if get is not None:
            out[name] = _digest(get(borrow=True))
    return out


def _digest(value: Any) -> tuple:
    """``array_digest`` of an array, or of a scipy sparse matrix's parts."""
    parts = [getattr(value, a, None) for a in ("data", "indices", "indptr")]
    if hasattr(value, "tocsr") and all(p is not None for p in parts):  # scipy sparse
        return (
            type(value).__name__,
            np.shape(value),
            *(array_digest(np.asarray(p)) for p in parts),
        )
    data = np.asarray(value)
    return array_digest(data) if data.dtype != object else ("object", repr(data.tolist()))


def array_digest(data: np.ndarray) -> tuple:
    """``(shape, dtype, blake2b of the bytes)`` of a numeric array.

    Examples:
        >>> array_digest(np.zeros(2))[:2]
        ((2,), 'float64')
    """
    data = np.ascontiguousarray(data)
    return (data.shape, str(data.dtype), hashlib.blake2b(data.tobytes()).hexdigest())


def changed_data(before: Mapping[str, tuple], now: Mapping[str, tuple]) -> list[str]:
    """The containers of ``before`` whose digests differ in ``now`` (or that are gone); a
    container added since is not in the compiled program, and changes nothing."""
    return sorted(k for k in before if now.get(k) != before[k])


def _check_model(pymc: Any, model: Any) -> None:
    where = "from_pymc"
    if not isinstance(model, pymc.Model):
        raise TypeError(f"{where}: model must be a pymc.Model, got {type(model).__name__}.")
    if not model.free_RVs:
        raise ValueError(f"{where}: the model has no free random variables to sample.")
    discrete = [v.name for v in model.free_RVs if v.type.dtype.startswith(("int", "uint"))]
    if discrete:
        raise ValueError(
            f"{where}: the model has discrete variables {discrete}; blackjax's gradient-based "
            "samplers need continuous ones (marginalise them out, e.g. with pymc_extras)."
        )


def from_pymc(
    model: Any,
    *,
    algorithm: Any = None,
    adaptation: Any = "fisher_low_rank",
    target_accept: float | None = None,
    log_likelihood: bool = False,
    initvals: Mapping | None = None,
    jitter: bool = True,
    jitter_max_retries: int = 10,
    **options: Any,
) -> PymcModel:
    """``cr.from_pymc`` (its docstring, in ``chainrunner.adapters``, has the details)."""
    reject_pm_sample_words("from_pymc", options)
    pymc = _pymc()
    _check_model(pymc, model)
    if adaptation is not None:
        name_of(adaptation, "from_pymc")  # a clear error for an unknown one, now
    options = with_target_accept(adaptation, target_accept, options, "from_pymc")
    with jax.enable_x64(_float64()):
        compiled = compile_model(
            model, initvals=initvals, jitter=jitter, jitter_max_retries=jitter_max_retries
        )
        sampler = build_sampler(algorithm, adaptation, compiled.logdensity_fn, options, "from_pymc")
    return PymcModel(model, sampler, compiled, log_likelihood)
