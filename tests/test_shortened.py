"""``wordsets.shortened``, the one way a message quotes a value that may be long: whole up to its
limit, otherwise cut so that the mark ends it and the quote is exactly the limit long."""

from kevload.inputs.fieldrules import shown as scenario_show
from kevload.inputs.gradeanswers import _cut
from kevload.inputs.wordsets import shortened
from kevload.load.prefixcache import _shown as prefix_shown
from kevload.records.summary import _shown as summary_shown
from kevload.wire.decoding import shown as client_shown


def test_a_value_within_the_limit_is_quoted_whole() -> None:
    assert shortened("x" * 40, 40) == "x" * 40
    assert shortened("", 3, "...") == ""


def test_a_longer_value_is_cut_to_the_limit_mark_included() -> None:
    assert shortened("abcdefgh", 5) == "abcd…"
    assert shortened("abcdefgh", 5, "...") == "ab..."
    assert shortened("abcdefgh", 5, "") == "abcde"


def test_each_message_keeps_its_limit_and_mark() -> None:
    # summary: JSON at most 40 characters, "..."; wire: a repr at most 80, "…"
    assert summary_shown("y" * 100) == '"' + "y" * 36 + "..."
    assert summary_shown("y" * 38) == '"' + "y" * 38 + '"'
    assert client_shown("z" * 100) == "'" + "z" * 78 + "…"
    # scenario and trace, one helper (fieldrules.shown): a repr at most 80, "...", None as "nothing"
    assert scenario_show("q" * 100) == "'" + "q" * 76 + "..."
    assert scenario_show(None) == "nothing"
    # grading: 120 characters of the answer, then "…"; prefix cache: 200, quoted, then its length
    assert _cut("a" * 130) == "a" * 120 + "…"
    assert _cut("a" * 120) == "a" * 120
    assert prefix_shown("b" * 201) == repr("b" * 200) + "… (201 characters)"
    assert prefix_shown("b" * 200) == repr("b" * 200)
