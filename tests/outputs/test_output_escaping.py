"""Every output a run writes reads back with its format's own parser, whatever the probe id and the
server's outputs hold: control characters (legal in JSON and TOML), markup, quotes, CDATA ends, line
breaks and pipes."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from xml.etree import ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from kevload.outputs.escaping import markdown_cell, visible, xml_text
from kevload.outputs.metrics import escape_label
from tests.conftest import run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer
from tests.outputs.test_nightly import SCHEMA

# Every character class a format cares about, in a probe id and in each output.
HOSTILE = "p\x00\x01\x1b[31m<b>&amp;\"'</script>]]>\n|x[/x]\x7f\x85\ufffe\\|"


class _HostileServer(FakeServer):
    """Its outputs carry every such character too (and drift at c=4, so they reach the divergence
    examples)."""

    def _answer(self, body, prompt, state):
        return HOSTILE + " " + super()._answer(body, prompt, state)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    with _HostileServer(Behaviour(drift_at=3)) as server:
        path = write_scenario(
            tmp / "s.toml",
            server.url,
            concurrency=[1, 4],
            samples=6,
            probes=[{"id": HOSTILE, "prompt": "Say something.", "max_tokens": 16}],
        )
        code, output = run_cli(
            "run",
            path,
            "--out",
            tmp / "run",
            "--quiet",
            "--junit",
            tmp / "junit.xml",
            "--metrics",
            tmp / "kevload.prom",
        )
    assert code == 1, output  # the probe drifts at c=4: the outputs have a failure to say
    return tmp


def test_junit_is_well_formed_and_valid_with_control_characters_spelled(hostile_run):
    text = (hostile_run / "junit.xml").read_text(encoding="utf-8")
    root = ET.fromstring(
        text
    )  # raised "not well-formed (invalid token)" on the raw \x00, \x01, \x1b
    SCHEMA.validate(text)
    cases = root.findall(".//testcase")
    assert {case.get("classname") for case in cases} == {f"kevload.{xml_text(HOSTILE)}.single"}
    assert all(
        "\\u0001" in case.get("classname") and "\\u001b" in case.get("classname") for case in cases
    )
    (failure,) = root.findall(".//failure")
    assert failure.get("type") == "nondeterminism"


def test_prometheus_and_openmetrics_parsers_read_the_probe_back_exactly(hostile_run):
    text = (hostile_run / "kevload.prom").read_text(encoding="utf-8")
    for parse in (text_families, openmetrics_families):
        probes = {
            sample.labels["probe"]
            for family in parse(text)
            for sample in family.samples
            if "probe" in sample.labels
        }
        assert probes == {HOSTILE}, parse


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_html_report_holds_no_injected_tag(hostile_run):
    out = hostile_run / "r.html"
    assert run_cli("report", hostile_run / "run", "--format", "html", "-o", out)[0] == 1
    page = out.read_text(encoding="utf-8")
    parser = _Tags()
    parser.feed(page)
    assert parser.tags <= {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "h1",
        "h2",
        "h3",
        "p",
        "table",
        "tr",
        "th",
        "td",
        "ul",
        "li",
        "pre",
        "mark",
        "svg",
        "rect",
        "text",
        "span",
    }, parser.tags
    assert "b" not in parser.tags and "script" not in parser.tags
    shown = "".join(parser.text)
    assert visible(HOSTILE) in shown  # the id, as text, with its control characters spelled
    assert "\x1b" not in page and "\x00" not in page


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells as a GFM renderer splits them: at each | not escaped by a
    backslash."""
    cells, cell = [], ""
    for token in re.findall(r"\\.|[^\\|]+|\|", row.strip()[1:-1]):
        if token == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += token
    return [*cells, cell]


def test_markdown_tables_keep_their_columns(hostile_run):
    code, text = run_cli("report", hostile_run / "run", "--format", "markdown")
    assert code == 1
    assert (
        "\x1b" not in text and "\x00" not in text and "<b>" not in text and "</script>" not in text
    )
    tables = [block.splitlines() for block in re.findall(r"(?m)(?:^\|.*\n)+", text)]
    assert len(tables) >= 2
    for rows in tables:
        assert all(len(_cells(row)) == len(_cells(rows[0])) for row in rows), rows
    assert markdown_cell(HOSTILE) in text


def test_the_terminal_table_neither_obeys_markup_nor_passes_escape_sequences(hostile_run):
    code, text = run_cli("report", hostile_run / "run", "--format", "table")
    assert code == 1, text  # [/x] in the id raised rich's MarkupError before
    assert "\x1b" not in text and "\\u001b[31m" in text.replace("\n", "")


def test_a_run_shows_such_a_probe_in_its_progress_and_table_and_ends(tmp_path):
    with _HostileServer(Behaviour(drift_at=3)) as server:
        path = write_scenario(
            tmp_path / "s.toml",
            server.url,
            concurrency=[1, 4],
            samples=6,
            probes=[{"id": HOSTILE, "prompt": "Say something.", "max_tokens": 16}],
        )
        code, output = run_cli(
            "run", path, "--out", tmp_path / "run"
        )  # the progress bar raised MarkupError
    assert code == 1, output
    assert "\x1b" not in output and "\\u001b[31m" in output.replace("\n", "")


# --- the escaping functions, over arbitrary text ---

# Any text, with the characters each format cares about (and the ones XML cannot carry at all) made
# frequent.
_SPECIAL = st.sampled_from(
    [
        "\x00",
        "\x1b",
        "\r",
        "\n",
        "\ud800",
        "\udfff",
        "\ufffe",
        "\uffff",
        "]]>",
        "</",
        "&",
        "|",
        "\\",
        '"',
    ]
)
_ANY = st.lists(st.one_of(st.text(max_size=8), _SPECIAL), max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(_ANY)
def test_any_text_makes_well_formed_junit(text):
    root = ET.Element("testsuites", name=xml_text(text))
    ET.SubElement(root, "failure", message=xml_text(text)).text = xml_text(text)
    back = ET.fromstring(ET.tostring(root, encoding="unicode", xml_declaration=True))
    assert back.get("name") == xml_text(
        text
    )  # attributes keep even \r and \n (written as references)
    # Character data: an XML parser reads a line end, \r\n or \r, as \n.
    assert (back[0].text or "") == xml_text(text).replace("\r\n", "\n").replace("\r", "\n")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_a_label_value_both_parsers_read_back(text):
    page = f'# TYPE kevload_x gauge\nkevload_x{{probe="{escape_label(text)}"}} 1\n# EOF\n'
    for parse in (text_families, openmetrics_families):
        ((sample,),) = [family.samples for family in parse(page)]
        assert sample.labels["probe"] == text


@settings(max_examples=300, deadline=None)
@given(st.lists(_ANY | st.lists(_ANY | st.just("`")).map("`".join), min_size=1, max_size=4))
def test_any_text_stays_in_its_markdown_cell(cells):
    row = "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"
    assert "\n" not in row and "\r" not in row
    assert len(_cells(row)) == len(cells)


def test_a_flipped_answer_is_spelled_as_every_output_spells_control_characters(tmp_path, server):
    # Right alone, a hostile answer under load: each output quotes the flipped answer beside the
    # serial one, with its control characters spelled as JSON escapes (\u001b) as everything else
    # is, not as Python's repr (\x1b).
    server.behaviour.latency = 0.1
    server.behaviour.answer_for = lambda prompt, overlap: (
        "right" if overlap < 2 else "wrong\x1b[2J\x7f\x85<b>"
    )
    path = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1, 4],
        samples=4,
        probes=[{"id": "p1", "prompt": "Say right.", "expected": "right"}],
    )
    code, terminal = run_cli(
        "run", path, "--out", tmp_path / "run", "--junit", tmp_path / "junit.xml"
    )
    assert code == 1, terminal
    spelled = "wrong\\u001b[2J\\u007f\\u0085"
    junit = ET.fromstring((tmp_path / "junit.xml").read_text(encoding="utf-8"))
    failures = " ".join(f.text or "" for f in junit.iter("failure"))
    _, markdown = run_cli("report", tmp_path / "run", "--format", "markdown")
    run_cli("report", tmp_path / "run", "--format", "html", "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    for name, text in (
        ("terminal", terminal.replace("\n", "")),
        ("junit", failures),
        ("markdown", markdown),
        ("html", page),
    ):
        assert "\\x1b" not in text and "\\x85" not in text and "\x1b" not in text, name
        assert spelled in text.replace("\\\\", "\\"), (
            name
        )  # Markdown escapes the escape's backslash
    assert html.escape(f"e.g. '{spelled}<b>' where serial answered 'right'") in page


def test_markdown_escapes_inside_a_code_span_only_what_a_table_needs():
    # `&lt;` inside backticks shows as written: a renderer spells nothing inside a code span.
    assert markdown_cell("use `a<b|c&d` when x<y") == "use `a<b\\|c&d` when x&lt;y"
    assert markdown_cell("``a`<b>`c`` and `<open") == "``a`<b>`c`` and `&lt;open"
    assert markdown_cell("`a\nb`") == "`a\\u000ab`"
    # A backslash before an escaped | would end the cell: such a span is escaped whole.
    assert markdown_cell("`a\\|<`") == "`a\\\\\\|&lt;`"


def test_the_markdown_report_has_the_terminals_latency_table(tmp_path, server):
    from kevload.outputs.tablerows import latency_rows
    from kevload.records.summary import RunSummary
    from tests.conftest import load_summary

    code, _ = run_cli(
        "run", write_scenario(tmp_path / "s.toml", server.url), "--out", tmp_path / "r"
    )
    code, text = run_cli("report", tmp_path / "r", "--format", "markdown")
    assert code == 0
    assert "latency (ms, p50 / p99) and throughput:" in text
    rows = latency_rows(RunSummary.from_json(load_summary(tmp_path / "r")))
    assert rows and all("| " + " | ".join(row) + " |" in text for row in rows)
