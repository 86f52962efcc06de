"""Every HTML page kevload writes fits a 1400 px window without sideways scrolling, measured in
headless Chromium (the run's report, a graded run's with long answers in its graded section, a
sweep's, and the docs site's widest pages), and the matrix's legend explains every mark the matrix
shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer
from tests.outputs.pagewidth import page_width

WINDOW = 1400
LONG = "and here is the reasoning, at some length, as a small model gives it " * 6
GRADED = [
    {"id": f"sum-en-{i}", "prompt": f"What is {i} + 2?", "expected": i + 2, "max_tokens": 48}
    for i in range(4)
] + [
    {"id": "capital-of-france-asked-politely", "prompt": "Capital of France?", "expected": "Paris"}
]


def _answer(prompt: str, overlap: int) -> str:
    # Serially right on the sums and wrong on the capital; under load one too many and right: flips
    # both ways, each with a long answer beside the serial one.
    found = re.match(r"What is (\d+) \+ 2\?", prompt)
    if found:
        return f"{int(found[1]) + 2 + (overlap >= 2)} {LONG}"
    return "Paris" if overlap >= 2 else f"Lyon {LONG}"


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pages")
    with FakeServer(Behaviour(drift_at=3)) as server:
        scenario = write_scenario(tmp / "s.toml", server.url, concurrency=[1, 2, 4], samples=4)
        run_cli("run", scenario, "--out", tmp / "run", "--quiet")
        run_cli("sweep", scenario, "--grid", "load.mode=single,mixed", "--out", tmp / "sweep")
    with FakeServer(Behaviour(answer_for=_answer)) as server:
        scenario = write_scenario(
            tmp / "g.toml", server.url, probes=GRADED, concurrency=[1, 4], samples=2
        )
        run_cli("run", scenario, "--out", tmp / "graded", "--quiet")
    for name in ("run", "sweep", "graded"):
        code, output = run_cli("report", tmp / name, "--format", "html", "-o", tmp / f"{name}.html")
        assert code in (0, 1), output
    return tmp


@pytest.mark.parametrize("name", ["run", "graded", "sweep"])
def test_the_page_fits_a_1400_px_window(pages, name):
    width = page_width(pages / f"{name}.html", pages / f"w-{name}", WINDOW)
    assert width.client <= WINDOW and width.fits, width


def test_the_graded_section_shows_both_answers_and_no_empty_boxes(pages):
    page = (pages / "graded.html").read_text()
    section = page[page.index("<table id=graded>") :]
    section = section[: section.index("</table>")]
    assert "<pre></pre>" not in section  # rows without a flip: empty cells, not grey boxes
    assert "Lyon and here is the reasoning" in section  # a serial answer, shown beside the flip


def test_the_legend_explains_every_mark_the_matrix_shows(pages):
    from kevload.outputs.html import MATRIX_MARKS

    page = (pages / "graded.html").read_text()
    matrix = page[page.index("<table id=heatmap>") : page.index("class=legend>")]
    legend = page[page.index("class=legend>") :].split("</p>", 1)[0]
    assert "✗" in matrix and "↑" in matrix
    for pattern, words in MATRIX_MARKS:
        assert (re.search(pattern, matrix) is None) == (words not in legend), pattern


ROOT = Path(__file__).resolve().parents[2]
# The widest pages when the site was last measured (tables of many columns, long command lines).
DOCS_PAGES = (
    "index.html",
    "reference/scenario/index.html",
    "sweeps/index.html",
    "workloads/index.html",
    "goodput/index.html",
    "real-servers/index.html",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra (make install) builds the site")
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.mark.parametrize("page", DOCS_PAGES)
def test_a_docs_page_fits_a_1400_px_window(site, page, tmp_path):
    width = page_width(site / page, tmp_path, WINDOW)
    assert width.client <= WINDOW and width.fits, width
