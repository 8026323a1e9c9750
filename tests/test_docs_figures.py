"""The docs as a reader sees them: headline figures read from benchmarks/results/, no
project history on the pages (docs/check_browser.py's words), code that keeps its shape, a
site that can be published.

Every headline number of the home, benchmarks, PyMC and GPU pages is recomputed from
the results file it quotes, so a new benchmark run that moves a figure fails this test
until the pages move with it (``python docs/gen_charts.py`` rewrites the benchmarks
page's headline section).
"""

import importlib.util
import json
import os
import re
import statistics

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = os.path.join(ROOT, "docs")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))
DASH, TIMES = "\u2013", "\u00d7"  # the pages' range dash and multiplication sign


def read(*parts):
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return f.read()


def docs_script(name):
    """A script of docs/ (not a package), loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(DOCS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gen_charts():
    return docs_script("gen_charts")


def test_benchmarks_headline_is_what_the_results_say():
    charts = gen_charts()
    page = read(DOCS, "benchmarks.md")
    section = charts.START + page.split(charts.START, 1)[1].split(charts.END, 1)[0]
    expected = charts.headline(charts.suite_rows(), charts.overhead_rows())
    assert section + charts.END == expected, "run python docs/gen_charts.py"
    svg = read(DOCS, "images", "chart-benchmarks.svg")
    assert svg == charts.chart(charts.suite_rows(), charts.overhead_rows())
    assert ">batch_size</text>" in svg  # the third panel's two colours have a key


def test_home_page_figures_are_the_defaults_measured():
    charts = gen_charts()
    rows = charts.suite_rows()
    home = read(DOCS, "index.md")
    vs_floor = [r["vs_floor"] for r in rows]
    assert f"a median {statistics.median(vs_floor):.2f}{TIMES} the time of" in home
    assert f"over {len(rows)}\n  layouts with diagnostics on" in home
    assert f"({min(vs_floor):.2f}{DASH}{max(vs_floor):.2f}{TIMES}; `suite.json`)" in home
    ess = [r["ess"] for r in rows]
    assert f"{min(ess):.1f}{DASH}{max(ess):.0f}{TIMES} the ESS per" in home
    many = [r["first"] for r in rows if r["chains"] > r["devices"]]
    assert f"in {min(many):.2f}{DASH}{max(many):.2f} of its time" in home


def fisher_ratios():
    """chainrunner's default over nutpie's better setting, per model (mean of seeds)."""
    runs = json.loads(read(RESULTS, "fisher.json"))

    def mean(model, method, key):
        return statistics.mean(
            r[key] for r in runs if r["model"] == model and r["method"] == method
        )

    out = {}
    for model in sorted({r["model"] for r in runs}):
        out[model] = {
            key: mean(model, "cr default", key)
            / max(mean(model, m, key) for m in ("nutpie diag", "nutpie low rank"))
            for key in ("ess_per_1000_grad", "ess_per_s")
        }
    return out


def test_pymc_figures_against_nutpie_are_the_results():
    ratios = fisher_ratios()
    per_grad = [r["ess_per_1000_grad"] for r in ratios.values()]
    words = f"{min(per_grad):.2f}{DASH}{max(per_grad):.2f} of"
    pymc, home = read(DOCS, "pymc.md"), read(DOCS, "index.md")
    assert words in pymc and words in home


TTP_LABELS = {
    "eight_schools": "eight schools",
    "radon_like": "radon-like, 89-d",
    "dense_gaussian": "dense Gaussian, 100-d",
    "logistic": "logistic, 12-d",
}


def time_to_posterior_rows():
    """The PyMC page's table: per model, chainrunner's ESS per process-second over the
    better of nutpie and PyMC's numpyro path, first and second process, jax 0.12 then 0.10
    (``benchmarks/bench_time_to_posterior.py``'s results)."""
    spec = importlib.util.spec_from_file_location(
        "bench_ttp", os.path.join(ROOT, "benchmarks", "bench_time_to_posterior.py")
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    stacks = [
        bench.ratios(json.loads(read(RESULTS, f"time_to_posterior-{v}.json"))["rows"])
        for v in ("jax012", "jax010")
    ]
    return {
        model: [stack[model][run] for stack in stacks for run in ("first", "second")]
        for model in TTP_LABELS
    }


def test_pymc_time_to_posterior_is_the_results():
    pymc, home = read(DOCS, "pymc.md"), read(DOCS, "index.md")
    rows = time_to_posterior_rows()
    for model, cells in rows.items():
        line = f"| {TTP_LABELS[model]} | " + " | ".join(f"{c:.2f}" for c in cells) + " |"
        assert line in pymc, line
    second = [c for cells in rows.values() for c in (cells[1], cells[3])]
    words = f"{min(second):.2f}{DASH}{max(second):.2f}"
    assert words in pymc and words in home, words
    first = [c for cells in rows.values() for c in (cells[0], cells[2])]
    assert f"gets {min(first):.2f}{DASH}{max(first):.2f} of nutpie's" in pymc


PYMC_LABELS = {
    "eight_schools": "eight schools",
    "hierarchical_linear": "hierarchical linear",
    "bounded_simplex": "bounded + simplex",
}


def test_pymc_three_models_are_the_results():
    """The PyMC page's two tables of ``bench_pymc.py`` are ``benchmarks/results/pymc.json``."""
    pymc = read(DOCS, "pymc.md")
    med = json.loads(read(RESULTS, "pymc.json"))["median"]
    for model, label in PYMC_LABELS.items():
        for chains in (4, 64):
            ours, *peers = (
                med[f"{model}/{chains}/{m}"] for m in ("chainrunner", "pymc_numpyro", "nutpie")
            )
            first = ours["first"] / min(p["first"] for p in peers)
            repeat = ours["repeat"] / min(p["repeat"] for p in peers)
            ess = ours["ess_per_s"] / max(p["ess_per_s"] for p in peers)
            line = f"| {label} | {chains} | {first:.2f} | {repeat:.2f} | {ess:.2f} |"
            assert line in pymc, line
            nut = peers[1]
            line = (
                f"| {label} | {chains} | {1000 * ours['ess_per_grad']:.1f} / "
                f"{1000 * nut['ess_per_grad']:.1f} | {ours['us_per_grad']:.1f} / "
                f"{nut['us_per_grad']:.1f} | {ours['divergences']:.0f} / {nut['divergences']:.0f} |"
            )
            assert line in pymc, line


def test_no_project_history_on_the_pages():
    found = [
        f"{page}: {m.group(0)!r}"
        for page in [*PAGES, os.path.join("..", "README.md")]
        for m in docs_script("check_browser").HISTORY.finditer(read(DOCS, page))
    ]
    assert not found, found


def test_code_and_output_scroll_instead_of_wrapping():
    css = read(DOCS, "stylesheets", "extra.css")
    rule = re.search(r"\.md-typeset pre > code \{(.*?)\}", css, flags=re.S).group(1)
    assert "white-space: pre;" in rule and "overflow-x: auto" in rule
    assert "pre-wrap" not in css and "anywhere" not in rule


def test_site_can_be_published():
    config = read(ROOT, "mkdocs.yml")
    assert re.search(r"^site_url: ", config, flags=re.M)
    assert "changelog.md" in config and os.path.exists(os.path.join(DOCS, "changelog.md"))
    excluded = config.split("exclude_docs: |", 1)[1].split("\n\n", 1)[0]
    assert "ruff.toml" in excluded  # the formatter's settings are not a page asset
    version = read(ROOT, "chainrunner", "_version.py").split('"')[1]
    assert f"## {version}" in read(DOCS, "changelog.md")
    # The repository's link, where the host names it; a wide table says it scrolls.
    assert re.search(r"^repo_url: !ENV READTHEDOCS_GIT_CLONE_URL$", config, flags=re.M)
    assert "javascripts/scroll-hint.js" in config
    assert "scroll-hint" in read(DOCS, "javascripts", "scroll-hint.js")


def test_the_api_value_of_a_vmap_over_every_chain_is_none():
    """The pages write ``batch_size=None`` as the API does, never ``all``."""
    found = [
        f"{page}: {m.group(0)!r}"
        for page in PAGES
        for m in re.finditer(r"batch_size=all|\bb=all\b(?!`)|\| all \||/ all\b", read(DOCS, page))
    ]
    assert not found, found


def test_gpu_figures_are_the_results():
    runs = json.loads(read(RESULTS, "nuts_fsm-gpu.json"))
    page = read(DOCS, "gpu.md")
    names = {"eight_schools": "eight schools", "gaussian_50": "50-d Gaussian"}
    for r in runs["fixed"]:
        row = (
            f"| {names[r['model']]} | {r['width']:,} | {r['speedup']:.2f} "
            f"| {r['run_speedup']:.2f} | {r['barrier']:.2f} |"
        )
        assert row in page, row
    for model, words in (("eight_schools", "eight schools"), ("gaussian_50", "Gaussian")):
        run = [r["run_speedup"] for r in runs["fixed"] if r["model"] == model]
        assert f"{words} {min(run):.1f}-{max(run):.1f}x" in page.replace("\n", " ")
    adapted = {(r["model"], r["width"]): r["run_speedup"] for r in runs["adapted"]}
    school = f"{adapted['eight_schools', 1024]:.2f}x (1,024 chains) and "
    school += f"{adapted['eight_schools', 4096]:.2f}x (4,096)"
    gauss = f"{adapted['gaussian_50', 1024]:.2f}x and {adapted['gaussian_50', 4096]:.2f}x"
    flat = page.replace("\n", " ")
    assert school in flat and gauss in flat


def test_layout_table_is_the_results():
    """``batch-size.md``'s warm and cold table is ``bench_layout.py``'s, row by row."""
    spec = importlib.util.spec_from_file_location(
        "bench_layout", os.path.join(ROOT, "benchmarks", "bench_layout.py")
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = json.loads(read(RESULTS, "layout.json"))["rows"]
    page = read(DOCS, "batch-size.md")
    assert {r["jax"][:4] for r in rows} == {"0.10", "0.12"} and len(rows) == 10
    for line in bench.table(rows).splitlines():
        assert line in page, line
    cold = [r["cold_vs_best"] for r in rows]
    assert max(cold) <= 1.10 and f"on every row**\n  ({min(cold):.2f}-{max(cold):.2f})" in page
    assert max(cold) == rows[8]["cold_vs_best"]  # (the page names the nearest row)
    warm = [r["sampling_vs_best"] for r in rows if r["jax"].startswith("0.12")]
    assert f"faster, on jax 0.12** ({min(warm):.2f}-{max(warm):.2f})" in page
    whole = [r["warm_vs_best"] for r in rows if r["jax"].startswith("0.12")]
    assert f"Its whole call is {min(whole):.2f}-{max(whole):.2f} of it" in page
