"""The HTML report is self-contained and renders: a real headless Chromium takes a screenshot."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from kevload.outputs.html import DRIFT, STABLE
from tests.conftest import run_cli, write_scenario

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def screenshot(html_path, png_path, tmp_path):
    assert CHROMIUM, "chromium is installed by `make test` (Debian package chromium)"
    subprocess.run(
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
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png_path}",
            "--window-size=1200,1400",
            f"file://{html_path}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return Image.open(png_path).convert("RGB")


def colour_share(image, colour, tolerance=12):
    pixels = np.asarray(image, dtype=np.int16).reshape(-1, 3)
    close = np.all(np.abs(pixels - np.array(_rgb(colour))) <= tolerance, axis=1)
    return float(close.mean())


@pytest.fixture
def drift_run(tmp_path, server):
    server.behaviour.drift_at = 3
    server.behaviour.latency = 0.1
    server.behaviour.faults = [None] * 3 + ["http_500"]
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2, 4], samples=8, max_error_share=0.5
    )
    run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    return tmp_path / "run"


def test_html_report_renders_with_heatmap(tmp_path, drift_run):
    out = tmp_path / "report.html"
    code, output = run_cli("report", drift_run, "--format", "html", "-o", out)
    assert code == 1, output
    page = out.read_text()
    assert "http://" not in page.replace(
        json.loads((drift_run / "run.json").read_text())["target"]["base_url"], ""
    )
    assert "<script" not in page and "<link" not in page  # nothing to fetch: self-contained
    assert "id=heatmap" in page and "first divergence at char" in page and "1 errors in" in page
    image = screenshot(out, tmp_path / "shot.png", tmp_path)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "blank or near-blank screenshot"
    assert colour_share(image, STABLE) > 0.001, "no stable (green) heatmap cell visible"
    assert colour_share(image, DRIFT) > 0.001, "no drift (red) heatmap cell visible"


def test_sweep_html(tmp_path, server):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=3)
    run_cli("sweep", scenario, "--grid", "load.mode=single,mixed", "--out", tmp_path / "sw")
    out = tmp_path / "sweep.html"
    code, output = run_cli("report", tmp_path / "sw", "--format", "html", "-o", out)
    assert code == 0, output
    page = out.read_text()
    assert "load.mode=mixed" in page and "id=heatmap" in page
    image = screenshot(out, tmp_path / "sweep.png", tmp_path)
    assert colour_share(image, STABLE) > 0.001


def test_the_timeline_is_titled_for_the_finished_requests_it_draws(tmp_path, server):
    # Answers and one 500: the chart stacks both kinds each second, so a title naming only errors
    # misreads it.
    server.behaviour.faults = [None] * 3 + ["http_500"]
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=8, max_error_share=0.5
    )
    run_cli("run", scenario, "--out", tmp_path / "run", "--quiet")
    run_cli(
        "report", tmp_path / "run", "--format", "html", "-o", tmp_path / "r.html"
    )  # 3: the cell is short
    page = (tmp_path / "r.html").read_text()
    heading, chart = re.search(
        r"<h2>([^<]*)</h2>(<svg[^>]*aria-label=\"requests [^>]*>.*?</svg>)", page, re.S
    ).groups()
    assert heading == "Requests finished per second, ok and errors"
    ok_heights = re.findall(r'height="([0-9.]+)" fill="#81c784"', chart)
    assert any(float(h) > 0 for h in ok_heights) and "1 errors in" in chart
