"""Draws the benchmarks page's chart and headline table from benchmarks/results/*.json.

Run from the repository root after `nox -s bench` (any Python 3, no dependencies):

    python docs/gen_charts.py            # writes docs/images/chart-benchmarks.svg and
                                         # the headline section of docs/benchmarks.md
    python docs/gen_charts.py --check    # exits 1 if either is out of date

The output depends on the JSON files only (no dates, no random ids), so running it
again without new results changes nothing.

- ``suite.json``: per layout (model, chains, devices), chainrunner's default against
  the best of numpyro's ``chain_method``s (warm call, min bulk ESS/s, first call) and
  its ``vs_floor`` and ``peak_rss_mb``.
- ``overhead.json``: the paired runner/floor ratios (median and 90 % interval).
"""

import argparse
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
SVG = os.path.join(ROOT, "docs", "images", "chart-benchmarks.svg")
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
MODELS = {"eight_schools": "eight schools", "gaussian_50d": "50-d Gaussian"}
MODELS["logistic_5000x20"] = "logistic 5000x20"


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def suite_rows():
    """One dict per suite layout: chainrunner's default against numpyro's best."""
    layouts = {}
    for r in load("suite.json")["results"]:
        if "sampling_s" in r:  # skipped methods carry only a reason
            layouts.setdefault((r["model"], r["devices"], r["chains"]), {})[
                r["method"]
            ] = r
    rows = []
    for (model, devices, chains), methods in sorted(layouts.items()):
        cr = methods["chainrunner"]
        numpyro = [v for k, v in methods.items() if k.startswith("numpyro")]
        rows.append(
            {
                "model": model,
                "chains": chains,
                "devices": devices,
                "warm": min(v["sampling_s"] for v in numpyro)
                / cr["sampling_s"],
                "ess": cr["min_bulk_ess_per_s"]
                / max(v["min_bulk_ess_per_s"] for v in numpyro),
                "first": cr["end_to_end_s"]
                / min(v["end_to_end_s"] for v in numpyro),
                "vs_floor": cr["vs_floor"],
                "rss": cr["peak_rss_mb"],
            }
        )
    return rows


def overhead_rows():
    return load("overhead.json")["results"]


def label(r):
    return f"{MODELS[r['model']]}, {r['chains']} on {r['devices']}"


def defaults_vs_floor(rows):
    """The default call's warm time over the floor's, as the headline words it."""
    ratios = [r["vs_floor"] for r in rows]
    return (
        f"median {statistics.median(ratios):.2f}x over {len(ratios)} layouts, "
        f"range {min(ratios):.2f}–{max(ratios):.2f}"
    )


def headline(rows, over):
    """The markdown between the headline markers of docs/benchmarks.md."""
    many = [r for r in rows if r["chains"] > r["devices"]]
    one = [r for r in rows if r["chains"] == r["devices"]]
    ratios = [r["ratio"] for r in over]
    lines = [
        START,
        "<!-- written by docs/gen_charts.py from benchmarks/results/suite.json and "
        "overhead.json; do not edit by hand -->",
        "",
        f"- **Warm call against numpyro's `MCMC`** (its best `chain_method` per row, "
        f"same NUTS, model, chains and devices): "
        f"{min(r['warm'] for r in rows):.1f}–{max(r['warm'] for r in rows):.0f}x "
        f"faster; min bulk ESS per second "
        f"{min(r['ess'] for r in rows):.1f}–{max(r['ess'] for r in rows):.0f}x higher "
        f"(numpyro's `MCMC.run` compiles again on every call).",
        f"- **First call, compile included**: "
        f"{min(r['first'] for r in many):.2f}–{max(r['first'] for r in many):.2f} of "
        f"numpyro's best on the {len(many)} rows with more chains than devices "
        f"(at most half on {sum(r['first'] <= 0.5 for r in many)}); "
        + ", ".join(f"{r['first']:.2f}" for r in one)
        + " on the rows with one chain per device ("
        + ", ".join(MODELS[r["model"]] for r in one)
        + ").",
        f"- **Against the hand-written loop** (`jit(shard_map(vmap(scan)))` or its "
        f"`lax.map` form, the same layout), at the defaults, diagnostics on: "
        f"{defaults_vs_floor(rows)}. The runner alone (`warn=False`, a fixed "
        f"`batch_size`, paired repetitions): median {statistics.median(ratios):.3f}x "
        f"over {len(ratios)} layouts, range {min(ratios):.3f}–{max(ratios):.3f}.",
        "",
        "![Three panels, one row per model and layout: numpyro's best warm call over "
        "chainrunner's, chainrunner's first call over numpyro's best, and chainrunner's "
        "warm call over the hand-written floor](images/chart-benchmarks.svg)",
        "",
        "*Chart and table: `docs/gen_charts.py`, from `benchmarks/results/suite.json` "
        "(first two panels, every column of the table) and "
        "`benchmarks/results/overhead.json` (third panel).*",
        "",
        "| model, chains on devices | warm × | ESS/s × | first call | vs floor | RSS MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {label(r)} | {r['warm']:.1f} | {r['ess']:.1f} | {r['first']:.2f} "
            f"| {r['vs_floor']:.2f} | {r['rss']:.0f} |"
        )
    lines += [
        "",
        "**warm ×**: numpyro's fastest warm call over chainrunner's; **ESS/s ×**: "
        "chainrunner's min bulk ESS per second over numpyro's highest; **first call**: "
        "chainrunner's first call (compile included) over numpyro's fastest; "
        "**vs floor**: chainrunner's warm call over the hand-written program of the same "
        "layout (two repetitions each: the paired figures are in "
        "[runner overhead](#runner-overhead-row-by-row)); **RSS MB**: peak growth of the "
        "process' resident memory during chainrunner's calls.",
        END,
    ]
    return "\n".join(lines)


BLUE, ORANGE = "#1f77b4", "#ff7f0e"
# The third panel's two dots per row: the runner's two layouts against their floors.
COLOURS = {"chainrunner[vmap]": BLUE, "chainrunner[batch=1]": ORANGE}
LEGEND = {"chainrunner[vmap]": "None", "chainrunner[batch=1]": "1"}


def legend(x0, y):
    """The third panel's key: which colour is which ``batch_size``."""
    out = [f'<text x="{x0 + 20}" y="{y}" font-size="10">batch_size</text>']
    for i, (method, words) in enumerate(LEGEND.items()):
        x = x0 + 76 + 46 * i
        out.append(
            f'<circle cx="{x + 4}" cy="{y - 4}" r="3.5" fill="{COLOURS[method]}"/>'
        )
        out.append(
            f'<text x="{x + 11}" y="{y}" font-size="10">{esc(words)}</text>'
        )
    return out


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chart(rows, over):
    """Three dot panels, one row per suite layout; plain SVG, fixed layout."""
    row_h, top, left, panel_w, gap = 19, 62, 178, 160, 22
    height = top + row_h * len(rows) + 34
    width = left + 3 * panel_w + 2 * gap + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    paired = {}
    for r in over:
        key = (r["model"], r["devices"], r["chains"])
        paired.setdefault(key, []).append(
            (r["ratio"], r["ratio_lo"], r["ratio_hi"], COLOURS[r["method"]])
        )
    panels = [
        (
            "warm call: numpyro's best / chainrunner",
            "log",
            1,
            32,
            [1, 2, 4, 8, 16, 32],
            lambda r: [(r["warm"], None, None, BLUE)],
            1,
        ),
        (
            "first call: chainrunner / numpyro's best",
            "lin",
            0,
            1.2,
            [0, 0.5, 1],
            lambda r: [(r["first"], None, None, BLUE)],
            1,
        ),
        (
            "warm call, paired: chainrunner / floor",
            "lin",
            0.8,
            1.2,
            [0.8, 1, 1.2],
            lambda r: paired[(r["model"], r["devices"], r["chains"])],
            1,
        ),
    ]
    for i, r in enumerate(rows):
        y = top + row_h * i + row_h / 2
        if i % 2 == 0:
            out.append(
                f'<rect x="0" y="{y - row_h / 2:.1f}" width="{width}" height="{row_h}" '
                f'fill="#f3f4f6"/>'
            )
        out.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(label(r))}</text>'
        )
    for p, (title, scale, lo, hi, ticks, values, ref) in enumerate(panels):
        x0 = left + p * (panel_w + gap)

        def xpos(v, x0=x0, scale=scale, lo=lo, hi=hi):
            v = min(max(v, lo), hi)
            if scale == "log":
                return x0 + panel_w * math.log(v / lo) / math.log(hi / lo)
            return x0 + panel_w * (v - lo) / (hi - lo)

        out.append(
            f'<text x="{x0 + panel_w / 2}" y="{top - 36}" text-anchor="middle" '
            f'font-weight="bold">{esc(title.split(": ")[0])}</text>'
        )
        out.append(
            f'<text x="{x0 + panel_w / 2}" y="{top - 22}" text-anchor="middle">'
            f"{esc(title.split(': ')[1])}</text>"
        )
        bottom = top + row_h * len(rows)
        for t in ticks:
            x = xpos(t)
            colour = "#555" if t == ref else "#ccc"
            out.append(
                f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{bottom}" '
                f'stroke="{colour}" stroke-width="1"/>'
            )
            out.append(
                f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{t:g}</text>'
            )
        for i, r in enumerate(rows):
            y = top + row_h * i + row_h / 2
            for v, vlo, vhi, colour in values(r):
                if vlo is not None:
                    out.append(
                        f'<line x1="{xpos(vlo):.1f}" y1="{y:.1f}" x2="{xpos(vhi):.1f}" '
                        f'y2="{y:.1f}" stroke="{colour}" stroke-width="1.5"/>'
                    )
                out.append(
                    f'<circle cx="{xpos(v):.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>'
                )
    out += legend(left + 2 * (panel_w + gap), top - 10)
    note = (
        "benchmarks/results/suite.json (panels 1-2) and overhead.json (panel 3: "
        "batch_size=None and 1, 90 % intervals); better: right, left, near 1"
    )
    out.append(
        f'<text x="8" y="{height - 8}" font-size="10" fill="#444">{esc(note)}</text>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if stale"
    )
    opts = parser.parse_args()
    rows, over = suite_rows(), overhead_rows()
    with open(PAGE) as f:
        page = f.read()
    if START not in page or END not in page:
        raise SystemExit(f"{PAGE} has no {START} ... {END} section")
    head, rest = page.split(START, 1)
    new_page = head + headline(rows, over) + rest.split(END, 1)[1]
    svg = chart(rows, over)
    old_svg = open(SVG).read() if os.path.exists(SVG) else ""
    stale = [
        p
        for p, old, new in [(PAGE, page, new_page), (SVG, old_svg, svg)]
        if old != new
    ]
    if opts.check:
        for p in stale:
            print(f"out of date: {os.path.relpath(p, ROOT)}")
        sys.exit(1 if stale else 0)
    for path, text in [(PAGE, new_page), (SVG, svg)]:
        if path in stale:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
