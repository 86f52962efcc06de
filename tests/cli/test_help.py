"""Every command's --help reads as written: click prints help text verbatim, so a `%%` would show as
two."""

from __future__ import annotations

import click

from kevload.cli import main
from tests.conftest import run_cli


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        found += (
            _commands(command, (*path, name))
            if isinstance(command, click.Group)
            else [(*path, name)]
        )
    return found


def test_every_help_text_shows_percent_signs_once():
    commands = _commands(main)
    assert ("run",) in commands and ("diagnose",) in commands
    for path in commands:
        code, output = run_cli(*path, "--help")
        assert code == 0 and "Usage:" in output, (path, output)
        assert "%%" not in output, (path, output)
    for path in (("run",), ("diagnose",)):
        text = " ".join(run_cli(*path, "--help")[1].split())
        assert "the 95% bound on" in text and "(5% or 0.05" in text, text
