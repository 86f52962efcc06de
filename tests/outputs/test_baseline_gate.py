"""The --baseline gate against one small reference rule, over pairs of baseline and current
summaries: cells added, removed, changed, failed, their inputs changed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kevload.outputs.baseline import judge
from kevload.records.summary import CellSummary, RunSummary

PROBES = ("p1", "p2")
LEVELS = (1, 4)
KEYS = [(p, c) for p in PROBES for c in LEVELS]
# A cell as the baseline saw it, and as this run sees it (outputs by hash: h0 the usual one).
BASELINE_STATES = ("absent", "failed", "held", "held_other", "drifted")
CURRENT_STATES = ("absent", "held", "held_other", "drifted", "drifted_unseen")
OUTPUTS = {
    "failed": (),
    "held": ("h0",),
    "held_other": ("h1",),
    "drifted": ("h0", "h1"),
    "drifted_unseen": ("h0", "h2"),
}


def cell(probe: str, level: int, state: str) -> CellSummary:
    outputs = OUTPUTS[state]
    return CellSummary(
        probe=probe,
        role="probe",
        mode="single",
        concurrency=level,
        ok=len(outputs) and 4,
        errors={"http_500": 4} if state == "failed" else {},
        distinct=len(outputs),
        drift=len(outputs) > 1,
        output_hashes=outputs,
        latency={"e2e": {"p50": 0.1}},
    )


def summary(states: dict, inputs: dict[str, str], verdict: str | None = None) -> RunSummary:
    cells = tuple(cell(p, c, s) for (p, c), s in states.items() if s != "absent")
    return RunSummary(
        verdict=verdict or ("nondeterministic" if any(c.drift for c in cells) else "deterministic"),
        cells=cells,
        inputs={p: {"input": inputs[p], "params": "x", "max_tokens": 16} for p in PROBES},
    )


def reference(before: dict, after: dict, inputs_before: dict, inputs_after: dict) -> set[str]:
    """The rule, as docs/nightly.md states it: the cells that are regressions."""
    regressed = set()
    for (probe, level), now in after.items():
        then = before[(probe, level)]
        name = f"{probe}@single/c={level}"
        if now == "absent":
            if then != "absent":
                regressed.add(name)  # missing_cell
            continue
        drifts = len(OUTPUTS[now]) > 1
        if then in ("absent", "failed") or inputs_before[probe] != inputs_after[probe]:
            if drifts:  # nothing to hold it against: the run's own rule
                regressed.add(name)
            continue
        seen = {
            h
            for (p, _), s in before.items()
            if p == probe
            for h in OUTPUTS[s if s != "absent" else "failed"]
        }
        known_drift = drifts and len(OUTPUTS[then]) > 1
        if (drifts and len(OUTPUTS[then]) == 1) or (set(OUTPUTS[now]) - seen and not known_drift):
            regressed.add(name)
    return regressed


states = st.fixed_dictionaries
inputs = st.fixed_dictionaries({p: st.sampled_from(("a", "b")) for p in PROBES})


@settings(max_examples=300, deadline=None)
@given(
    before=states({k: st.sampled_from(BASELINE_STATES) for k in KEYS}),
    after=states({k: st.sampled_from(CURRENT_STATES) for k in KEYS}),
    inputs_before=inputs,
    inputs_after=inputs,
    failed=st.booleans(),
)
def test_the_baseline_gate_follows_its_rule(before, after, inputs_before, inputs_after, failed):
    baseline = summary(
        before, inputs_before, "inconclusive" if "failed" in before.values() else None
    )
    current = summary(after, inputs_after, "target_failed" if failed else None)
    lines, code = judge(current, baseline, name="b")
    if failed:  # a run whose target failed is compared with nothing
        assert (lines, code) == ([], 3)
        return
    regressed = reference(before, after, inputs_before, inputs_after)
    assert code == (1 if regressed else 0), lines
    said = {line.split(" ")[2].rstrip(":") for line in lines if line.startswith("REGRESSION ")}
    assert said == regressed, lines
    assert (
        lines[-1] == "against baseline b: "
        f"{sum(line.startswith('REGRESSION ') for line in lines)} regression(s)"
    )
    # Every cell with nothing in the baseline to hold it against is said, drifting or not, and named
    # for why.
    for (probe, level), now in after.items():
        name = f"{probe}@single/c={level}"
        if now != "absent" and before[(probe, level)] == "absent":
            assert any(f"new_cell {name}: new cell" in line for line in lines), lines
        elif now != "absent" and inputs_before[probe] != inputs_after[probe]:
            assert any(
                f"input_changed {name}: input changed: the prompt or messages" in line
                for line in lines
            )
        elif now != "absent" and before[(probe, level)] == "failed" and len(OUTPUTS[now]) > 1:
            assert any(
                f"{name}: " in line and "the baseline had no ok sample here" in line
                for line in lines
            )
    assert not any(
        "the model or server changed" in line
        for line in lines
        if line.split(" ")[1] in ("new_cell", "input_changed")
    ), lines
    assert not any(" in 0" in line for line in lines), lines
