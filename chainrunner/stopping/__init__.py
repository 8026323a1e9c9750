"""Stopping rules and convergence: vectorised R-hat and ESS, ``until=`` and
``warmup_until=``'s targets.
"""
