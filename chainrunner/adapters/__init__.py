"""Bridges to sampling libraries (imported lazily, so that each stays optional)."""

from typing import Any


def from_numpyro(
    kernel: Any,
    *,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    log_likelihood: bool = False,
) -> Any:
    """Wraps a numpyro ``MCMCKernel`` (or a model function: NUTS) for ``cr.run``.

    See ``chainrunner.adapters._numpyro.from_numpyro`` for the details.

    Examples:
        >>> import numpyro, numpyro.distributions as dist
        >>> import chainrunner as cr
        >>> def model():
        ...     numpyro.sample("x", dist.Normal())
        >>> kernel = cr.from_numpyro(numpyro.infer.NUTS(model))
    """
    from ._numpyro import from_numpyro as impl

    return impl(
        kernel, model_args=model_args, model_kwargs=model_kwargs, log_likelihood=log_likelihood
    )
