"""Generates the pictures in docs/images/ (committed, so the site build never samples).

Run from the repository root with arviz < 1 (matplotlib plotting) installed:

    python docs/gen_images.py                      # all pictures
    python docs/gen_images.py --check              # run the code, write nothing
    python docs/gen_images.py quickstart.md        # only the pictures of these pages
    python docs/gen_images.py layouts              # only the layout drawings

Two kinds of pictures:

- Layout drawings (``layout-*.svg``): how ``cr.run`` puts chains on devices, drawn from
  the function ``run`` itself calls (``chainrunner.layout._mesh.make_layout``, and
  ``chain_ids`` for what each padded slot holds), as plain SVG text: the same bytes on
  every run, so ``tests/test_docs_images.py`` regenerates each one and compares.
- ArviZ plots. A page's ```python blocks run first (as the test suite runs them), then
  its ```py blocks, which hold the plotting code shown on the page; the figure each
  ``py`` block draws is saved under the name listed in ``FIGURES``, with a hash of the
  page's code in the PNG's metadata (the test checks that it is the page's current code).
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys
from html import escape

DOCS = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(DOCS, "images")

# page -> file names of the figures its ```py blocks draw, in order.
FIGURES = {
    "quickstart.md": ["quickstart-trace.png"],
    "how-many-draws.md": ["how-many-draws-rhat.png"],
    "tutorial-eight-schools.md": [
        "eight-schools-trace.png",
        "eight-schools-rank.png",
        "eight-schools-centered-pair.png",
    ],
    "tutorial-pymc.md": [
        "pymc-eight-schools-trace.png",
        "pymc-eight-schools-forest.png",
    ],
}

# The layouts the pages draw: (num_chains, num_devices, batch_size as passed to cr.run).
# Each page that shows one says the same numbers in the picture's alt text and prints
# (or quotes) its layout line; tests/test_docs_images.py checks both.
LAYOUTS = [
    (16, 8, None),  # mesh.md
    (16, 4, None),  # mesh.md
    (40, 8, 2),  # index.md, batches.md
    (13, 8, None),  # batches.md
    (40, 8, None),  # more-chains-than-devices.md
    (40, 8, 1),  # more-chains-than-devices.md
]


def layout_name(num_chains, num_devices, batch_size):
    b = "none" if batch_size is None else batch_size
    return f"layout-{num_chains}-chains-{num_devices}-devices-batch-{b}.svg"


def blocks(page, fence):
    with open(os.path.join(DOCS, page)) as f:
        return re.findall(rf"```{fence}\n(.*?)```", f.read(), flags=re.S)


def code_hash(page):
    """A hash of a page's code (its ```python blocks, then its ```py blocks)."""
    code = "\n".join([*blocks(page, "python"), "# plots", *blocks(page, "py")])
    return hashlib.sha256(code.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- layout drawings

FONT = "-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
MONO = "SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace"
CELL, GAP, INSET, BATCH_GAP = (
    28,
    4,
    4,
    10,
)  # a chain's cell; inside a batch; between batches
ROW, ROW_GAP, LABEL, MARGIN = CELL + 2 * INSET + 10, 6, 76, 16


def _text_width(text, size, mono=False):
    """A generous estimate of a text's width in pixels (no font metrics here)."""
    return int(len(text) * size * (0.62 if mono else 0.6)) + 1


def _text(
    x,
    y,
    text,
    size,
    *,
    fill="#1f2937",
    anchor="start",
    weight=None,
    mono=False,
    halo=None,
):
    attrs = f'x="{x}" y="{y}" font-size="{size}" fill="{fill}"'
    if (
        halo
    ):  # an outline under the letters, so that they read on a hatched cell
        attrs += f' stroke="{halo}" stroke-width="3" paint-order="stroke"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if weight:
        attrs += f' font-weight="{weight}"'
    if mono:
        attrs += f' font-family="{MONO}"'
    return f"<text {attrs}>{escape(text)}</text>"


def layout_svg(num_chains, num_devices, batch_size):
    """An SVG drawing of ``cr.run``'s layout of ``num_chains`` chains on ``num_devices``.

    One row per device; in it the device's chains as numbered cells, grouped into the
    batches that ``batch_size`` makes (each batch one ``vmap``; ``batch_size=1``: one
    chain at a time, no ``vmap``); padded slots hatched, numbered with the chain they
    repeat (``chain_ids``). Deterministic: the same arguments give the same bytes.
    """
    from chainrunner.layout._mesh import chain_ids, make_layout
    from jax.sharding import AbstractMesh  # a mesh's shape, no devices needed

    layout = make_layout(
        num_chains, AbstractMesh((num_devices,), ("chain",)), batch_size
    )
    ids = chain_ids(layout.num_chains, layout.padded)
    width = layout.batch_size or layout.per_device  # chains per batch
    batches = layout.per_device // width
    padded = layout.padded - layout.num_chains
    hatch = f"hatch-{num_chains}-{num_devices}-{batch_size}"

    title = (
        f"{num_chains} chains on {num_devices} devices, batch_size={batch_size}"
    )
    described = layout.describe()
    if layout.batch_size == 1:
        batch_note = "a box: one chain at a time (lax.map, no vmap)"
    elif layout.batch_size is None:
        batch_note = (
            f"a box: one vmap over the device's {layout.per_device} chain(s)"
        )
    else:
        batch_note = f"a box: one batch, a vmap of {width} chains (lax.map over {batches})"
    legend = [
        ("chain", "a chain, numbered as in trace.draws"),
        ("batch", batch_note),
    ]
    if padded:
        legend.append(
            (
                "pad",
                f"padding: a copy of chain {num_chains - 1}, computed, then dropped",
            )
        )

    batch_w = width * CELL + (width - 1) * GAP + 2 * INSET
    device_w = LABEL + batches * batch_w + (batches - 1) * BATCH_GAP + INSET + 2
    note_w = _text_width("+00 padding", 12) + 8 if padded else 0
    text_w = max(
        _text_width(title, 15) + 10,
        _text_width(described, 12, mono=True),
        *(30 + _text_width(note, 12) for _, note in legend),
    )
    w = 2 * MARGIN + max(device_w + note_w, text_w)
    top = MARGIN + 46  # below the title and the layout line
    rows_h = num_devices * ROW + (num_devices - 1) * ROW_GAP
    legend_top = top + rows_h + 18
    h = legend_top + len(legend) * 24 + MARGIN - 6

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="{FONT}" role="img" '
        f'aria-label="{escape(described)}">',
        f"<title>{escape(title)}</title>",
        f"<desc>{escape(described)}</desc>",
        "<defs>",
        f'<pattern id="{hatch}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">',
        '<rect width="6" height="6" fill="#eceff3"/>',
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#aab2bd" stroke-width="2.5"/>',
        "</pattern>",
        "</defs>",
        f'<rect x="0.5" y="0.5" width="{w - 1}" height="{h - 1}" rx="8" fill="#ffffff" '
        'stroke="#d5dae1"/>',
        _text(MARGIN, MARGIN + 15, title, 15, weight="600"),
        _text(MARGIN, MARGIN + 36, described, 12, fill="#4b5563", mono=True),
    ]

    def cell(x, y, chain, is_pad):
        if is_pad:
            rect = (
                f'fill="url(#{hatch})" stroke="#9aa3ae" stroke-dasharray="3 2"'
            )
            color, halo = "#4b5563", "#eceff3"
        else:
            rect = 'fill="#dbeafe" stroke="#3b82f6"'
            color, halo = "#1e3a8a", None
        return [
            f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" rx="4" {rect}/>',
            _text(
                x + CELL // 2,
                y + CELL // 2 + 4,
                str(chain),
                12,
                fill=color,
                anchor="middle",
                halo=halo,
            ),
        ]

    def batch_box(x, y, n):
        bw = n * CELL + (n - 1) * GAP + 2 * INSET
        return (
            f'<rect x="{x}" y="{y}" width="{bw}" height="{CELL + 2 * INSET}" rx="6" '
            + ('fill="#ffffff" stroke="#64748b" stroke-width="1.5"/>')
        )

    for device in range(num_devices):
        y = top + device * (ROW + ROW_GAP)
        out.append(
            f'<rect x="{MARGIN}" y="{y}" width="{device_w}" height="{ROW}" rx="6" '
            'fill="#f1f5f9" stroke="#cbd5e1"/>'
        )
        out.append(
            _text(
                MARGIN + 10,
                y + ROW // 2 + 5,
                f"device {device}",
                13,
                fill="#334155",
            )
        )
        row_pad = 0
        for b in range(batches):
            bx = MARGIN + LABEL + b * (batch_w + BATCH_GAP)
            by = y + (ROW - CELL - 2 * INSET) // 2
            out.append(batch_box(bx, by, width))
            for k in range(width):
                slot = device * layout.per_device + b * width + k
                is_pad = slot >= num_chains
                row_pad += is_pad
                out += cell(
                    bx + INSET + k * (CELL + GAP),
                    by + INSET,
                    int(ids[slot]),
                    is_pad,
                )
        if row_pad:
            out.append(
                _text(
                    MARGIN + device_w + 8,
                    y + ROW // 2 + 4,
                    f"+{row_pad} padding",
                    12,
                    fill="#6b7280",
                )
            )

    for i, (kind, note) in enumerate(legend):
        y = legend_top + i * 24
        x = MARGIN
        if kind == "chain":
            out.append(
                f'<rect x="{x}" y="{y}" width="18" height="18" rx="3" fill="#dbeafe" '
                'stroke="#3b82f6"/>'
            )
        elif kind == "batch":
            out.append(
                f'<rect x="{x}" y="{y}" width="18" height="18" rx="4" fill="#ffffff" '
                'stroke="#64748b" stroke-width="1.5"/>'
            )
        else:
            out.append(
                f'<rect x="{x}" y="{y}" width="18" height="18" rx="3" fill="url(#{hatch})" '
                'stroke="#9aa3ae" stroke-dasharray="3 2"/>'
            )
        out.append(_text(x + 28, y + 14, note, 12, fill="#374151"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_layouts(out_dir):
    for n, d, b in LAYOUTS:
        svg = layout_svg(n, d, b)
        if out_dir:
            with open(
                os.path.join(out_dir, layout_name(n, d, b)), "w", newline="\n"
            ) as f:
                f.write(svg)
    print(f"layout drawings: ok ({len(LAYOUTS)})")


# ---------------------------------------------------------------- ArviZ plots


def plotting_script(page, out_dir):
    """The page's python blocks, then each py block followed by a savefig.

    ``tight_layout`` keeps titles off the tick labels; the PNG's ``Description`` holds
    ``code_hash(page)``, so a test can tell a picture made from older code.
    """
    names = FIGURES[page]
    plots = blocks(page, "py")
    if len(plots) != len(names):
        raise SystemExit(
            f"{page}: {len(plots)} ```py blocks but FIGURES lists {len(names)}"
        )
    parts = [
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    ]
    parts += blocks(page, "python")
    meta = {"Description": f"docs/{page} code {code_hash(page)}"}
    for code, name in zip(plots, names, strict=True):
        parts.append(code)
        path = os.path.join(out_dir, name) if out_dir else None
        save = "fig = plt.gcf()\nif not fig.get_layout_engine():\n    fig.tight_layout()\n"
        if path:
            save += f"fig.savefig({path!r}, dpi=80, bbox_inches='tight', metadata={meta!r})\n"
        parts.append(save + "plt.close('all')\n")
    return "\n".join(parts)


def run(code, what):
    env = {**os.environ, "TQDM_DISABLE": "1", "MPLBACKEND": "Agg"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
    print(f"{what}: ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="run the code, write nothing"
    )
    parser.add_argument(
        "only",
        nargs="*",
        help="pages of FIGURES or 'layouts' (default: everything)",
    )
    args = parser.parse_args()
    unknown = set(args.only) - {*FIGURES, "layouts"}
    if unknown:
        parser.error(
            f"unknown: {sorted(unknown)}; choose from {[*FIGURES, 'layouts']}"
        )
    wanted = set(args.only) or {*FIGURES, "layouts"}
    out_dir = None if args.check else IMAGES
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    sys.path.insert(0, os.path.dirname(DOCS))  # chainrunner from this checkout
    if "layouts" in wanted:
        write_layouts(out_dir)
    for page in FIGURES:
        if page in wanted:
            run(plotting_script(page, out_dir), page)


if __name__ == "__main__":
    main()
