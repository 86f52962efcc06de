"""The ``choice`` grader's reader: the multiple-choice letter an answer gives (``choice_letter``),
as docs/graded.md's choice rule says, with the options the answer rules out never read as its pick.

Linear in the answer's length (the answer is the server's): every gap in a pattern is bounded and no
two gaps meet, and the words around an option are looked at within a bounded window."""

from __future__ import annotations

import re
import unicodedata

# After the ways MMLU-style graders read a letter: simple-evals' "Answer: X" heads in several
# languages, MMLU-Pro's "answer is (X)" then "Answer: X", lm-eval's flexible "(X)". Our own order:
# an answer head ("the answer is C", "Answer: c", "答案是C", "选 A"), the last one where a model
# restates or corrects itself; only where none is there a mention of an option ("Option B", "选项B",
# "answer C"); a head or a mention the answer rules out ("option A is wrong", "not option A") counts
# as neither. Then a bare letter, a leading "X." or "X)", the last "(X)". Letters A-J; markdown
# emphasis and LaTeX boxes around them are dropped first.
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
    rf"(?:(?i:\b(?:answer|correct\s(?:option|choice))\s{{1,8}}"
    rf"(?:is|(?:would|should|must|will)\sbe)\b)"
    rf"|(?i:\banswer(?={_GAP}[:：(\[]))"
    rf"|正确答案(?:是|为)|答案(?:应该?)?(?:是|为)|答案?(?={_GAP}[:：])|应?选(?:择)?(?!项))"
    rf"(?:{_GAP}(?:(?i:option|choice)\b|选项){_OPTION_TAIL}|{_ANSWER_TAIL})"
)
_MENTION = re.compile(
    r"(?:(?i:\b(?:answer|option|choice))|选项|答案)"
    rf"(?:{_GAP}[:：]{_GAP}{_OPEN}{_letter('A-Ja-j', 'AIai')}|{_BRACKETED}|{_GAP}{_letter('A-J')})"
)


# An option the answer rules out is never its pick: one after a negation or an elimination ("not
# option A", "I eliminated option B", "rather than option C", "不是选项A", "排除选项B"), or
# one a verdict of wrongness follows ("option A is wrong", "Option B would be wrong", "answer A is
# a distractor", "选项A不对"). Looked at within ``_WINDOW`` characters of the option, so each
# mention costs a bounded step.
_WINDOW = 40
_RULED_OUT_BEFORE = re.compile(
    r"(?:(?i:\b(?:not|no|never|eliminat(?:e|es|ed|ing)|exclud(?:e|es|ed|ing)|except|without|against"
    r"|rul(?:e|es|ed|ing)\s+out|rather\s+than|instead\s+of))[\s,:]*(?i:the\s+)?"
    r"|(?:不是|并非|而非|排除|除了|不选)\s*)\Z"
)
_RULED_OUT_AFTER = re.compile(
    r"\A[\s,]*(?:(?i:(?:is|was|would\s+be|will\s+be|must\s+be|seems|looks|appears)"
    r"(?:\s+(?:to\s+be|clearly|also|definitely|obviously|certainly|surely))?"
    r"\s+(?:wrong|incorrect|false|not\b|a\s+(?:trap|distractor)|out\b|ruled\s+out|eliminated"
    r"|excluded|impossible)"
    r"|(?:can(?:not|['’]t)|couldn['’]t|isn['’]t|wasn['’]t|won['’]t)\b|doesn['’]t\s+(?:fit|work))"
    r"|(?:不对|不正确|错误|错|不是|被排除|可以排除))"
)
_BARE = re.compile(r"\A[(\[]?\s*([A-J])\s*[)\].:：]?\Z")
# A leading letter: "B." "B)" "B:" and, for a letter that is no word ("C, not option A"), "C,".
_LEADING = re.compile(r"\A(?:[(\[]?([A-J])[)\].:：]|([B-HJ]),)\s")
_PARENS = re.compile(r"[(\[]([A-J])[)\]]")
_MARKUP = re.compile(r"\*\*|__|\$|\\boxed\{|\\text(?:bf)?\{|\}")


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter an answer gives (upper case), or None when it gives none: the last
    answer head's letter, else the last option mentioned, leaving out every one the answer rules
    out; else a bare or leading letter, else the last letter in brackets."""
    text = _MARKUP.sub("", unicodedata.normalize("NFKC", text)).strip()
    for heads, before in ((_ANSWER, False), (_MENTION, True)):
        picked = None
        for found in heads.finditer(text):
            if not _ruled_out(text, found, before):
                picked = found
        if picked is not None:
            return "".join(g for g in picked.groups() if g).upper()
    for pattern in (_BARE, _LEADING):
        matched = pattern.match(text)
        if matched:
            return "".join(g for g in matched.groups() if g)
    parens = _PARENS.findall(text)
    return parens[-1] if parens else None


def _ruled_out(text: str, found: re.Match[str], before: bool) -> bool:
    """Whether the option ``found`` names is ruled out by the words right after it (or, for a
    mention, before)."""
    if _RULED_OUT_AFTER.match(text[found.end() : found.end() + _WINDOW]):
        return True
    return (
        before
        and _RULED_OUT_BEFORE.search(text[max(found.start() - _WINDOW, 0) : found.start()])
        is not None
    )
