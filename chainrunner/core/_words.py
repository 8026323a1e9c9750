"""pm.sample's words, translated: an error naming the function called and chainrunner's word.

A PyMC user writes ``cr.from_pymc(model, tune=500)`` or ``cr.sample(..., draws=200)``.
Where chainrunner has one name for the same thing, the call says which, instead of
passing the word on to a function the user never called.
"""

from __future__ import annotations

from collections.abc import Iterable

#: pm.sample's keyword -> chainrunner's word for it, where it goes.
PM_SAMPLE_WORDS = {
    "draws": "num_samples, the 4th argument: cr.sample(kernel, key, None, 1000, ...)",
    "tune": "num_warmup= of cr.run / cr.sample",
    "chains": "num_chains= of cr.run / cr.sample",
    "random_seed": "the rng_key argument of cr.run / cr.sample: jax.random.key(seed)",
    "target_accept": "target_accept= of cr.from_pymc (or the adaptation's target_acceptance_rate=)",
    "initvals": "initvals= of cr.from_pymc, or initial_position= of cr.run / cr.sample",
    "init": "adaptation= and jitter= of cr.from_pymc",
    "step": "algorithm= of cr.from_pymc (a blackjax factory such as blackjax.nuts)",
    "cores": "mesh= of cr.run / cr.sample (chains spread over every device by default)",
    "progressbar": "progress= of cr.run / cr.sample",
    "discard_tuned_samples": "keep_warmup= of cr.run / cr.sample (its opposite)",
    "compute_convergence_checks": "warn= of cr.run / cr.sample",
    "return_inferencedata": "cr.sample returns ArviZ data, cr.run a Trace",
    "idata_kwargs": "log_likelihood=True of cr.from_pymc",
    "var_names": "keep= of cr.run / cr.sample",
    "nuts_sampler": "cr.from_pymc always samples with blackjax",
    "nuts_sampler_kwargs": "the adaptation's options, as keywords of cr.from_pymc",
}


def reject_pm_sample_words(where: str, names: Iterable[str], accepted: Iterable[str] = ()) -> None:
    """A ``TypeError`` for every keyword of ``pm.sample`` in ``names`` that ``where`` does
    not take (``accepted`` are those it does), with chainrunner's word for each.

    Examples:
        >>> reject_pm_sample_words("from_pymc", ["tune", "step_size"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: from_pymc: 'tune' is pm.sample's word; chainrunner's is num_warmup= of ...
    """
    found = [n for n in names if n in PM_SAMPLE_WORDS and n not in set(accepted)]
    if found:
        words = "; ".join(
            f"{n!r} is pm.sample's word; chainrunner's is {PM_SAMPLE_WORDS[n]}" for n in found
        )
        raise TypeError(f"{where}: {words}.")
