"""`pip install -e .` (make install) prints nothing under --quiet: setuptools' meta path finder, its
strategy for a top-level package whose layout it must guess, announces itself with a warning that
pip shows as a BuildBackendWarning block even under --quiet. setup.cfg's package_dir says the
layout, and the editable install is a plain .pth file, which says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_editable_install_takes_the_quiet_pth_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    editable = pytest.importorskip("setuptools.command.editable_wheel")
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    dist = Distribution()
    dist.parse_config_files([str(ROOT / "setup.cfg")])
    command = editable.editable_wheel(dist)
    command.ensure_finalized()
    strategy = command._select_strategy("kevload", "py3-none-any", "build/lib")
    assert type(strategy).__name__ == "_StaticPth"
    assert [p.resolve() for p in strategy.path_entries] == [ROOT]
