"""The diagnosis as a person reads it (``kevload diagnose``): each step's evidence, the findings,
the verdict and what to try next."""

from __future__ import annotations

from typing import Any

from kevload.outputs.celltext import counts_text


def diagnosis_text(diagnosis: dict[str, Any]) -> str:
    """The diagnosis as a person reads it: each step's evidence, the findings, the verdict and what
    to try next."""
    lines = []
    for step in diagnosis["steps"]:
        if "distinct" not in step:
            lines.append(
                f"  {step['title']}: {'outside' if step.get('outside') else 'inside'} "
                f"({'; '.join(step.get('reasons', [])) or 'no boundary signs'})"
            )
            continue
        bound = (
            f", drift < {step['drift_rate_upper_95']:.0%} (95%)"
            if step.get("drift_rate_upper_95")
            else ""
        )
        errors = f", errors {counts_text(step['errors'])}" if step["errors"] else ""
        drift = f", drift at {', '.join(step['drift_cells'])}" if step["drift_cells"] else ""
        # One output that drifts is one output other than serial's, as the matrix says it.
        one_other = step["distinct"] == 1 and step["drift_cells"]
        distinct = "1, all ≠ serial" if one_other else f"{step['distinct']} distinct"
        gaps = "".join(f"; {gap}" for gap in step.get("logprob_gaps", ()))
        graded = (
            ""
            if step.get("graded_good") is None
            else (
                f", graded {step['graded_good']} good, {step['graded_bad']} bad"
                + (
                    f" ({step['flips_good_to_bad']} good→bad against serial)"
                    if step.get("flips_good_to_bad")
                    else ""
                )
            )
        )
        lines.append(
            f"  {step['title']}: {distinct}{graded}, n={step['ok']}{bound}{errors}{drift}{gaps}"
        )
    findings = ", ".join(f"{k}={_tri(v)}" for k, v in diagnosis["findings"].items())
    dropped = diagnosis.get("dropped_fields") or []
    lines.append(f"  findings: {findings}")
    if dropped:
        lines.append(f"  fields the server rejected (dropped): {', '.join(dropped)}")
    lines.extend(f"  note: {note}" for note in diagnosis.get("notes", []))
    lines.append(f"verdict: {diagnosis['verdict']} — {diagnosis['reason']}")
    if diagnosis["verdict"] == "stable":
        lines.append(
            "evidence: "
            f"{_EVIDENCE.get(diagnosis.get('evidence', 'text'), diagnosis.get('evidence'))}"
        )
    for cause in diagnosis.get("causes", [])[1:]:
        lines.append(f"also found: {cause['verdict']} — {cause['reason']}")
    lines.append(f"next: {diagnosis['next']}")
    return "\n".join(lines)


# What a stable verdict rests on, in words.
_EVIDENCE = {
    "text": "output text compared (hashes), not logprobs",
    "logprobs_bitwise": "per-token logprobs bitwise equal, as well as the text",
}


def _tri(value: Any) -> str:
    return {True: "yes", False: "no", None: "unknown"}.get(value, str(value))
