"""`kevload coverage` on a small bilingual fixture whose statistics are worked out by hand."""

from __future__ import annotations

import json
import sys

import pytest

from kevload.guide.coverage import keywords, label_shift, segmenter
from tests.conftest import run_cli

TRAIN = [
    {"input": "reset my password", "label": "account"},  # 17 chars
    {"input": "reset password please", "label": "account"},  # 21
    {"input": "退款申请", "label": "billing"},  # 4
    {"input": "invoice missing", "label": "billing"},  # 15
]
ONLINE = [
    {"messages": [{"role": "user", "content": "reset password"}], "label": "account"},  # 14
    {"input": "退款进度查询", "label": "billing"},  # 6
    {"input": "crypto wallet crypto refund is broken today", "label": "crypto"},  # 43
]


@pytest.fixture
def files(tmp_path):
    online, train = tmp_path / "online.jsonl", tmp_path / "train.jsonl"
    online.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in ONLINE) + "\n")
    train.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in TRAIN) + "\n")
    return online, train


def test_keywords_latin_words_and_cjk_bigrams():
    assert keywords("Reset THE password") == ["reset", "password"]
    assert keywords("退款进度") == ["退款", "款进", "进度"]
    assert keywords("查 ok") == ["ok", "查"]


def test_report_by_hand(tmp_path, files):
    online, train = files
    code, output = run_cli(
        "coverage", online, train, "--json", tmp_path / "c.json", "--flag", tmp_path / "flags.jsonl"
    )
    assert code == 0, output
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["train"]["count"] == 4 and report["online"]["count"] == 3
    # Train lengths sorted 4, 15, 17, 21: nearest-rank p50 = 15, p90 = p99 = max = 21.
    assert report["train"]["length"] == {"min": 4, "p50": 15, "p90": 21, "p99": 21, "max": 21}
    # Online lengths 6, 14, 43.
    assert report["online"]["length"] == {"min": 6, "p50": 14, "p90": 43, "p99": 43, "max": 43}
    # Only the 43-char input is outside 4..21.
    assert report["outside_length_range_share"] == pytest.approx(1 / 3, abs=1e-6)
    rare = {r["keyword"]: r for r in report["online_keywords_rare_in_train"]}
    assert rare["crypto"]["online_share"] == pytest.approx(1 / 3, abs=1e-6)  # document frequency
    assert rare["crypto"]["train_share"] == 0
    assert "reset" not in rare and "退款" not in rare  # both seen in training
    assert "进度" in rare
    top_train = {k["keyword"]: k["share"] for k in report["train"]["top_keywords"]}
    assert top_train["password"] == 0.5 and top_train["reset"] == 0.5
    labels = report["labels"]
    assert labels["train"] == {"account": 0.5, "billing": 0.5, "crypto": 0.0}
    assert labels["unseen_in_train"] == ["crypto"]
    assert labels["js_divergence"] == pytest.approx(
        label_shift({"account": 1, "billing": 1, "crypto": 1}, {"account": 2, "billing": 2})[
            "js_divergence"
        ]
    )
    flags = [json.loads(line) for line in (tmp_path / "flags.jsonl").read_text().splitlines()]
    assert [f["boundary"] for f in flags] == [False, True, True]
    assert any("label 'crypto' unseen" in r for r in flags[2]["reasons"])
    assert any("length 43 outside" in r for r in flags[2]["reasons"])
    assert "boundary samples flagged: 2 of 3" in output


def test_js_divergence_by_hand():
    # p = (1/3, 1/3, 1/3), q = (1/2, 1/2, 0); m = (5/12, 5/12, 1/6).
    import math

    p, q, m = [1 / 3] * 3, [0.5, 0.5, 0.0], [5 / 12, 5 / 12, 1 / 6]

    def kl(a: list[float], b: list[float]) -> float:
        return sum(x * math.log2(x / y) for x, y in zip(a, b, strict=True) if x > 0)

    expected = 0.5 * kl(p, m) + 0.5 * kl(q, m)
    got = label_shift({"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1})["js_divergence"]
    assert got == pytest.approx(expected, abs=1e-6)


def test_bad_line_names_file_and_line(tmp_path, files):
    online, _ = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "ok"}\n{"nothing": 1}\n')
    code, output = run_cli("coverage", online, bad, "--max-bad", "0")
    assert code == 2 and "bad.jsonl:2" in output and "more than 0 bad lines" in output


def test_production_log_with_bad_and_torn_lines(tmp_path, files):
    """A few broken lines and a torn last line are skipped and counted; the statistics cover the
    rest."""
    _, train = files
    log = tmp_path / "online.jsonl"
    good = [json.dumps(x, ensure_ascii=False) for x in ONLINE]
    log.write_bytes(
        "\n".join(
            [good[0], "{not json", good[1], '["a list"]', good[2], '{"input": "cut of']
        ).encode()
    )
    code, output = run_cli(
        "coverage", log, train, "--json", tmp_path / "c.json", "--flag", tmp_path / "f.jsonl"
    )
    assert code == 0, output
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["online"]["count"] == 3 and report["online"]["length"]["max"] == 43
    assert report["online"]["skipped_lines"] == {
        "count": 3,
        "first": f"{log}:2",
        "first_reason": "not JSON",
    }
    assert report["train"]["skipped_lines"]["count"] == 0
    assert f"online: 3 bad line(s) skipped; the first, {log}:2: not JSON" in output
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) == 3

    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(("\n".join(good) + '\n{"input": "half').encode())
    run_cli("coverage", torn, train, "--json", tmp_path / "t.json")
    skipped = json.loads((tmp_path / "t.json").read_text())["online"]["skipped_lines"]
    assert skipped == {
        "count": 1,
        "first": f"{torn}:4",
        "first_reason": "torn last line (no newline at the end)",
    }

    # Above --max-bad the file is refused, the first bad line named.
    code, output = run_cli("coverage", log, train, "--max-bad", "2")
    assert (
        code == 2 and f"more than 2 bad lines (--max-bad); the first, {log}:2: not JSON" in output
    )


def test_a_byte_order_mark_opens_a_coverage_file(tmp_path, files):
    online, train = files
    online.write_text("\ufeff" + online.read_text(encoding="utf-8"), encoding="utf-8")
    code, output = run_cli(
        "coverage", online, train, "--json", tmp_path / "c.json", "--max-bad", "0"
    )
    assert code == 0, output
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["online"]["count"] == 3 and report["online"]["skipped_lines"]["count"] == 0


def test_bigrams_without_jieba(tmp_path, files, monkeypatch):
    monkeypatch.setitem(sys.modules, "jieba", None)  # `import jieba` raises ImportError
    assert segmenter().name == "bigram"
    online, train = files
    code, output = run_cli("coverage", online, train, "--json", tmp_path / "c.json")
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["segmenter"] == "bigram" and "keywords: CJK character bigrams" in output
    rare = {r["keyword"] for r in report["online_keywords_rare_in_train"]}
    assert {"款进", "进度", "度查", "查询"} <= rare


def test_jieba_words_when_installed(tmp_path, files):
    pytest.importorskip("jieba")
    seg = segmenter()
    assert seg.name == "jieba"
    assert keywords("退款进度查询", seg) == ["退款", "进度", "查询"]
    online, train = files
    code, output = run_cli("coverage", online, train, "--json", tmp_path / "c.json")
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["segmenter"] == "jieba" and "keywords: jieba word segmentation" in output
    rare = {r["keyword"] for r in report["online_keywords_rare_in_train"]}
    assert {"进度", "查询"} <= rare and "款进" not in rare and "退款" not in rare
