"""The benchmark scripts' reporting: the numbers a closing note quotes come from here."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import bench_batch_size as b
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


def _grid_row(warm, e2e, floors=True):
    best_warm, best_e2e = min(warm, key=warm.get), min(e2e, key=e2e.get)
    w = {"default": warm[best_warm] * 1.01, **warm}
    floor = min(w["b=1"], w["b=all"]) if floors else float("nan")
    return {
        "jax": "0.12", "model": "matmul", "chains": 64, "devices": 2, "chosen": 8,
        "warm_s": w, "e2e_s": {"default": e2e[best_e2e] * 1.2, **e2e},
        "best_warm": best_warm, "best_e2e": best_e2e, "warm_vs_best": 1.01,
        "e2e_vs_best": 1.2, "warm_vs_floor": w["default"] / floor,
        "b1_warm_vs_floor": w["b=1"] / floor,
    }  # fmt: skip


def test_batch_size_grid_flags_misses_and_rows_without_floors():
    # b=8's compile (6 - 1 s) is not under 10 % of its end to end: no warm target
    row = _grid_row({"b=1": 2.0, "b=8": 1.0, "b=all": 1.5}, {"b=1": 9.0, "b=8": 6.0, "b=all": 8.0})
    assert not b.warm_applies(row)
    # a long row: the best warm choice compiles 3 s of 50 s, so the warm target applies
    long = _grid_row({"b=1": 60.0, "b=all": 47.0}, {"b=1": 62.0, "b=all": 50.0}, floors=False)
    long["warm_vs_best"], long["long"], long["warmup"], long["draws"] = 1.2, True, 2000, 2000
    assert b.warm_applies(long)
    text = b.table([row, long])
    assert "| 0.12 | matmul | 64 | 2 | 8 | 1.01 | 1.20 ✗ | 0.67 | 1.33 | b=8 | b=8 | no |" in text
    assert (
        "| matmul (2000+2000) | 64 | 2 | 8 | 1.20 ✗ | 1.20 ✗ | - | - | None | None | yes |" in text
    )
    assert b.summary([row, long]).startswith(
        "All 2 rows: default within 1.1 of the best fixed `batch_size` end to end on 0. On "
        "the 1 rows where the best warm choice's compile is under 10% of its end to end "
        "time, within 1.1 of the best warm on 0."
    )


def test_batch_size_grid_times_the_candidates_cold_again():
    calls = []

    def call(m, seed):
        calls.append(m)
        return {"default": 4.0, "b=1": 3.0, "b=8": 5.0}[m]

    first = {"default": 9.0, "b=1": 4.0, "b=8": 4.8, "b=all": 7.0, "floor[vmap]": 3.0}
    cold, calls_s = b.cold_times(first, 3, call)
    # b=8 (within 1.25x of b=1's 4.0) and the default again; b=all and the floor once
    assert sorted(calls) == ["b=1", "b=1", "b=8", "b=8", "default", "default"]
    assert cold == {"default": 4.0, "b=1": 3.0, "b=8": 5.0, "b=all": 7.0, "floor[vmap]": 3.0}
    assert calls_s["b=1"] == [4.0, 3.0, 3.0] and calls_s["b=all"] == [7.0]
    assert b.cold_times(first, 1, call)[0] == first and len(calls) == 6


def test_pooled_bench_counts_draws_until_converged():
    import bench_pooled

    rng = np.random.default_rng(0)
    mixed = rng.standard_normal((64, 300, 2))
    assert bench_pooled.draws_needed(mixed) == bench_pooled.PREFIXES[0]
    stuck = mixed + np.arange(64)[:, None, None] * 0.5  # chains that never meet
    assert bench_pooled.draws_needed(stuck) is None
    slow = np.cumsum(rng.standard_normal((64, 300, 1)), axis=1)  # a random walk
    assert bench_pooled.draws_needed(slow) is None


def test_numpyro_machine_table_has_a_row_per_way():
    import bench_numpyro_machine as nm

    way = {"sampling_s": 2.0, "steps_per_draw": 9.04, "ess_mu_per_s": 1234.4, "mean_mu": 4.41,
           "speed_vs_numpyro_vmap": 1.5}  # fmt: skip
    text = nm.table([{"width": 32, **{w: way for w in nm.WAYS}}])
    assert text.count("\n") == 1 + len(nm.WAYS)
    assert "| 32 | window, machine | 2.00 | 1.50 | 9.0 | 1234 | 4.41 |" in text
