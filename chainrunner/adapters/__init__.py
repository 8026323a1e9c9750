"""Front ends: everything ``run`` accepts as a kernel becomes an ``Adapter`` here.

- ``_blackjax``: blackjax ``SamplingAlgorithm`` objects, and factories with any of
  blackjax's adaptations (window in the loop, its per-chain ones before sampling, ChEES
  and MEADS across chains).
- ``_numpyro``: numpyro ``MCMCKernel`` objects (and bare model functions, run with NUTS).
- ``_pymc``: PyMC models (``pm.Model``), PyMC's JAX log density sampled by blackjax; PyMC
  is optional (``pip install "chainrunner[pymc]"``) and imported only when used.

A new front end implements ``chainrunner.Adapter`` (see [contributing](contributing.md)) and is
recognised in ``as_adapter``.
"""

from __future__ import annotations

import types
from typing import Any

from ..core._kernel import Adapter, FixedKernel, Kernel
from ._blackjax import from_blackjax, is_sampling_algorithm

__all__ = ["as_adapter", "from_blackjax", "from_numpyro", "from_pymc"]


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
    """A numpyro kernel or model for ``cr.run``: numpyro's own adaptation, or chainrunner's.

    With ``adaptation=None`` (the default) numpyro's kernel runs as it is (``NUTS``,
    ``HMC``, ``BarkerMH``, ``SA``, the ensemble kernels ``AIES`` and ``ESS`` with their
    walkers as chains, ...), its own adaptation during ``cr.run``'s ``num_warmup``
    steps. Chains start from numpyro's init strategy (``cr.run(kernel, key, None, n,
    num_chains=...)``) or from constrained values ``{site: array with a leading chain
    axis}``; draws are constrained and include deterministic sites; stats use ArviZ
    names (``lp`` = -potential energy, ``acceptance_rate``, ``diverging``, ``n_steps``,
    ``tree_depth``, ``energy``, ``step_size``). The array leaves of the model arguments
    are inputs of the compiled program (new data of the same shapes reuse it); other
    leaves (Python numbers, strings) are constants of it.

    With ``adaptation=`` the model's log density (numpyro's potential energy, in the
    unconstrained space) is sampled by blackjax (``algorithm``, by default the
    adaptation's own factory: ``blackjax.nuts`` for the HMC family) with any adaptation
    ``cr.from_blackjax`` takes: nutpie's ``"fisher_low_rank"`` (the default of
    ``cr.from_pymc``: on the four models of ``benchmarks/bench_numpyro_fisher.py``,
    0.9-1.9x the ESS per gradient of numpyro's better mass matrix, 1.0-4.1x with warmup
    counted: [numpyro models](numpyro.md)), ``"fisher"``,
    Stan's ``"window"``, ``"chees"``, ``"pathfinder"``, ... and its ``**options``. Starts,
    draws and ArviZ data stay numpyro's. A ``NUTS(model, ...)``'s ``target_accept_prob``,
    ``max_tree_depth``, ``dense_mass`` (``"window"`` only) and ``init_strategy`` carry
    over; its other settings (a step size, a mass matrix, ...) are an error. The model's
    data are then constants of the compiled programs (new data compile anew).

    A new ``NUTS(model)`` of the same model, data and settings (a notebook cell run
    again) reuses the compiled programs; another model, constant or setting never does
    ([what is compiled when](compilation.md)).

    Args:
        kernel: a numpyro ``MCMCKernel``, a model function (run with ``NUTS``), or a
            ``NumpyroKernel`` from an earlier call (rebound to the new arguments).
        model_args: positional arguments of the model.
        model_kwargs: keyword arguments of the model.
        log_likelihood: also compute the pointwise log likelihood of the observed sites
            at every draw (ArviZ's ``log_likelihood`` group, for LOO/WAIC).
        data: how the model's array arguments enter the compiled program: ``"inputs"``
            (arguments: new data of the same shapes reuse it), ``"constants"`` (closed
            over, as numpyro's ``MCMC`` does by default: for models that run numpy on
            their data), or ``"auto"`` (inputs if the model traces with its data as
            inputs, else constants). With ``adaptation=``: constants (``"inputs"`` is an
            error).
        adaptation: ``None`` (numpyro's own), or a name or adaptation function that
            ``cr.from_blackjax`` takes ([blackjax with warmup](warmup.md)).
        algorithm: with ``adaptation``, the blackjax factory (``None``: the adaptation's
            own, ``blackjax.nuts`` for the HMC family).
        **options: with ``adaptation``, its options (``cr.from_blackjax``), e.g.
            ``target_acceptance_rate=0.9`` or ``max_rank=20``.

    Returns:
        A ``NumpyroKernel`` (numpyro's adaptation) or a ``NumpyroModel``
        (``adaptation=``): pass it to ``cr.run`` / ``cr.sample``.

    Raises:
        TypeError: for anything else than the above, a model that cannot take its
            arguments, options without ``adaptation``, or a kernel ``adaptation`` cannot
            run (numpyro's ``HMC``, ``SA``, ...: pass ``NUTS(model)`` or the model).
        ValueError: for NUTS settings chainrunner's adaptation replaces, discrete latent
            sites with ``adaptation``, or a bad ``data``.

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
    """A PyMC model as a kernel for ``cr.run`` / ``cr.sample``, sampled with blackjax.

    The log density is PyMC's own JAX conversion of the model (``pymc.sampling.jax``), in
    its unconstrained value space; the sampler is ``cr.from_blackjax(algorithm,
    logdensity_fn=..., adaptation=..., **options)`` on it. Chains start from PyMC's
    jittered initial points, drawn from chainrunner's keys (``cr.run(kernel, key, None,
    n, num_chains=...)``), or from ``initial_position={value variable: unconstrained
    values}`` (``{"tau_log__": ...}``). Draws come back as ``pm.sample`` returns them:
    constrained, named as the model's variables, with its ``Deterministic``s; the ArviZ
    data has the model's coords and dims, ``observed_data``, ``constant_data`` and, with
    ``log_likelihood=True``, ``log_likelihood``.

    A float64 model runs in 64 bits, under JAX's scoped ``jax.enable_x64(True)`` for each
    ``run`` of it: the process's ``jax_enable_x64`` stays as it was (``pm.sample``'s JAX
    samplers turn it on for the whole process). The model's data are constants of
    the compiled program: after ``pm.set_data``, call ``from_pymc`` again (it recompiles);
    the kernel built before raises a ``ValueError`` in ``run`` rather than sample the old data.

    Args:
        model: a ``pm.Model`` with continuous free variables.
        algorithm: the blackjax factory; ``None`` for the adaptation's own
            (``blackjax.nuts``; ``blackjax.dynamic_hmc`` for ``"chees"``, ``blackjax.ghmc``
            for ``"meads"``, ``blackjax.mclmc`` for ``"mclmc"``,
            ``blackjax.adjusted_mclmc_dynamic`` for ``"adjusted_mclmc"``).
        adaptation: ``"fisher_low_rank"`` (the default: nutpie's Fisher-divergence
            adaptation with a low-rank mass matrix, per chain, in the sampling loop),
            ``"fisher"`` (its diagonal form), ``"window"`` (Stan's), any other
            name or blackjax adaptation function ``cr.from_blackjax`` takes
            (``"window_low_rank"``, ``"staged"``, ``"pathfinder"``, ``"mclmc"``,
            ``"adjusted_mclmc"``: per chain, before sampling; ``"chees"``, ``"meads"``:
            across chains), or ``None``: no adaptation, the kernel is
            ``algorithm(logdensity_fn, **options)`` (e.g. ``step_size=0.1``).
        target_accept: ``pm.sample``'s name for the target acceptance rate (the
            adaptation's ``target_acceptance_rate``, or ``target`` for
            ``"adjusted_mclmc"``); ``None`` keeps the adaptation's default.
        log_likelihood: add the pointwise log likelihood (ArviZ ``log_likelihood``), as
            ``pm.sample(idata_kwargs={"log_likelihood": True})`` does.
        initvals: initial values ``{variable or name: value}`` for every chain, over the
            model's own ``initval``s (as ``pm.sample(initvals=...)``).
        jitter: add PyMC's ``U(-1, 1)`` jitter to the initial points (unconstrained space).
        jitter_max_retries: new jitters for a chain whose start has a non-finite log density.
        **options: the adaptation's options (see ``cr.from_blackjax``), e.g.
            ``target_acceptance_rate=0.9`` or ``is_mass_matrix_diagonal=False``.

    Returns:
        A ``PymcModel``: pass it to ``cr.run`` / ``cr.sample``. A new ``pm.Model`` of the
        same model (a notebook cell run again) compiles nothing again: compiled programs
        are found by what they compute.

    Raises:
        ImportError: without PyMC (``pip install "chainrunner[pymc]"``): it says so.
        TypeError, ValueError: for a model with discrete variables, or options the
            sampler does not take.
        TypeError: for a keyword of ``pm.sample`` that belongs to ``cr.run`` /
            ``cr.sample`` (``tune=``, ``draws=``, ``chains=``, ``random_seed=``, ...), with
            chainrunner's word for it.

    Examples:
        >>> import jax, numpy as np, pymc as pm
        >>> import chainrunner as cr
        >>> with pm.Model(coords={"obs_id": range(3)}) as model:
        ...     sigma = pm.HalfNormal("sigma")
        ...     y = pm.Normal("y", 0.0, sigma, observed=np.array([0.5, -1.0, 2.0]), dims="obs_id")
        >>> idata = cr.sample(cr.from_pymc(model), jax.random.key(0), None, 100,
        ...                   num_warmup=100, num_chains=4, progress=False)
        >>> idata.posterior["sigma"].shape, "sigma_log__" in idata.posterior
        ((4, 100), False)
        >>> jax.config.jax_enable_x64  # the process's setting, as it was
        False
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
        return FixedKernel(kernel)
    if is_sampling_algorithm(kernel):
        return FixedKernel(from_blackjax(kernel), library="blackjax")
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
