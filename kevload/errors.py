"""kevload's own errors, one tree: what the user gave is wrong (``InputError``, exit 2) or the
target failed (``TargetError``, exit 3). The CLI turns any ``KevloadError`` into ``kevload: error:
<message>`` and its ``exit_code`` in one place (``cli.main``); nothing below the CLI prints or
exits.

A new kind of error subclasses the branch whose exit code it needs; its message names the file, key
or option and what was expected, on one line (a target error may add the end of the server's log
under it).
"""

from __future__ import annotations

from kevload.exits import ExitCode


class KevloadError(Exception):
    """An error kevload reports as one message and an exit code, never as a traceback."""

    exit_code = ExitCode.DRIFT


class InputError(KevloadError, ValueError):
    """What the user gave is not what kevload expects: scenario, case files, coverage input, grid,
    messages, options, a run directory, a target it cannot provision."""

    exit_code = ExitCode.USAGE


class TargetError(KevloadError, RuntimeError):
    """The server under test failed: it did not start, or did not answer as a server must."""

    exit_code = ExitCode.TARGET


class ScenarioError(InputError):
    """A scenario (file or --set override) or other input file is not what kevload expects; the text
    says where and why."""


class RunDirError(InputError):
    """A path given as a run directory does not hold a kevload run."""


class ProvisionError(InputError):
    """A built-in target could not be built or installed; the message says which step failed."""


class ServerError(TargetError):
    """The server did not come up; the message carries the end of its log."""


class SummaryError(KevloadError):
    """A run's records are on disk but no summary could be made of them: its verdict is unknown, so
    exit 3 as for ``inconclusive`` (never 1, which says nondeterminism was found). ``run.json``
    holds the run's end state anyway."""

    exit_code = ExitCode.TARGET


class ClusterError(KevloadError):
    """A run lost a worker (its process was killed, a Ray actor or its node died): its evidence is
    short, so exit 3 as for ``inconclusive``; the records collected before stay in the run
    directory."""

    exit_code = ExitCode.TARGET
