"""Generates the pictures in docs/images/ (committed, so the site build never samples).

Run from the repository root with arviz < 1 (matplotlib plotting) and rich installed:

    python docs/gen_images.py            # all pictures
    python docs/gen_images.py --check    # run the plotting code, write nothing

Two kinds of pictures:

- ArviZ plots. A page's ```python blocks run first (as the test suite runs them), then
  its ```py blocks, which hold the plotting code shown on the page; the figure each
  ``py`` block draws is saved under the name listed in ``FIGURES``.
- Sharding pictures: ``jax.debug.visualize_array_sharding`` draws with rich; its
  output is recorded and exported to SVG.
"""

import argparse
import os
import re
import subprocess
import sys
import textwrap

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
    "tutorial-pymc.md": ["pymc-eight-schools-trace.png", "pymc-eight-schools-forest.png"],
}


def blocks(page, fence):
    with open(os.path.join(DOCS, page)) as f:
        return re.findall(rf"```{fence}\n(.*?)```", f.read(), flags=re.S)


def plotting_script(page, out_dir):
    """The page's python blocks, then each py block followed by a savefig."""
    names = FIGURES[page]
    plots = blocks(page, "py")
    if len(plots) != len(names):
        raise SystemExit(f"{page}: {len(plots)} ```py blocks but FIGURES lists {len(names)}")
    parts = ["import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"]
    parts += blocks(page, "python")
    for code, name in zip(plots, names, strict=True):
        parts.append(code)
        path = os.path.join(out_dir, name) if out_dir else None
        save = f"plt.gcf().savefig({path!r}, dpi=80, bbox_inches='tight')\n" if path else ""
        parts.append(save + "plt.close('all')\n")
    return "\n".join(parts)


SHARDING = """
import jax

jax.config.update("jax_num_cpu_devices", 8)

import rich.console
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import chainrunner as cr

recorded = []
_Console = rich.console.Console


def recording_console(*args, **kwargs):
    kwargs.update(record=True, force_terminal=True, color_system="truecolor")
    console = _Console(*args, **kwargs)
    recorded.append(console)
    return console


def picture(name, title, array):
    rich.console.Console = recording_console
    try:
        jax.debug.visualize_array_sharding(array)
    finally:
        rich.console.Console = _Console
    console = recorded.pop()
    if OUT:
        console.save_svg(f"{OUT}/{name}.svg", title=title)


mesh8 = cr.chain_mesh(8)
positions = jnp.zeros((16, 3))  # 16 chains, 3 parameters
picture(
    "sharding-8-devices",
    "16 chains on 8 devices: P('chain')",
    jax.device_put(positions, NamedSharding(mesh8, P("chain"))),
)
picture(
    "sharding-4-devices",
    "16 chains on 4 devices: P('chain')",
    jax.device_put(positions, NamedSharding(cr.chain_mesh(4), P("chain"))),
)
picture(
    "sharding-replicated",
    "shared parameters: P(), one copy on every device",
    jax.device_put(jnp.zeros((3, 3)), NamedSharding(mesh8, P())),
)
"""


def run(code, what):
    env = {**os.environ, "TQDM_DISABLE": "1", "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
    print(f"{what}: ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="run the code, write nothing")
    args = parser.parse_args()
    out_dir = None if args.check else IMAGES
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    run(f"OUT = {out_dir!r}\n" + textwrap.dedent(SHARDING), "sharding pictures")
    for page in FIGURES:
        run(plotting_script(page, out_dir), page)


if __name__ == "__main__":
    main()
