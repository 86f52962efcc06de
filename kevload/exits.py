"""The exit codes CI depends on: the one ``ExitCode`` enum, and what each code of ``kevload run``
means in words. A leaf beside the errors (each error carries its code); which code a command's
result gets is ``outputs.exitcode``'s."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # everything held
    DRIFT = 1  # nondeterminism found, a regression against a baseline, a level under its SLO
    USAGE = 2  # bad usage or a bad scenario (errors.InputError)
    TARGET = 3  # the target failed, or gave too little evidence to say (inconclusive)
    INTERRUPTED = 130  # SIGINT, once what was collected is written
    TERMINATED = 143  # SIGTERM, likewise


# What each code of `kevload run` means, in the one set of words `run --help`, the README's gate
# table and docs/nightly.md give (the first two held equal to it by a test, the third rendered from
# it).
RUN_EXITS: Mapping[ExitCode, str] = {
    ExitCode.OK: "everything held: one output everywhere (against a `--baseline`: nothing "
    "regressed)",
    ExitCode.DRIFT: "nondeterminism, or a regression against `--baseline`, latent drift with "
    "`--fail-on latent`, a cell under `load.min_slo_attainment` or `load.min_good_share`; with "
    "`--fail-on bad` only an answer load made worse",
    ExitCode.USAGE: "bad usage or bad input: one line naming the file, key or option and what was "
    "expected",
    ExitCode.TARGET: "the target failed or the evidence is short (`inconclusive`)",
}
