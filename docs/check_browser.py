"""Reads the built site in a real browser, as a reader on a desktop and on a phone would.

Every page of ``site/`` is opened in headless Chromium (Debian's ``/usr/bin/chromium``,
driven by Playwright) at 1280 and 390 px, and must show:

- no element wider than the screen, except blocks that scroll sideways (code, output,
  tables inside the theme's scroll wrapper);
- no block of code or output whose lines wrap (each would restart at column 0 and lose
  its indentation);
- no table wider than its column without the line that says so (``scroll-hint.js``);
- no word of the project's own history (``HISTORY``; tests/test_docs_figures.py reads
  the pages' sources for the same words).

Every collapsed block is opened first, as a reader would. Run by ``nox -s docs`` after
the build; by hand::

    python docs/check_browser.py site [--shots DIR]
"""

import argparse
import functools
import http.server
import os
import re
import sys
import threading

WIDTHS = (1280, 390)
# Words of the project's own history, which mean nothing to a reader.
HISTORY = re.compile(
    r"\bissues? #?\d+|\bsessions? (had|of|found|measured)\b|\bstop \d+\b"
    r"|\b(this|last|previous|next|one) (stop|turn)\b|\bthe old default\b"
    r"|\blast version\b|\bPR #?\d+",
    flags=re.I,
)
SHOTS = ("index", "quickstart", "pymc", "benchmarks")

OPEN_ALL = "() => document.querySelectorAll('details').forEach((d) => { d.open = true; })"

# In the page: what overflows the screen, which code blocks wrap, which wide tables
# have no hint.
MEASURE = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX;
      if ((o === "auto" || o === "scroll") && e.clientWidth <= width) return true;
    }
    return false;
  };
  const wide = [];
  for (const el of document.querySelectorAll(".md-content *")) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 1 && !scrolls(el)) {
      wide.push(el.tagName.toLowerCase() + "." + el.className + " right=" + Math.round(r.right));
    }
  }
  const wrapped = [];
  for (const code of document.querySelectorAll(".md-content pre > code")) {
    const ws = getComputedStyle(code).whiteSpace;
    if (ws !== "pre") wrapped.push("white-space: " + ws + ": " + code.innerText.slice(0, 40));
  }
  const unhinted = [];
  for (const wrap of document.querySelectorAll(
      ".md-content .md-typeset__scrollwrap, .md-content p:has(> img[src$='chart-benchmarks.svg'])")) {
    const hint = wrap.previousElementSibling;
    if (wrap.scrollWidth > wrap.clientWidth + 1
        && !(hint && hint.classList.contains("scroll-hint"))) {
      unhinted.push(wrap.innerText.slice(0, 40));
    }
  }
  return {wide: wide.slice(0, 5), wrapped: wrapped.slice(0, 5), unhinted: unhinted.slice(0, 5),
          text: document.querySelector(".md-content").innerText};
}"""


def serve(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def pages(site):
    for folder, _, files in os.walk(site):
        if (
            "index.html" in files
            and "assets" not in folder
            and "search" not in folder
        ):
            rel = os.path.relpath(folder, site)
            yield "" if rel == "." else rel + "/"


def check(site, shots=None):
    from playwright.sync_api import sync_playwright

    history, server = HISTORY, serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        for width in WIDTHS:
            page = browser.new_page(viewport={"width": width, "height": 900})
            for rel in sorted(pages(site)):
                page.goto(base + rel, wait_until="load")
                name = rel or "index"
                if shots and name.strip("/") in SHOTS:
                    os.makedirs(shots, exist_ok=True)
                    path = os.path.join(shots, f"{name.strip('/')}-{width}.png")
                    page.screenshot(path=path, full_page=False)
                page.evaluate(OPEN_ALL)
                page.wait_for_timeout(100)  # (the toggle events' hints)
                found = page.evaluate(MEASURE)
                problems += [
                    f"{name} @{width}: too wide: {w}" for w in found["wide"]
                ]
                problems += [
                    f"{name} @{width}: wraps: {w}" for w in found["wrapped"]
                ]
                problems += [
                    f"{name} @{width}: a wide table says nothing: {w}"
                    for w in found["unhinted"]
                ]
                problems += [
                    f"{name} @{width}: history: {m.group(0)!r}"
                    for m in history.finditer(found["text"])
                ]
            page.close()
        browser.close()
    server.shutdown()
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default="site")
    parser.add_argument(
        "--shots", help="a folder for screenshots of four pages"
    )
    opts = parser.parse_args()
    problems = check(opts.site, opts.shots)
    for line in problems:
        print(line)
    print(f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
