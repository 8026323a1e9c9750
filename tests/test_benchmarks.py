"""The benchmark scripts' reporting: the numbers a closing note quotes come from here."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import bench_overhead


def test_bootstrap_interval_brackets_the_median():
    rng = np.random.default_rng(0)
    values = 1.0 + 0.02 * rng.standard_normal(25)
    med, lo, hi = bench_overhead.bootstrap_median(values, np.random.default_rng(1))
    assert med == np.median(values)
    assert lo <= med <= hi
    # The median of 25 values with sd 0.02 has a standard error of about 0.005.
    assert 0.002 < hi - lo < 0.04


def _row(method, ratio, lo, hi, devices=2):
    return {
        "model": "eight_schools", "chains": 8, "devices": devices, "method": method,
        "reps": 9, "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
    }  # fmt: skip


def test_overhead_table_counts_rows_over_target():
    rows = [
        _row("chainrunner[vmap]", 1.02, 0.99, 1.04),
        _row("chainrunner[batch=1]", 1.07, 1.01, 1.09),
        _row("chainrunner[vmap]", 1.10, 1.06, 1.12, devices=8),
    ]
    text = bench_overhead.table(rows)
    assert "| eight_schools | 8 | 2 | 9 | 1.020 (0.990-1.040) | 1.070 (1.010-1.090) |" in text
    assert "| eight_schools | 8 | 8 | 9 | 1.100 (1.060-1.120) | - |" in text
    assert "2 above 1.05, 1 with the whole interval above 1.05" in text
