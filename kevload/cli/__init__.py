"""The command line, one module per command: this package only registers them on ``main`` (the
console script ``kevload`` and ``python -m kevload``). Each command parses, calls, prints and exits
with the code ``exitcode`` gives; the rules of what its options mean together live in the package
whose rules they are."""

from __future__ import annotations

from kevload.cli import cases, compare, coverage, demo, diagnose, report, run, sweep, target
from kevload.cli.group import main

# In the order `kevload --help` lists them (click sorts them by name).
for _command in (
    run.run,
    report.report,
    target.target,
    demo.demo,
    diagnose.diagnose_command,
    coverage.coverage_command,
    cases.cases,
    sweep.sweep_command,
    compare.compare_command,
):
    main.add_command(_command)

__all__ = ["main"]
