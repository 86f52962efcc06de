"""Records files read into a ``Reduction``: in this process for a small file, split at line
boundaries and read by spawned processes for a large one, whose parts merge."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path

from kevload.compare.cells import Reduction
from kevload.errors import RunDirError
from kevload.inputs.scenariokeys import Slo
from kevload.records.store import Record, read_typed

# Below this a records file is read in-process: starting processes costs more than it saves.
_PARALLEL_BYTES = 32 << 20
# How long a reduction's process may take to exit once its part is in, before it is killed.
_EXIT_S = 5.0
# A part of a file for one process: path, first byte, end (None: the file's end), the run's SLO,
# whether it cut.
_Range = tuple[str, int, int | None, Slo | None, bool]


def reduce_file(
    path: Path, workers: int | None = None, *, slo: Slo | None = None, cuts_asked: bool = False
) -> Reduction:
    """Reduce a records file; large files are split at line boundaries and read by parallel
    processes. ``cuts_asked``: the run asked for cancellations (``Reduction.cuts_asked``)."""
    workers = workers or os.cpu_count() or 1
    size = path.stat().st_size
    if workers < 2 or size < _PARALLEL_BYTES:
        return reduce_records(read_typed(path), slo=slo, cuts_asked=cuts_asked)
    cuts = _line_cuts(path, size, workers)
    # The last part reads to the file's end, as the sequential reader does: only there may a line be
    # torn.
    ranges = [
        (str(path), start, None if end == size else end, slo, cuts_asked)
        for start, end in zip(cuts, cuts[1:], strict=False)
    ]
    parts = _reduce_ranges(ranges)
    total = parts[0]
    for part in parts[1:]:
        total.merge(part)
    return total


def reduce_records(
    records: Iterable[Record], *, slo: Slo | None = None, cuts_asked: bool = False
) -> Reduction:
    """Records as read typed (``store.read_typed``), spelled logprobs kept spelled, folded into a
    ``Reduction``."""
    reduction = Reduction(slo=slo, cuts_asked=cuts_asked)
    for record in records:
        reduction.add(record)
    return reduction


def _line_cuts(path: Path, size: int, parts: int) -> list[int]:
    """Byte offsets that split the file into ``parts`` pieces, each starting at a line."""
    cuts = [0]
    with path.open("rb") as handle:
        for i in range(1, parts):
            handle.seek(size * i // parts)
            handle.readline()
            position = handle.tell()
            if cuts[-1] < position < size:
                cuts.append(position)
    return cuts + [size]


def _reduce_ranges(ranges: list[_Range]) -> list[Reduction]:
    """Each range reduced in a process of its own, in order; a range whose process died is reduced
    here.

    Spawned, never forked: this runs inside the run's event loop, and a fork would inherit its
    signal handling (a caught SIGTERM, so terminating the child does nothing) and the locks its
    threads hold. Every wait is bounded: a part arrives or its process's end closes the pipe, and
    each process is joined with a timeout, then killed.
    """
    context = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for args in ranges:
            receive, send = context.Pipe(duplex=False)
            proc = context.Process(
                target=_range_main, args=(send, args), name="kevload-reduce", daemon=True
            )
            proc.start()
            # the child holds the only write end: its end, however it comes, is an EOF here
            send.close()
            pipes.append(receive)
            procs.append(proc)
        answers: dict[int, tuple[Reduction | None, RunDirError | None] | None] = {}
        while len(answers) < len(pipes):
            for pipe in multiprocessing.connection.wait(
                [p for i, p in enumerate(pipes) if i not in answers]
            ):
                assert isinstance(pipe, Connection)  # wait gives back the pipes it was given
                index = pipes.index(pipe)
                try:
                    answers[index] = pipe.recv()
                except EOFError:
                    # the process died before its part was in (OOM killer, kill -9)
                    answers[index] = None
    except BaseException:  # a second Ctrl-C, say: nobody waits for the parts any more
        for proc in procs:
            proc.kill()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=_EXIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for pipe in pipes:
            pipe.close()
    parts = []
    for index, args in enumerate(ranges):
        answer = answers[index]
        if answer is None:
            parts.append(_reduce_range(*args))
            continue
        part, error = answer
        if error is not None:
            raise error
        assert part is not None  # a part or its error
        parts.append(part)
    return parts


def _range_main(pipe: multiprocessing.connection.Connection, args: _Range) -> None:
    # The run's process owns stops: a Ctrl-C or SIGTERM to the process group must not end a part of
    # its summary.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        pipe.send((_reduce_range(*args), None))
    except RunDirError as exc:
        pipe.send((None, exc))


def _reduce_range(
    path: str, start: int, end: int | None, slo: Slo | None, cuts_asked: bool
) -> Reduction:
    return reduce_records(read_typed(Path(path), start, end), slo=slo, cuts_asked=cuts_asked)
