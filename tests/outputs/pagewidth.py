"""How wide a page lays out in headless Chromium at a given window width: the document's scrollWidth, which is
the window's width exactly when nothing needs sideways scrolling."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Written into the page's copy: the width once laid out, read back from --dump-dom.
_PROBE = (
    "<script>addEventListener('load',()=>{const d=document.documentElement;"
    "d.setAttribute('data-scroll-width',d.scrollWidth+' '+d.clientWidth)})</script>"
)


def page_width(page: Path, work: Path, window: int = 1400) -> tuple[int, int]:
    """``page``'s scrollWidth and clientWidth (the window less any vertical scrollbar) in a ``window``-px-wide
    Chromium; a copy of it is measured, under ``work``. Wider than the client: sideways scrolling."""
    assert CHROMIUM, "chromium is installed by `make test` (Debian package chromium)"
    work.mkdir(parents=True, exist_ok=True)
    copy = work / f"measured-{page.name}"
    copy.write_text(page.read_text(encoding="utf-8") + _PROBE, encoding="utf-8")
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
    found = re.search(r'data-scroll-width="(\d+) (\d+)"', dom)
    assert found, dom[:500]
    return int(found[1]), int(found[2])
