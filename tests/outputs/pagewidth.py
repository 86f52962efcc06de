"""How wide a page lays out in headless Chromium at a given window width: the document's scrollWidth
and clientWidth (the window less a vertical scrollbar), and every box on it that scrolls sideways (a
table wrapper or code block whose content is wider than the box). A page fits when the first is at
most the second and no box scrolls."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Written into the page's copy: what the laid-out page measures, read back from --dump-dom.
_PROBE = """<script>addEventListener('load', () => {
  const d = document.documentElement, boxes = [];
  for (const e of document.querySelectorAll('body *')) {
    const x = getComputedStyle(e).overflowX;
    if ((x == 'auto' || x == 'scroll') && e.scrollWidth > e.clientWidth + 1)
      boxes.push(`${e.tagName}.${e.className} ${e.scrollWidth}>${e.clientWidth}: `
                 + (e.textContent || '').slice(0, 60));
  }
  d.setAttribute('data-measured', JSON.stringify([d.scrollWidth, d.clientWidth, boxes]));
});</script>"""


@dataclass(frozen=True)
class Width:
    scroll: int
    client: int
    scrolling_boxes: list[str]

    @property
    def fits(self) -> bool:
        return self.scroll <= self.client and not self.scrolling_boxes


def page_width(page: Path, work: Path, window: int = 1400) -> Width:
    """``page`` measured in a ``window``-px-wide Chromium; a copy of it is measured, beside it (so
    its relative links, a docs site's stylesheets, still resolve)."""
    assert CHROMIUM, "chromium is installed by `make test` (Debian package chromium)"
    work.mkdir(parents=True, exist_ok=True)
    copy = page.with_name(f"measured-{page.name}")
    text = page.read_text(encoding="utf-8")
    copy.write_text(
        text.replace("</body>", _PROBE + "</body>") if "</body>" in text else text + _PROBE,
        encoding="utf-8",
    )
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={work / 'profile'}",
            f"--window-size={window},900",
            "--virtual-time-budget=3000",
            "--dump-dom",
            f"file://{copy}",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    found = re.search(r'data-measured="([^"]*)"', dom)
    assert found, dom[:500]
    scroll, client, boxes = json.loads(html.unescape(found[1]))
    return Width(scroll, client, boxes)
