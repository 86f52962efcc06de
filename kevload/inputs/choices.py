"""The ``choice`` grader's reader: the multiple-choice letter an answer gives (``choice_letter``).

Linear in the answer's length (the answer is the server's): every gap in a pattern is bounded and no
two gaps meet."""

from __future__ import annotations

import re
import unicodedata

# After the ways MMLU-style graders read a letter: simple-evals' "Answer: X" heads in several
# languages, MMLU-Pro's "answer is (X)" then "Answer: X", lm-eval's flexible "(X)". Our own order:
# an answer head ("the answer is C", "Answer: c", "答案是C", "选 A"), the last one where a model
# restates or corrects itself; only where none is there a mention of an option ("Option B", "选项B",
# "answer C"), which may just as well be one ruled out ("C, not option A"). Then a bare letter, a
# leading "X." or "X)", the last "(X)". Letters A-J; markdown emphasis and LaTeX boxes around them
# are dropped first.
#
# A and I are words too: after any answer head a sentence may start with the article ("Answer: A car
# is no fruit, so B", "The answer is A cat") or the pronoun ("the answer is I think B", "Answer: I'm
# not sure"). There such a letter is read only where no word follows that the word would take (a
# letter may be followed by these: "A because …"); an option named ("option A seems right", "the
# answer is option A") is always a letter.
_AFTER_LETTER = r"(?:because|since|as|and|or|is|was|which|but|so|for|with)\b"
# The answer's text is the server's: each gap is bounded, and no two gaps meet, so a head followed
# by a megabyte of blanks costs a few steps, not one per way to split the blanks between gaps.
_GAP, _BLANKS = r"\s{0,8}", r"[ \t]{1,8}"


def _letter(letters: str, words: str = "") -> str:
    """One of ``letters`` (a regex class) that is no part of a word; one of ``words`` (taken out of
    ``letters``) only where the article or pronoun it also is cannot be meant."""
    if not words:
        return rf"([{letters}])(?![A-Za-z'’])"
    word = rf"[{words}](?!{_BLANKS}(?!{_AFTER_LETTER})[a-z])"
    return rf"(?:((?![{words}])[{letters}])|({word}))(?![A-Za-z'’])"


# What may follow a head: a letter after a colon (any case: "answer: b"), one in brackets, or a
# capital one; after an answer head maybe with a hedge between: the pronoun, up to three words, then
# maybe "say", "it is", "with" or "for" ("the answer is, I think, B"; "Answer: I would say D";
# "Answer: I am sure it is B"; "I'd go with C"). The head says an answer follows, and these words
# only put the speaker between: the letter after them is the answer, as the one after "I think"
# always was. A word the letter itself would take ("I is …", "I and J") ends no hedge.
_HEDGE = (
    rf"(?:(?:,[ \t]?)?I(?:['’][a-z]+)?(?:{_BLANKS}(?!{_AFTER_LETTER})[a-z]+\b){{1,3}}"
    rf"(?:{_BLANKS}(?:say|it{_BLANKS}is|it['’]s|with|for)\b)?,?{_GAP})?"
)
_OPEN = r"(?:[(\[]\s?)?"
_BRACKETED = rf"{_GAP}[(\[]\s?([A-Ja-j])\s?[)\]]"
# After a colon, in brackets, or a capital letter (the article and the pronoun read as such after
# either head).
_ANSWER_TAIL = (
    rf"(?:{_GAP}[:：]{_GAP}{_HEDGE}{_OPEN}{_letter('A-Ja-j', 'AIai')}|{_BRACKETED}"
    rf"|{_GAP}{_HEDGE}{_letter('A-J', 'AI')})"
)
# An option named after a head or alone: its letter is a letter whatever follows ("option A seems
# right").
_OPTION_TAIL = (
    rf"(?:{_GAP}[:：]{_GAP}{_OPEN}{_letter('A-Ja-j')}|{_BRACKETED}|{_GAP}{_letter('A-J')})"
)
# A lower-case letter only after a colon or in brackets: "the answer is a cat" names no choice.
_ANSWER = re.compile(
    rf"(?:(?i:\b(?:answer|correct\s(?:option|choice))\s{{1,8}}(?:is|(?:would|should|must|will)\sbe)\b)"
    rf"|(?i:\banswer(?={_GAP}[:：(\[]))"
    rf"|正确答案(?:是|为)|答案(?:应该?)?(?:是|为)|答案?(?={_GAP}[:：])|应?选(?:择)?(?!项))"
    rf"(?:{_GAP}(?:(?i:option|choice)\b|选项){_OPTION_TAIL}|{_ANSWER_TAIL})"
)
_MENTION = re.compile(
    r"(?:(?i:\b(?:answer|option|choice))|选项|答案)"
    rf"(?:{_GAP}[:：]{_GAP}{_OPEN}{_letter('A-Ja-j', 'AIai')}|{_BRACKETED}|{_GAP}{_letter('A-J')})"
)


_BARE = re.compile(r"\A[(\[]?\s*([A-J])\s*[)\].:：]?\Z")
_LEADING = re.compile(r"\A[(\[]?([A-J])[)\].:：]\s")
_PARENS = re.compile(r"[(\[]([A-J])[)\]]")
_MARKUP = re.compile(r"\*\*|__|\$|\\boxed\{|\\text(?:bf)?\{|\}")


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter an answer gives (upper case), or None when it gives none."""
    text = _MARKUP.sub("", unicodedata.normalize("NFKC", text)).strip()
    for heads in (_ANSWER, _MENTION):
        found = heads.findall(text)
        if found:
            return "".join(found[-1]).upper()
    for pattern in (_BARE, _LEADING):
        found = pattern.match(text)
        if found:
            return found.group(1)
    parens = _PARENS.findall(text)
    return parens[-1] if parens else None
