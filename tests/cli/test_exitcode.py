"""Each command's result maps to its exit code in one place (``kevload.outputs.exitcode``)."""

from __future__ import annotations

from kevload import exits
from kevload.exits import ExitCode
from kevload.outputs import exitcode
from kevload.records.summary import RunSummary


def test_a_run_fails_on_latent_drift_only_when_asked_and_a_baseline_decides_by_its_regressions():
    latent = RunSummary(verdict="deterministic", latent_cells=("p1@single/c=4",))
    assert exitcode.for_run(latent) == ExitCode.OK
    assert exitcode.for_run(latent, fail_on="latent") == ExitCode.DRIFT
    assert exitcode.for_run(RunSummary(verdict="nondeterministic"), regressions=0) == ExitCode.OK
    assert exitcode.for_run(RunSummary(verdict="target_failed"), regressions=0) == ExitCode.TARGET
    assert (
        exitcode.for_run(RunSummary(verdict="deterministic", slo_failed_cells=("p1@single/c=4",)))
        == ExitCode.DRIFT
    )


def test_sweeps_and_reruns_take_the_worst_setting_or_case():
    assert (
        exitcode.for_sweep(["deterministic", "nondeterministic", "inconclusive"]) == ExitCode.TARGET
    )
    assert exitcode.for_sweep(["deterministic", "nondeterministic"]) == ExitCode.DRIFT
    # A setting the sweep never ran is no evidence: the sweep cannot pass without it.
    assert exitcode.for_sweep(["deterministic", "not_run"]) == ExitCode.TARGET
    assert exitcode.for_sweep(["deterministic", "deterministic"]) == ExitCode.OK
    moves = {"no answer": [], "changed": ["c1"], "stable→unstable": []}
    assert exitcode.for_rerun(moves, mismatched=[], accepted=False) == ExitCode.DRIFT
    assert exitcode.for_rerun(moves, mismatched=[], accepted=True) == ExitCode.OK


def test_a_sweep_against_its_reference_fails_as_its_rows_would():
    held = ["deterministic", "deterministic"]
    assert exitcode.for_sweep(held, ExitCode.OK) == ExitCode.OK
    assert exitcode.for_sweep(held, ExitCode.DRIFT) == ExitCode.DRIFT  # a setting worse
    assert exitcode.for_sweep(held, ExitCode.TARGET) == ExitCode.TARGET  # a paired run short
    # A failed setting is evidence short whatever the comparison of the others found.
    assert exitcode.for_sweep(["deterministic", "target_failed"], ExitCode.DRIFT) == ExitCode.TARGET


def test_an_inconclusive_diagnosis_is_evidence_short_not_drift():
    assert exitcode.for_diagnosis(target_failed=False, verdict="inconclusive") == ExitCode.TARGET
    assert exitcode.for_diagnosis(target_failed=True, verdict="inconclusive") == ExitCode.TARGET
    assert exitcode.for_diagnosis(target_failed=False, verdict="crosstalk") == ExitCode.DRIFT
    assert exitcode.for_diagnosis(target_failed=False, verdict="stable") == ExitCode.OK


def test_runs_exit_codes_are_one_set_of_words_in_help_readme_and_nightly_docs():
    import importlib.util
    import re
    from pathlib import Path

    from tests.conftest import run_cli

    root = Path(__file__).resolve().parents[2]
    table = dict(
        re.findall(r"^\| `(\d)` \| (.+) \|$", (root / "README.md").read_text(), re.MULTILINE)
    )
    assert table == {str(int(code)): words for code, words in exits.RUN_EXITS.items()}
    help_text = " ".join(run_cli("run", "--help")[1].split())
    for code, words in exits.RUN_EXITS.items():
        assert f"Exit {int(code)}: {words.replace('`', '')}." in help_text
    # docs/nightly.md's list is rendered from the same words when the site builds.
    spec = importlib.util.spec_from_file_location("hooks", root / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    nightly = hooks.on_page_markdown((root / "docs" / "nightly.md").read_text())
    assert "- `1`: " + exits.RUN_EXITS[ExitCode.DRIFT] in nightly
    assert hooks.RUN_EXITS_MARKER not in nightly
