"""Front ends: everything ``run`` accepts as a kernel becomes an ``Adapter`` here.

- ``_blackjax``: blackjax ``SamplingAlgorithm`` objects, and factories with any of
  blackjax's adaptations (window in the loop, its per-chain ones before sampling, ChEES
  and MEADS across chains).
- ``_numpyro``: numpyro ``MCMCKernel`` objects (and bare model functions, run with NUTS).
- ``_pymc``: PyMC models (``pm.Model``), PyMC's JAX log density sampled by blackjax; PyMC
  is optional (``pip install "chainrunner[pymc]"``) and imported only when used.

A new front end implements ``chainrunner.Adapter`` (see docs/contributing.md) and is
recognised in ``as_adapter``.
"""

from __future__ import annotations

import types
from typing import Any

from ..core._fingerprint import stable_digest
from ..core._kernel import Adapter, FixedKernel, Kernel
from ._blackjax import adapted_parameters, from_blackjax, is_sampling_algorithm

__all__ = ["adapted_parameters", "as_adapter", "from_blackjax", "from_numpyro", "from_pymc"]


def from_numpyro(
    kernel: Any,
    *,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    log_likelihood: bool = False,
    data: str = "auto",
    adaptation: Any = None,
    algorithm: Any = None,
    **options: Any,
) -> Any:
    """Wraps a numpyro ``MCMCKernel`` (or a model function: NUTS) for ``cr.run``.

    With ``adaptation=None`` (the default) numpyro's kernel runs as it is, with numpyro's
    own adaptation: see ``chainrunner.adapters._numpyro.from_numpyro``. With
    ``adaptation=`` (any name or adaptation ``cr.from_blackjax`` takes: nutpie's
    ``"fisher_low_rank"``, Stan's ``"window"``, ``"chees"``, ``"pathfinder"``, ...) the
    model's log density is sampled by blackjax (``algorithm``: the factory, by default
    the adaptation's own, ``blackjax.nuts`` for the HMC family) with that adaptation and
    its ``**options``, as ``cr.from_pymc`` does; starts, draws and ArviZ data stay
    numpyro's: see ``chainrunner.adapters._numpyro_model``. A ``NUTS(model, ...)``'s
    ``target_accept_prob``, ``max_tree_depth``, ``dense_mass`` (window only) and
    ``init_strategy`` carry over; its other settings are an error there.

    Examples:
        >>> import jax, numpyro, numpyro.distributions as dist
        >>> import chainrunner as cr
        >>> def model():
        ...     numpyro.sample("x", dist.Normal())
        >>> kernel = cr.from_numpyro(numpyro.infer.NUTS(model))  # numpyro's own adaptation
        >>> fisher = cr.from_numpyro(model, adaptation="fisher_low_rank")  # nutpie's
        >>> cr.run(fisher, jax.random.key(0), None, 10, num_warmup=50, num_chains=2,
        ...        progress=False).draws["x"].shape
        (2, 10)
    """
    if adaptation is not None:
        from ._numpyro_model import from_numpyro_model

        return from_numpyro_model(
            kernel, model_args=model_args, model_kwargs=model_kwargs,
            log_likelihood=log_likelihood, data=data, adaptation=adaptation,
            algorithm=algorithm, options=options,
        )  # fmt: skip
    if algorithm is not None or options:
        given = sorted(options) + (["algorithm"] if algorithm is not None else [])
        raise TypeError(
            f"from_numpyro: {given} apply only with adaptation= (chainrunner's adaptations "
            "on the model's log density, e.g. adaptation='fisher_low_rank'); without it "
            "numpyro's kernel runs with its own settings (give them to NUTS(model, ...))."
        )
    from ._numpyro import from_numpyro as impl

    return impl(
        kernel,
        model_args=model_args,
        model_kwargs=model_kwargs,
        log_likelihood=log_likelihood,
        data=data,
    )


def from_pymc(
    model: Any,
    *,
    algorithm: Any = None,
    adaptation: Any = "fisher_low_rank",
    target_accept: float | None = None,
    log_likelihood: bool = False,
    initvals: dict | None = None,
    jitter: bool = True,
    jitter_max_retries: int = 10,
    **options: Any,
) -> Any:
    """A PyMC model (``pm.Model``) as a kernel for ``cr.run``, sampled with blackjax.

    See ``chainrunner.adapters._pymc.from_pymc`` for the details. Needs PyMC
    (``pip install "chainrunner[pymc]"``): without it, an ``ImportError`` says so.

    Examples:
        >>> import pymc as pm
        >>> import chainrunner as cr
        >>> with pm.Model() as model:
        ...     x = pm.Normal("x")
        >>> kernel = cr.from_pymc(model)
        >>> kernel is cr.from_pymc(model)
        True
        >>> import jax; jax.config.update("jax_enable_x64", False)  # PyTensor turned it on
    """
    from ._pymc import from_pymc as impl  # imports pymc, or says which extra to install

    return impl(
        model,
        algorithm=algorithm,
        adaptation=adaptation,
        target_accept=target_accept,
        log_likelihood=log_likelihood,
        initvals=initvals,
        jitter=jitter,
        jitter_max_retries=jitter_max_retries,
        **options,
    )


def _kernel_error(kernel: Any, where: str, detail: str = "") -> TypeError:
    return TypeError(
        f"{where}: kernel must be a blackjax SamplingAlgorithm, a numpyro MCMCKernel, a "
        f"pymc.Model, a cr.Kernel or an adapter (from cr.from_blackjax / cr.from_numpyro / "
        f"cr.from_pymc), got "
        f"{type(kernel).__name__}{detail}."
    )


def as_adapter(kernel: Any, where: str = "run") -> Adapter:
    """Anything ``run`` accepts as a kernel -> its ``Adapter``, or a ``TypeError``.

    A plain function is taken for a numpyro model only if it runs as one without
    arguments (a model with data goes through ``cr.from_numpyro(model, model_args=...)``).
    """
    if isinstance(kernel, Adapter):
        return kernel
    if isinstance(kernel, Kernel):
        what = ("kernel", kernel.functions, kernel.needs_position, kernel.ensemble)
        return FixedKernel(kernel, identity=stable_digest(what))
    if is_sampling_algorithm(kernel):
        identity = stable_digest(("blackjax", kernel))
        return FixedKernel(from_blackjax(kernel), library="blackjax", identity=identity)
    if (type(kernel).__module__ or "").startswith("numpyro."):
        return from_numpyro(kernel)
    if (type(kernel).__module__ or "").startswith("pymc."):  # pymc is imported only then
        from ._pymc import is_pymc_model

        if is_pymc_model(kernel):
            return from_pymc(kernel)
    if isinstance(kernel, types.FunctionType):
        from ._numpyro import is_model

        if is_model(kernel):
            return from_numpyro(kernel)
        raise _kernel_error(
            kernel,
            where,
            f" {kernel.__name__!r}, which is not a numpyro model that runs without arguments "
            "(for a model with data use cr.from_numpyro(model, model_args=...); for a log "
            "density, a blackjax algorithm such as blackjax.nuts(logdensity_fn, step_size, "
            "inverse_mass_matrix))",
        )
    raise _kernel_error(kernel, where)
