"""Graders: whether an answer is good or bad, given what the probe expected (``expected``,
``grade``, ``grade_tolerance`` on a probe). Pure functions of the answer's text, checked and
compiled once at load.

A probe with neither ``expected`` nor ``grade`` is ungraded. ``expected`` alone picks the grader
from its kind (a string: ``exact``, a number: ``number``, a list: ``one_of``); ``json``,
``json_schema`` and ``python:…`` graders may go without ``expected`` (``json``: the answer parses;
``json_schema``: the schema is ``expected``, a table or the path of a JSON file;
``python:module:function``: gets ``expected`` as run.json keeps it, None when absent).

Grading runs once per distinct output of a cell (``kevload.compare.graded``), never per request.

A python grader is code. It is imported from a scenario the user runs; graders read back from a run
directory or a case file (data, perhaps downloaded from elsewhere) are imported only where the user
says so (``python_graders``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import orjson
import regex

from kevload.inputs.gradeanswers import _cut, content_of, grade_answer, local_schemas, shown
from kevload.inputs.numbers import MAX_DIGITS, bounds, exact_expected, json_form

GRADES = ("exact", "contains", "regex", "one_of", "number", "choice", "json", "json_schema")
PYTHON = "python:"
GRADE_EXPECTED = f"one of {', '.join(GRADES)} or python:module:function"
# What each grader needs in ``expected`` (None: may be absent).
_NEEDS: dict[str, str | None] = {
    "exact": "a string",
    "contains": "a non-empty string",
    "regex": "a regular expression (a string)",
    "one_of": "a non-empty list of strings",
    "number": "a number (or a string holding one)",
    "choice": "one letter from A to J",
    "json": None,
    "json_schema": None,
}
LETTERS = "ABCDEFGHIJ"  # MMLU's four, MMLU-Pro's ten
CHOICE_EXPECTED = f"one letter from {LETTERS[0]} to {LETTERS[-1]}"
# run.json keeps ``expected`` as JSON and `kevload report` grades from it: a value JSON changes on
# the way (a TOML date becomes a string, nan null) would grade the same answers otherwise there than
# in the run.
JSON_EXPECTED = (
    "a value JSON keeps as it is (strings, finite numbers, integers of any size, booleans, lists "
    "and tables of them; no TOML date or time, no nan or inf), as run.json keeps it for kevload "
    "report"
)
IMPORT = "import"  # python graders are imported (a scenario the user runs)
# their names are checked, nothing imported (inputs read back, no answer graded)
NAMES_ONLY = "names only"
_python_policy: ContextVar[str] = ContextVar("python_graders", default=IMPORT)


@contextmanager
def python_graders(policy: str) -> Iterator[None]:
    """Within: python graders are imported (``IMPORT``), only their names checked (``NAMES_ONLY``),
    or refused with ``policy`` as what was expected instead (any other text). A run.json or a case
    file can name any module and function with arguments of its own making (``python:os:execl``):
    reading one must not run it unasked."""
    token = _python_policy.set(policy)
    try:
        yield
    finally:
        _python_policy.reset(token)


# Where a json_schema's ``expected`` may be the path of a file to read (None), or why not: a
# run.json or a case file is data, and the path it holds could name any file (a key); kevload reads
# it only where the user says so.
_schema_files: ContextVar[str | None] = ContextVar("schema_files", default=None)


@contextmanager
def schema_files(refusal: str | None) -> Iterator[None]:
    """Within: a json_schema given as a path is read (``refusal`` None) or refused unread,
    ``refusal`` saying what was expected instead."""
    token = _schema_files.set(refusal)
    try:
        yield
    finally:
        _schema_files.reset(token)


def schema_refused_from(what: str) -> str:
    """The refusal of schema files named in ``what`` (a run directory, a case file), saying how to
    allow them."""
    return (
        f"a JSON Schema kept in {what} (a table): a path there names a file, which kevload reads "
        "only with --trust-graders"
    )


def refused_from(what: str) -> str:
    """The policy that refuses python graders named in ``what`` (a run directory, a case file),
    saying how to allow them."""
    return (
        f"a grader that runs no code: {what} is data, and kevload imports the python graders it "
        f"names only with "
        "--trust-graders"
    )


class BadGrading(Exception):
    """A probe's grading keys do not fit: which key, what it expects, what it got (the caller names
    the source)."""

    def __init__(self, key: str, expected: str, got: Any):
        super().__init__(key, expected, got)
        self.key, self.expected, self.got = key, expected, got


@dataclass(frozen=True)
class Grading:
    """One probe's grader, as run.json keeps it: ``kevload report`` grades again from it alone.
    ``expected`` is normal (one_of: a tuple; number: its exact value, an int or a Decimal
    (``numbers.exact_expected``); choice: the upper-case letter; json_schema: the schema itself).
    ``tolerance`` is read exactly as it is written (``numbers.exact_tolerance``)."""

    grade: str
    expected: Any = None
    tolerance: float = 0.0
    # A python grader's function, imported at load (run.json keeps its name, from which it is
    # imported again).
    function: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        expected = self.expected
        if isinstance(expected, tuple):
            expected = list(expected)
        elif self.grade == "number":
            expected = json_form(expected)  # exactly: an integer of any size, never a float near it
        doc = {"grade": self.grade, "expected": expected, "tolerance": self.tolerance}
        home = module_home(self.grade) if self.grade.startswith(PYTHON) else None
        # Where the run found a python grader's module, whichever directory it is read back from
        # later.
        return {**doc, "dir": home} if home else doc

    @classmethod
    def from_json(cls, doc: dict[str, Any], base: Path) -> Grading:
        """Read back from run.json, checked again (a python grader is imported again: from the
        directory the run found it in, else from ``base`` first)."""
        home = doc.get("dir")
        if home is not None and not (isinstance(home, str) and Path(home).is_absolute()):
            raise BadGrading(
                "dir",
                "the absolute path of the directory the python grader was imported from",
                home,
            )
        grading = checked(
            doc.get("expected"),
            doc.get("grade"),
            doc.get("tolerance", 0.0),
            Path(home) if home else base,
        )
        if (
            grading is None
        ):  # run.json keeps only graded probes: one without a grader is no such entry
            raise BadGrading("grade", GRADE_EXPECTED, None)
        return grading

    def good(self, answer: str, probe: str = "", timeout: float | None = None) -> bool:
        """Whether ``answer`` (the whole text a cell keeps for an output) of ``probe`` (its id) is
        good; ``GraderFailed`` when a user's grader raises or returns no bool. ``timeout``: seconds
        a regex may match (``TimeoutError`` past it); the other graders' bounds are
        ``gradeworker``'s."""
        return grade_answer(self, content_of(answer), probe, timeout)


def checked(expected: Any, grade: Any, tolerance: Any, base: Path) -> Grading | None:
    """A probe's grading keys checked and made normal: None when the probe is ungraded (neither key
    given); ``BadGrading`` naming the key otherwise. ``base`` is the directory a schema file or a
    python grader is found from (the scenario's, or the dataset file's)."""
    if expected is None and grade is None:
        if tolerance not in (None, 0, 0.0):
            raise BadGrading(
                "grade_tolerance", 'expected and grade = "number" beside it', tolerance
            )
        return None
    if grade is None:
        grade = _default_grade(expected)
    if not isinstance(grade, str) or not (grade in GRADES or grade.startswith(PYTHON)):
        raise BadGrading("grade", GRADE_EXPECTED, grade)
    tol = 0.0 if tolerance is None else _finite(tolerance)
    if tol is None or tol < 0:
        raise BadGrading(
            "grade_tolerance",
            "a number >= 0 (how far the answer's number may be from expected)",
            tolerance,
        )
    if tol and grade != "number":
        raise BadGrading(
            "grade_tolerance", f'grade = "number" beside it (grade is "{grade}")', tolerance
        )
    if grade == "number" and (value := exact_expected(expected)) is not None:
        try:
            bounds(value, tol)
        except ValueError:
            raise BadGrading(
                "expected",
                f"a number whose digits and grade_tolerance's span at most {MAX_DIGITS:,} places",
                expected,
            ) from None
    if grade.startswith(PYTHON):
        policy = _python_policy.get()
        if policy == NAMES_ONLY:
            _python_name(grade)
            return Grading(grade, _as_kept(expected), tol)
        if policy != IMPORT:
            raise BadGrading("grade", policy, grade)
        # Imported now: a bad path fails before anything is sent.
        return Grading(grade, _as_kept(expected), tol, python_grader(grade, base))
    if expected is None and _NEEDS[grade] is not None:
        raise BadGrading("expected", f'{_NEEDS[grade]} beside grade = "{grade}"', None)
    return Grading(grade, _expected(grade, expected, base), tol)


def _default_grade(expected: Any) -> str:
    if isinstance(expected, str):
        return "exact"
    if isinstance(expected, int | float | Decimal) and not isinstance(expected, bool):
        return "number"
    if isinstance(expected, list | tuple):
        return "one_of"
    raise BadGrading(
        "grade",
        f"{GRADE_EXPECTED} beside this expected (only a string, a number or a list picks "
        "its grader)",
        None,
    )


def _expected(grade: str, expected: Any, base: Path) -> Any:
    need = _NEEDS[grade]
    if grade == "exact" and isinstance(expected, str):
        return expected
    if grade in ("contains", "regex") and isinstance(expected, str) and expected:
        if grade == "regex":
            try:
                regex.compile(expected)
            except regex.error as exc:
                raise BadGrading("expected", f"a regular expression ({exc})", expected) from None
        return expected
    if (
        grade == "one_of"
        and isinstance(expected, list | tuple)
        and expected
        and all(isinstance(x, str) for x in expected)
    ):
        return tuple(expected)
    if grade == "number":
        value = exact_expected(expected)
        if value is not None:
            return value
    if (
        grade == "choice"
        and isinstance(expected, str)
        and len(expected.strip()) == 1
        and expected.strip().upper() in LETTERS
    ):
        return expected.strip().upper()
    if grade == "json":
        return _as_kept(
            expected
        )  # any JSON value (TOML's tables, lists, strings, numbers): the answer must equal it
    if grade == "json_schema":
        return _as_kept(_schema(expected, base))
    assert need is not None  # json and json_schema, which need none, returned above
    raise BadGrading("expected", need, expected)


def _finite(value: Any) -> float | None:
    """``grade_tolerance`` as a float, or None: no bool, nothing beyond a float's range (a TOML
    integer may have 400 digits), no nan or inf. The number grader reads it exactly as written
    (``numbers.exact_tolerance``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _as_kept(expected: Any) -> Any:
    """An ``expected`` that any value may be (``json``, ``json_schema``, ``python:``) as run.json
    keeps it (tables by sorted key), so a grader sees the same value in the run and in `kevload
    report`; ``BadGrading`` naming the part JSON would not keep as it is. The other graders' normal
    forms are strings, letters and exact numbers already. Round-tripped by msgspec, which keeps an
    integer of any size (orjson stops at 64 bits)."""
    misfit = _json_misfit(expected)
    if misfit is not None:
        raise BadGrading(f"expected{misfit[0]}", JSON_EXPECTED, misfit[1])
    return msgspec.json.decode(_SORTED.encode(expected))


_SORTED = msgspec.json.Encoder(order="sorted")


def _json_misfit(value: Any, where: str = "") -> tuple[str, Any] | None:
    """The first part of ``value`` JSON does not keep as it is, as (its path below the value, the
    part); None when every part fits."""
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, list | tuple):
        return next(
            (m for i, v in enumerate(value) if (m := _json_misfit(v, f"{where}[{i}]"))), None
        )
    if isinstance(value, dict):
        return next((m for k, v in value.items() if (m := _json_misfit(v, f"{where}.{k}"))), None)
    return where, value


def _schema(expected: Any, base: Path) -> dict[str, Any]:
    """A JSON Schema given inline (a table) or as the path of a JSON file (relative to ``base``),
    checked against its own metaschema now: a malformed schema is bad input, not a bad answer."""
    if isinstance(expected, str) and expected:
        refusal = _schema_files.get()
        if refusal is not None:
            raise BadGrading("expected", refusal, expected)  # unread: a path could name any file
        path = base / expected
        try:
            schema = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            # orjson's and the OS's messages give the place, never the text: nothing of the file is
            # shown.
            raise BadGrading(
                "expected", f"a JSON Schema file that reads as JSON ({path}: {exc})", expected
            ) from None
        if not isinstance(schema, dict):
            raise BadGrading("expected", f"a JSON Schema file holding an object ({path})", expected)
        try:
            return _checked_schema(schema, f"the JSON Schema file {path}", quoted=False)
        except (
            BadGrading
        ) as bad:  # what it says of the schema, not the schema: the path is what was given
            raise BadGrading(bad.key, bad.expected, expected) from None
    if isinstance(expected, dict):
        return _checked_schema(expected, "a JSON Schema", quoted=True)
    raise BadGrading(
        "expected",
        'a JSON Schema (a table, or the path of a JSON file) beside grade = "json_schema"',
        expected,
    )


def _checked_schema(schema: dict[str, Any], which: str, *, quoted: bool) -> dict[str, Any]:
    """``schema`` checked against its metaschema and its references; ``quoted``: an error may quote
    parts of it (it was given inline), else it names only the place (it was read from a file, whose
    text is never shown)."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top"
        why = exc.message if quoted else f"its metaschema's {exc.validator!r} fails there"
        raise BadGrading("expected", f"a valid JSON Schema (at {where}: {why})", schema) from None
    try:
        unresolved = _unresolved_reference(schema, validator)
    except (
        Exception
    ) as exc:  # the referencing library's walk of an older draft (draft 3's extends) can raise
        unresolved = (
            f"its references could not be followed ({type(exc).__name__}: {_cut(str(exc))})"
        )
    if unresolved:
        raise BadGrading(
            "expected",
            f"{which} whose every reference resolves within it or to a JSON Schema "
            f"metaschema (kevload fetches no schema)"
            + (f": {unresolved}" if quoted else f": one {_keyword_of(unresolved)} does not"),
            schema,
        )
    return schema


def _keyword_of(unresolved: str) -> str:
    """Which kind of reference ``_unresolved_reference`` found, in kevload's words alone (none of
    the schema's)."""
    return next((k for k in _REFERENCES if unresolved.startswith(f"{k} ")), "reference")


def _unresolved_reference(schema: dict[str, Any], validator: Any) -> str | None:
    """The first reference (``$ref``, ``$dynamicRef``) in ``schema`` that its validator could not
    follow, with why; None when each one resolves. Every subschema is visited, and every schema a
    reference leads to, with the resolver the validator would have there (``referencing``'s, over
    ``gradeanswers.local_schemas``): a reference that resolves nowhere would otherwise fail the
    grading of every answer, after the whole run was sent."""
    import referencing.exceptions
    import referencing.jsonschema

    specification = referencing.jsonschema.specification_with(
        validator.ID_OF(validator.META_SCHEMA) or "", default=referencing.Specification.OPAQUE
    )
    root = specification.create_resource(schema)
    todo = [(root, local_schemas().resolver_with_root(root))]
    seen: set[int] = set()
    while todo:
        resource, resolver = todo.pop()
        if id(resource.contents) in seen:
            continue
        seen.add(id(resource.contents))
        for keyword in _REFERENCES:
            ref = resource.contents.get(keyword) if isinstance(resource.contents, dict) else None
            if not isinstance(ref, str) or keyword not in validator.VALIDATORS:
                continue
            try:
                resolved = resolver.lookup(ref)
            except referencing.exceptions.Unresolvable as exc:
                return f"{keyword} {ref!r} ({type(exc).__name__}: {_cut(str(exc))})"
            if not isinstance(resolved.contents, dict | bool):
                led = shown(str(resolved.contents))
                return f"{keyword} {ref!r} (it leads to {led}, which is no schema)"
            todo.append((specification.create_resource(resolved.contents), resolved.resolver))
        todo.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())
    return None


# What a validator follows by name ($recursiveRef, 2019-09's, may only be "#", which is always
# there).
_REFERENCES = ("$ref", "$dynamicRef")


def python_grader(grade: str, base: Path) -> Callable[..., Any]:
    """The user's ``python:module:function``, imported (with ``base`` searched first, so a
    graders.py beside the scenario is found); ``BadGrading`` when it is no importable callable."""
    module_name, function_name = _python_name(grade)
    added = str(base.resolve())
    _refuse_another_of_the_name(module_name.partition(".")[0], added, grade)
    sys.path.insert(0, added)
    try:
        module = importlib.import_module(module_name)
    except (
        Exception
    ) as exc:  # the user's module: any error in it is theirs to see, named, not a traceback
        raise BadGrading(
            "grade",
            f"{_PYTHON_SHAPE} (importing {module_name}: {type(exc).__name__}: {exc})",
            grade,
        ) from None
    finally:
        sys.path.remove(added)
    function: object = getattr(module, function_name, None)
    if not callable(function):
        raise BadGrading(
            "grade", f"{_PYTHON_SHAPE} ({module_name} has no function {function_name})", grade
        )
    return function


_PYTHON_SHAPE = "python:module:function, an importable module and a function in it"


def _refuse_another_of_the_name(top: str, base: str, grade: str) -> None:
    """``BadGrading`` where ``base`` holds a module ``top`` while Python would take another of that
    name: one already imported (a second graders.py beside another dataset would silently grade by
    the first) or one installed (a jsonschema.py grader would stand in for the library kevload
    imports later). Python keeps one module per name."""
    found = importlib.machinery.PathFinder.find_spec(top, [base])
    if found is None:
        return
    loaded = sys.modules.get(top)
    if loaded is not None and top in _imported_from:
        there: tuple[str, ...] | None = _imported_from[
            top
        ]  # a namespace package's own path follows sys.path, which no longer has its base
    else:
        other = loaded.__spec__ if loaded is not None else _spec_elsewhere(top, base)
        there = _where(other) if other is not None else None
    if there is not None and there != _where(found):
        raise BadGrading(
            "grade",
            f"{_PYTHON_SHAPE}, by a name no other module has: {top} is already "
            f"{', '.join(there) or 'imported'}, not {', '.join(_where(found))}; rename yours",
            grade,
        )
    _imported_from[top] = _where(found)


_imported_from: dict[
    str, tuple[str, ...]
] = {}  # top-level module name: where a grader's import found it


def _spec_elsewhere(top: str, base: str) -> Any:
    """The spec Python would import ``top`` by without ``base`` on its path (None: no such
    module)."""
    path = [p for p in sys.path if Path(p or ".").resolve() != Path(base)]
    builtin = importlib.machinery.BuiltinImporter.find_spec(
        top
    ) or importlib.machinery.FrozenImporter.find_spec(top)
    return builtin or importlib.machinery.PathFinder.find_spec(top, path)


def _where(spec: Any) -> tuple[str, ...]:
    """A module's place: its file, or a namespace package's directories (which have no file),
    resolved."""
    places = (
        [spec.origin]
        if spec.origin and spec.origin not in ("built-in", "frozen")
        else list(spec.submodule_search_locations or ()) or [spec.origin or ""]
    )
    return tuple(
        str(Path(p).resolve()) if p not in ("built-in", "frozen", "") else p for p in places
    )


def _python_name(grade: str) -> tuple[str, str]:
    """(module, function) of ``python:module:function``; ``BadGrading`` when either is missing."""
    _, module_name, function_name = (grade.split(":", 2) + ["", ""])[:3]
    if not module_name or not function_name:
        raise BadGrading("grade", _PYTHON_SHAPE, grade)
    return module_name, function_name


def module_home(grade: str) -> str | None:
    """The directory the (imported) module of ``python:module:function`` was found from, absolute:
    the sys.path entry a dotted name starts from. None for a module not imported or not from a
    file."""
    module = sys.modules.get(_python_name(grade)[0])
    origin = getattr(getattr(module, "__spec__", None), "origin", None)
    if not origin or not Path(origin).is_file():
        return None
    depth = _python_name(grade)[0].count(".") + (Path(origin).name == "__init__.py")
    return str(Path(origin).resolve().parents[depth])
