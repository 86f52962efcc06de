"""Grading bounded in time: no grader can hang a run's summary. Each answer gets ``timeout`` seconds
(``load.grade_timeout``); past it the answer is ``GraderFailed``, naming the grader and the bound.

- ``regex``: in this process, by the ``regex`` package's own match timeout.
- ``python:`` graders and ``json_schema``: in one worker process, killed when an answer takes
  longer. A thread cannot be killed and a C loop (``re`` inside a schema's ``pattern``) ignores the
  bound a signal would set; a process can always be killed. The worker also keeps whatever the
  user's code does (``sys.exit``, ``os._exit``, ``GeneratorExit``, a print to stdout) away from
  kevload's process: each is a failure on that answer.
- The rest (exact, contains, one_of, number, choice, json) are kevload's own, linear in the answer,
  in process.

A grader that runs past its bound once grades no further answer in that summary (each is
``GraderFailed``): a grader that loops on every answer costs one bound, not one per answer.

The worker starts on the first answer that needs it (a fresh Python that imports the graders again:
some 60 ms on the project's 2-core machine), then costs one round trip through a pipe per distinct
output graded (some 70 µs there; tests/compare/test_grader_bounds.py measures both).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from kevload.inputs.gradeanswers import GraderFailed, content_of, shown
from kevload.inputs.grading import PYTHON, Grading

# seconds per answer: room for a grader that calls a checker, none for one that hangs
DEFAULT_TIMEOUT = 10.0
_OUT_OF_PROCESS = ("json_schema",)
_HEADER = 4  # bytes of a frame's length, big-endian


class BoundedGrader:
    """Grades answers as ``Grading.good`` does, each within ``timeout`` seconds; close it (or use it
    as a context manager) to end its worker."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self._worker: _Worker | None = None
        self._overrun: dict[
            str, str
        ] = {}  # a grader that ran past its bound: why it grades no more

    def good(self, grading: Grading, answer: str, probe: str) -> bool:
        """Whether ``answer`` of ``probe`` is good; ``GraderFailed`` when the grader raised,
        returned no bool, or took longer than the bound (then and for every later answer it would
        grade)."""
        key = _identity(grading)
        if key in self._overrun:
            raise GraderFailed(self._overrun[key])
        try:
            if grading.grade.startswith(PYTHON) or grading.grade in _OUT_OF_PROCESS:
                return self._in_worker(grading, answer, probe)
            return grading.good(answer, probe, timeout=self.timeout)
        except (_Overrun, TimeoutError):  # TimeoutError: the regex package's
            text = shown(content_of(answer))
            self._overrun[key] = (
                f"{grading.grade} not called: it took longer than {self.timeout:g} s "
                "(load.grade_timeout) on an earlier answer"
            )
            raise GraderFailed(
                f"{grading.grade} took longer than {self.timeout:g} s (load.grade_timeout) on the "
                f"answer {text}"
            ) from None

    def _in_worker(self, grading: Grading, answer: str, probe: str) -> bool:
        if self._worker is None:
            self._worker = _Worker()
        worker = self._worker
        try:
            reply = worker.call(grading, answer, probe, time.monotonic() + self.timeout)
        except _Overrun:
            self.close()
            raise
        except _Ended as ended:
            self.close()
            raise GraderFailed(
                f"{grading.grade} ended the grading process ({ended}) on the answer "
                f"{shown(content_of(answer))}"
            ) from None
        except BaseException:  # a signal cut the call short: the worker is mid-answer, never reused
            self.close()
            raise
        if "failed" in reply:
            raise GraderFailed(reply["failed"])
        return bool(reply["good"])

    def close(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def __enter__(self) -> BoundedGrader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# msgspec, not orjson: an expected integer beyond 64 bits (inputs.numbers keeps it exact) must reach
# the worker as that integer; keys sorted so one grader's form is one key.
_encode = msgspec.json.Encoder(order="sorted").encode


def _identity(grading: Grading) -> str:
    """What a grader is, for "it ran past its bound": a python grader by its function (whatever it
    is given), the others by their expected value too (one regex looping says nothing of
    another)."""
    if grading.grade.startswith(PYTHON):
        return grading.grade
    return grading.grade + "\0" + _encode(grading.to_json()).decode()


class _Overrun(Exception):
    """The answer took longer than the bound."""


class _Ended(Exception):
    """The worker process ended (the grader called os._exit, or crashed it)."""


class _Worker:
    """One grading process: frames of JSON through its stdin and a private copy of its stdout."""

    def __init__(self) -> None:
        bootstrap = (
            f"import sys; sys.path[:] = {sys.path!r}; "
            "from kevload.inputs.gradeworker import serve; serve()"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.loaded: dict[str, int] = {}  # a grader's run.json form: its number in the worker

    def call(self, grading: Grading, answer: str, probe: str, deadline: float) -> dict[str, Any]:
        doc = grading.to_json()
        key = _encode(doc).decode()
        message: dict[str, Any] = {"answer": answer, "probe": probe}
        if key in self.loaded:
            message["grader"] = self.loaded[key]
        else:
            message["grader"] = self.loaded[key] = len(self.loaded)
            message["doc"] = doc
        self._send(message)
        return self._receive(deadline)

    def _send(self, message: dict[str, Any]) -> None:
        body = _encode(message)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(len(body).to_bytes(_HEADER, "big") + body)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise _Ended(self._ended()) from None

    def _receive(self, deadline: float) -> dict[str, Any]:
        size = int.from_bytes(self._read(_HEADER, deadline), "big")
        reply: dict[str, Any] = msgspec.json.decode(self._read(size, deadline))
        return reply

    def _read(self, size: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd, data = self.proc.stdout.fileno(), b""
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Overrun
            chunk = os.read(fd, size - len(data))
            if not chunk:
                raise _Ended(self._ended())
            data += chunk
        return data

    def _ended(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1.0)
        code = self.proc.returncode
        return "still running" if code is None else f"exit code {code}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                assert pipe is not None
                pipe.close()


def serve() -> None:
    """The worker's loop: read a frame, grade, answer, until stdin ends. The user's code sees no
    stdin and prints to stderr: the frames have their own descriptors. Signals are the parent's to
    act on (a terminal's Ctrl-C reaches the whole group); the worker dies with its parent on
    Linux."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    _die_with_parent()
    frames_in = os.fdopen(os.dup(0), "rb")
    frames_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    graders: dict[int, Grading] = {}
    for message in _frames(frames_in):
        reply = _graded(message, graders)
        body = _encode(reply)
        frames_out.write(len(body).to_bytes(_HEADER, "big") + body)
        frames_out.flush()


def _frames(stream: Any) -> Iterator[dict[str, Any]]:
    while len(header := stream.read(_HEADER)) == _HEADER:
        message: dict[str, Any] = msgspec.json.decode(stream.read(int.from_bytes(header, "big")))
        yield message


def _graded(message: dict[str, Any], graders: dict[int, Grading]) -> dict[str, Any]:
    """One answer graded: ``{"good": bool}`` or ``{"failed": why}``, whatever the grader does."""
    from pathlib import Path

    try:
        if "doc" in message:
            graders[message["grader"]] = Grading.from_json(message["doc"], Path.cwd())
        return {"good": graders[message["grader"]].good(message["answer"], message["probe"])}
    except GraderFailed as failed:
        return {"failed": str(failed)}
    except BaseException as exc:  # noqa: BLE001 (the user's code, in a process of its own)
        return {"failed": f"grading raised {type(exc).__name__}: {exc}"}


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when kevload's ends, even by SIGKILL (a looping grader
    left behind would spin forever). Elsewhere the parent's ``close`` does it."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
