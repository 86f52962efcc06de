"""The ``number`` grader's exact arithmetic: the last number an answer writes, read as the exact
value it spells (``last_number``), a probe's ``expected`` and ``grade_tolerance`` as exact values
(``exact_expected``, ``exact_tolerance``), and whether the one is within the other (``within``). No
float anywhere on the way: an integer stays an integer of any size (9999999800000001 is not
9999999800000000), a decimal a ``Decimal`` (1.0 and 1.2 are both exactly 0.1 from 1.1), a fraction a
ratio of two integers (⅓).

Every step is bounded by the answer's length (the answer is the server's): a power, a mixed number
or a fraction whose exact value would take more than ``MAX_DIGITS`` digits to work out
(``9⁹⁹⁹⁹⁹⁹``, ``1e999999999½``) has no value here, as a float's overflow had none; a plain number
is held as written whatever its length or exponent (a Decimal compares in a few steps)."""

from __future__ import annotations

import re
import unicodedata
from collections import deque
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    Context,
    Decimal,
    DecimalException,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
)
from fractions import Fraction
from typing import Any

MAX_DIGITS = 100_000  # the most digits an exact value computed here may span
# Exact arithmetic: a result that would be rounded raises (Inexact) instead; the precision never
# binds, so the digits a result may need are bounded before each operation (``_span``).
_EXACT = Context(
    prec=MAX_PREC,
    Emax=MAX_EMAX,
    Emin=MIN_EMIN,
    traps=[Inexact, InvalidOperation, DivisionByZero, Overflow],
)
# A value read: numerator and denominator (a positive integer; 1 for a decimal).
Exact = tuple[Decimal, Decimal]


class _TooBig(Exception):
    """An exact value that would span more than ``MAX_DIGITS`` digits: no value."""


# A number as answers write it, read from the text as it is (NFKC, once used here, turns "2⁴" into
# "24" and "½" into "1⁄2"): a sign, maybe a currency sign ("-$3" is −3), thousands groups, decimals,
# an exponent, then maybe a fraction ("3½"), a power ("2⁴", "10⁻³") or "× 10ⁿ". Digits are any
# script's (full-width ones too).
#
# A dash is a minus where it starts a word; glued after a letter or digit of a script that puts
# spaces between words ("ω-3", "x-3", "5-3"), or after a closing bracket ("(2+1)-3"), it is a hyphen
# or the operator, and the number after it is read unsigned. Chinese and Japanese write no spaces,
# so after their characters a dash is a minus ("答案是-3").
# Hyphen-minus, minus sign, figure/en/em dash, bar, small, wide.
_MINUS = "-\u2212\u2012\u2013\u2014\u2015\ufe63\uff0d"
_CURRENCY = (
    "$¢£¤¥\u058f\u060b\u09f2\u09f3\u0e3f\u17db\u20a0-\u20c0"
    "\ufdfc\ufe69\uff04\uffe0\uffe1\uffe5\uffe6"
)
# kana, CJK, hangul
_NO_SPACES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# a space, no-break, thin and narrow no-break: "1 000", "12 345 678"
_THOUSANDS = " \u00a0\u2009\u202f"
_SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_SUBSCRIPT = "₀₁₂₃₄₅₆₇₈₉"
_VULGAR = "\u00bc-\u00be\u2150-\u215e\u2189"  # ¼ ½ ¾ ⅐ … ⅞ ↉
_SUP, _SUB = f"[{_SUPERSCRIPT}]", f"[{_SUBSCRIPT}]"
_NUMBER = re.compile(
    # The first character's class up front: the scan skips a position that starts no number on one
    # test (a text of blanks: ten times faster), before the lookbehinds and the branches.
    rf"(?=[{_MINUS}\d{_VULGAR}{_SUPERSCRIPT}])"
    rf"(?<![\dA-Za-z.．])"
    rf"(?:(?<![^\W{_NO_SPACES}])(?<![.．)\]}}])(?P<sign>[{_MINUS}])[{_CURRENCY}]?)?(?:"
    rf"(?P<over>\d+)\u2044(?P<under>\d+)"  # 1⁄2, with the fraction slash
    rf"|(?P<alone>[{_VULGAR}])"  # ½
    rf"|(?P<sup_over>{_SUP}+)\u2044(?P<sub_under>{_SUB}+)"  # ¹⁄₂
    rf"|(?P<whole>\d{{1,3}}(?:[,，]\d{{3}})+|\d{{1,3}}(?:[{_THOUSANDS}]\d{{3}})+|\d+)"
    rf"(?P<decimals>[.．]\d+)?"
    rf"(?:[eE](?P<exponent>[-+]?\d+))?"
    rf"(?:[{_THOUSANDS}]?(?P<vulgar>[{_VULGAR}])"  # 3½, 3 ½
    rf"|(?P<mixed_over>{_SUP}+)\u2044(?P<mixed_under>{_SUB}+)"  # 3¹⁄₂
    rf"|\s?[×xX·⋅]\s?10(?P<times_ten>[⁻⁺]?{_SUP}+)"  # 1.5×10⁻³
    rf"|(?P<power>[⁻⁺]?{_SUP}+))?"  # 2⁴, and 42² where ² is a footnote mark: a power all the same
    # Nothing glued on after: "101₂" is no number read here.
    rf")(?![\d{_SUPERSCRIPT}{_SUBSCRIPT}⁻⁺\u2044])"
)
_ASCII_DIGITS = str.maketrans(
    f"{_SUPERSCRIPT}{_SUBSCRIPT}⁻⁺．", "01234567890123456789-+.", f",，{_THOUSANDS}"
)


def last_number(text: str) -> Decimal | Fraction | None:
    """The exact value of the last number in ``text`` (a ``Decimal``, or a ``Fraction`` where it is
    one: ``⅓``), or None (also where the last one has no value). See ``last_exact``."""
    value = last_exact(text)
    if value is None:
        return None
    numerator, denominator = value
    return numerator if denominator == 1 else Fraction(int(numerator), int(denominator))


def last_exact(text: str) -> Exact | None:
    """The last number in ``text`` as (numerator, denominator), or None (also where the last one has
    no value). Read as a math answer writes it: ``1,234`` and ``1 234`` (a space, thin or narrow
    no-break between groups of 3) are 1234, ``−42`` (a minus sign or a dash starting a word) is
    negative, ``½`` and ``3½`` their value, ``2⁴`` 16, ``1.5×10⁻³`` 0.0015; any script's digits are
    digits."""
    last = deque(
        _NUMBER.finditer(text), maxlen=1
    )  # the whole text scanned at C speed, one match kept
    if not last:
        return None
    try:
        numerator, denominator = _value(last[0].groupdict())
    except (_TooBig, DecimalException, ValueError):
        return None
    return (numerator.copy_negate() if last[0]["sign"] else numerator), denominator


def _value(part: dict[str, Any]) -> Exact:
    """The unsigned value of one ``_NUMBER`` match."""
    one = Decimal(1)
    if part["over"] is not None:
        return _ratio(_digits(part["over"]), _digits(part["under"]))
    if part["alone"] is not None:
        return _VULGAR_VALUES[part["alone"]]
    if part["sup_over"] is not None:
        return _ratio(_digits(part["sup_over"]), _digits(part["sub_under"]))
    number = _digits(f"{part['whole']}{part['decimals'] or ''}e{part['exponent'] or 0}")
    if part["vulgar"] is not None:
        return _plus(number, _VULGAR_VALUES[part["vulgar"]])
    if part["mixed_over"] is not None:
        return _plus(number, _ratio(_digits(part["mixed_over"]), _digits(part["mixed_under"])))
    if part["times_ten"] is not None:
        return _EXACT.scaleb(number, _EXACT.create_decimal(_small_int(part["times_ten"]))), one
    if part["power"] is not None:
        return _power(number, _small_int(part["power"]))
    return number, one


def _digits(text: str) -> Decimal:
    """A matched run of digits (any script's, superscript or subscript; thousands separators
    dropped) as a Decimal: exactly, and without int()'s quadratic cost past 4300 digits."""
    return Decimal(text.translate(_ASCII_DIGITS))


def _small_int(text: str) -> int:
    """A power or a power of ten: digits of its own, few (int() refuses past 4300: ValueError, no
    value)."""
    return int(text.translate(_ASCII_DIGITS))


def _ratio(numerator: Decimal, denominator: Decimal) -> Exact:
    if denominator == 0:
        raise _TooBig  # 1⁄0 has no value
    return numerator, denominator


def _plus(whole: Decimal, fraction: Exact) -> Exact:
    """``whole`` + a fraction, as one ratio (3½ = 7/2)."""
    numerator, denominator = fraction
    scaled = _times(whole, denominator)
    _span(scaled, numerator)
    return _EXACT.add(scaled, numerator), denominator


def _power(base: Decimal, exponent: int) -> Exact:
    """``base`` to an integer power, exactly; a negative power is the reciprocal (2⁻³ = 1/8, 3⁻¹ =
    1/3)."""
    if len(base.as_tuple().digits) * abs(exponent) > MAX_DIGITS:
        raise _TooBig
    raised = _EXACT.power(base, abs(exponent))
    if exponent >= 0:
        return raised, Decimal(1)
    if base == 0:
        raise _TooBig  # 0⁻¹ has no value
    # A ratio of integers: 1/raised with both scaled by raised's decimal places (1.5⁻¹ = 10/15).
    places = max(-_exponent(raised), 0)
    return _EXACT.scaleb(Decimal(1), places), _EXACT.scaleb(raised, places)


def _exponent(value: Decimal) -> int:
    """A finite Decimal's exponent (``as_tuple`` types it with NaN's and infinity's marks too)."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int), value  # every value here is finite
    return exponent


def _times(a: Decimal, b: Decimal) -> Decimal:
    """a × b exactly (the digits of a product are at most those of its factors together)."""
    if len(a.as_tuple().digits) + len(b.as_tuple().digits) > 2 * MAX_DIGITS:
        raise _TooBig
    return _EXACT.multiply(a, b)


def _span(*values: Decimal) -> None:
    """``_TooBig`` where adding ``values`` exactly would take more than ``MAX_DIGITS`` digits
    (1e99999 + 1)."""
    finite = [v for v in values if v != 0]
    if finite:
        top = max(v.adjusted() for v in finite)
        bottom = min(_exponent(v) for v in finite)
        if top - bottom + 1 > MAX_DIGITS:
            raise _TooBig


def _vulgar_values() -> dict[str, Exact]:
    """Each vulgar fraction character's value, from its Unicode decomposition (``<fraction> 0031
    2044 0033``)."""
    out = {}
    for code in (*range(0xBC, 0xBF), *range(0x2150, 0x215F), 0x2189):
        over, _, under = (
            unicodedata.decomposition(chr(code)).removeprefix("<fraction> ").partition(" 2044 ")
        )
        out[chr(code)] = (
            Decimal("".join(chr(int(c, 16)) for c in over.split())),
            Decimal("".join(chr(int(c, 16)) for c in under.split())),
        )
    return out


_VULGAR_VALUES = _vulgar_values()


def exact_expected(value: Any) -> int | Decimal | None:
    """A number grader's ``expected`` as the exact value it was written as, or None where it is
    none: an integer (TOML's or JSON's, of any size, or a string of digits) as an int; a decimal (a
    string, or a TOML or JSON float read as the shortest decimal that is that double: 1.1 is 1.1) as
    a Decimal; no bool, nan or inf."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return Decimal(repr(value)) if value - value == 0 else None
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if not isinstance(value, str):
        return None
    # A dataset's answer column: "42", "-3.5", ".5", "1,234", "1e-3" (what float() took before,
    # exactly).
    text = value.strip().replace(",", "")
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None
    return int(text) if re.fullmatch(r"[-+]?\d{1,4000}", text) else number


def exact_tolerance(value: float | int | Decimal) -> Decimal:
    """``grade_tolerance`` as the decimal it was written as: a float read as its shortest repr (0.1
    is 0.1)."""
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def bounds(expected: int | Decimal, tolerance: float | int | Decimal) -> tuple[Decimal, Decimal]:
    """(expected − tolerance, expected + tolerance), exactly; ``ValueError`` where they would span
    more than ``MAX_DIGITS`` digits (expected 1e99999 with tolerance 0.1)."""
    centre, width = Decimal(expected), exact_tolerance(tolerance)
    if width == 0:
        return centre, centre
    try:
        _span(centre, width)
    except _TooBig:
        raise ValueError(expected, tolerance) from None
    return _EXACT.subtract(centre, width), _EXACT.add(centre, width)


def within(value: Exact, low: Decimal, high: Decimal) -> bool:
    """Whether ``value`` (numerator, denominator) lies in [low, high], ends included, by exact
    comparison."""
    numerator, denominator = value
    if denominator == 1:
        return low <= numerator <= high
    try:
        return _times(low, denominator) <= numerator <= _times(high, denominator)
    except _TooBig:
        return False  # a fraction of more than MAX_DIGITS digits is no answer read


def json_form(expected: int | Decimal) -> int | float | str:
    """How run.json and a case file keep a number grader's ``expected``: an integer as a JSON
    integer (any size), a decimal as the JSON number that reads back as the same decimal, and where
    no double does (more than 15 significant digits), as a string of it; ``exact_expected`` reads
    each back as it was."""
    if isinstance(expected, int):
        return expected
    near = _same_float(expected)
    return str(expected) if near is None else near


def hash_form(expected: int | Decimal) -> float | str:
    """``expected`` as a probe's grading hash takes it: the float runs before exact numbers hashed,
    wherever that float is exactly the value (a baseline from then still pairs its grades), else the
    exact decimal text."""
    near = _same_float(expected)
    return f"exact {expected}" if near is None else near


def _same_float(value: int | Decimal) -> float | None:
    """The float whose shortest repr is ``value`` exactly (42.0 for 42, 1.1 for 1.1), or None where
    none is (9999999800000001, 0.1000000000000000000000001, 10**400)."""
    try:
        near = float(value)
    except OverflowError:
        return None
    return near if near - near == 0 and Decimal(repr(near)) == value else None
