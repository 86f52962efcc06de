"""diagnose's decision tree and findings as pure functions of measured step results: no server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kevload.guide.decision import decide, findings, samples_needed
from kevload.guide.evidence import (
    DataResult,
    Evidence,
    StepResult,
    cold_warm_counts,
    differing_calls,
)

SEED_SENTENCE = "Fixing the seed will not help on this server"


def step(key: str, distinct: int = 1, ok: int = 6, **kw) -> StepResult:
    kw.setdefault("samples", max(ok, 1))
    return StepResult(
        key=key,
        title=key,
        params=kw.pop("params", {}),
        levels=kw.pop("levels", (1,)),
        ok=ok,
        distinct=distinct,
        **kw,
    )


# A server with no problem at all: every step measured, one output wherever randomness is fixed.
CLEAN = {
    "baseline": step("baseline", distinct_after_first=1, differing_calls=()),
    "fixed": step("fixed"),
    "greedy": step("greedy", ok=3),
    "seed_repeat": step("seed_repeat", ok=3, different_seeds_distinct=3),
    "temperature": step("temperature", distinct=3, ok=3, params={"temperature": 0.8}),
    "cache": step("cache", ok=4, compared_rounds=3, cold_differs_rounds=0, warm_unstable_rounds=0),
    "concurrency_single": step("concurrency_single", levels=(1, 2, 4)),
    "concurrency_mixed": step("concurrency_mixed", levels=(1, 2, 4), mode="mixed"),
}
SAMPLING = step("baseline", distinct=6, distinct_after_first=5)
DRIFTING_FIXED = step("fixed", distinct=3)
COLD_DIFFERS = step("cache", ok=4, compared_rounds=3, cold_differs_rounds=3, warm_unstable_rounds=0)
CROSSTALK = step(
    "concurrency_single", levels=(1, 2, 4), distinct=2, drift_cells=("probe@single/c=4",)
)
OUTSIDE = DataResult({"outside": True, "reasons": ["length 3 below the training minimum 30"]})
INSIDE = DataResult({"outside": False, "reasons": []})


def evidence(
    *,
    drop: tuple[str, ...] = (),
    dropped_fields: tuple[str, ...] = (),
    data: DataResult | None = None,
    **steps: StepResult,
) -> Evidence:
    """CLEAN with some steps replaced (keyword = step key) or left out (``drop``), in the order
    measured."""
    merged = {**CLEAN, **steps}
    return Evidence(
        steps=tuple(s for k, s in merged.items() if k not in drop),
        dropped_fields=dropped_fields,
        data=data,
    )


UP_TO_RANDOMNESS = (
    "cache",
    "concurrency_single",
    "concurrency_mixed",
)  # where the diagnoser asks first


@pytest.mark.parametrize(
    ("name", "measured", "verdict", "causes"),
    [
        ("stable", evidence(), "stable", []),
        ("stable with data inside", evidence(data=INSIDE), "stable", []),
        ("sampling", evidence(baseline=SAMPLING, drop=UP_TO_RANDOMNESS), "sampling", ["sampling"]),
        (
            "first call only differs: not sampling",
            evidence(
                baseline=step("baseline", distinct=2, distinct_after_first=1), cache=COLD_DIFFERS
            ),
            "cache",
            ["cache"],
        ),
        ("cache, fixed serial stable", evidence(cache=COLD_DIFFERS), "cache", ["cache"]),
        (
            "cache, fixed serial drifts",
            evidence(fixed=DRIFTING_FIXED, cache=COLD_DIFFERS),
            "cache",
            ["cache"],
        ),
        (
            "server nondeterministic",
            evidence(fixed=DRIFTING_FIXED),
            "server_nondeterministic",
            ["server_nondeterministic"],
        ),
        ("crosstalk", evidence(concurrency_single=CROSSTALK), "crosstalk", ["crosstalk"]),
        (
            "crosstalk in mixed batches",
            evidence(concurrency_mixed=replace(CROSSTALK, key="concurrency_mixed")),
            "crosstalk",
            ["crosstalk"],
        ),
        ("data", evidence(data=OUTSIDE), "data", ["data"]),
        (
            "data only when the config layer is clean",
            evidence(concurrency_single=CROSSTALK, data=OUTSIDE),
            "crosstalk",
            ["crosstalk"],
        ),
        (
            "a serially drifting server is no crosstalk",
            evidence(fixed=DRIFTING_FIXED, concurrency_single=CROSSTALK),
            "server_nondeterministic",
            ["server_nondeterministic"],
        ),
    ],
)
def test_verdicts(name, measured, verdict, causes):
    for run_all in (False, True):
        d = decide(measured, run_all)
        assert d.verdict == verdict, name
        assert [c["verdict"] for c in d.causes] == causes, name
        assert d.done == (bool(causes) and not run_all), name
        assert d.next_step and d.reason


def test_every_verdict_is_reachable_and_documented():
    from kevload.guide.decision import VERDICTS

    reached = {
        decide(e).verdict
        for e in (
            evidence(),
            evidence(baseline=SAMPLING),
            evidence(concurrency_single=CROSSTALK),
            evidence(cache=COLD_DIFFERS),
            evidence(fixed=DRIFTING_FIXED),
            evidence(data=OUTSIDE),
            evidence(baseline=step("baseline", ok=1)),
        )
    }
    assert reached == set(VERDICTS)


def test_run_all_lists_every_cause_in_the_guides_order():
    measured = evidence(
        baseline=SAMPLING, cache=COLD_DIFFERS, concurrency_single=CROSSTALK, data=OUTSIDE
    )
    d = decide(measured, run_all=True)
    assert [c["verdict"] for c in d.causes] == ["sampling", "cache", "crosstalk"]
    assert d.verdict == "sampling" and not d.done
    # Without --all the first cause stops the measuring, right after the randomness steps.
    early = decide(evidence(baseline=SAMPLING, drop=UP_TO_RANDOMNESS), run_all=False)
    assert early.verdict == "sampling" and early.done
    assert decide(evidence(baseline=SAMPLING, drop=UP_TO_RANDOMNESS), run_all=True).done is False


def test_fixed_serial_drift_waits_for_the_cache_step():
    # Only the cold/warm comparison tells a cache from a nondeterministic server: no verdict before
    # it.
    d = decide(evidence(fixed=DRIFTING_FIXED, drop=UP_TO_RANDOMNESS))
    assert d.verdict == "inconclusive" and not d.done and "cache" in d.reason
    assert (
        decide(evidence(fixed=DRIFTING_FIXED, drop=UP_TO_RANDOMNESS[1:])).verdict
        == "server_nondeterministic"
    )
    assert (
        decide(
            evidence(fixed=DRIFTING_FIXED, cache=COLD_DIFFERS, drop=UP_TO_RANDOMNESS[1:])
        ).verdict
        == "cache"
    )


def test_no_stable_verdict_before_every_config_step_ran():
    d = decide(evidence(drop=("concurrency_mixed",)))
    assert d.verdict == "inconclusive" and "concurrency_mixed" in d.reason and not d.done


@pytest.mark.parametrize(
    ("weak", "reason", "next_step"),
    [
        (
            step("baseline", ok=2, samples=6, errors={"timeout": 4}),
            "2 ok of 6 in step baseline",
            "raise --samples to 9 (3 more per step) or fix the errors (timeout: 4)",
        ),
        (
            step("fixed", ok=1, samples=2, errors={"http_500": 1}),
            "1 ok of 2 in step fixed",
            "raise --samples to 6 (4 more per step)",
        ),
        (
            step("baseline", ok=0, samples=6, errors={"http_500": 6}),
            "0 ok of 6",
            "no call succeeded",
        ),
    ],
)
def test_inconclusive_says_how_many_more_samples(weak, reason, next_step):
    for run_all in (False, True):
        d = decide(evidence(**{weak.key: weak}), run_all)
        assert d.verdict == "inconclusive" and d.done and not d.causes
        assert reason in d.reason and next_step in d.next_step
        assert SEED_SENTENCE not in d.next_step


def test_target_failed_in_any_step_is_inconclusive():
    failed = step(
        "concurrency_mixed", ok=4, target_failed=True, errors={"http_503": 2}, mode="mixed"
    )
    d = decide(evidence(concurrency_single=CROSSTALK, concurrency_mixed=failed), run_all=True)
    assert d.verdict == "inconclusive" and d.target_failed and d.done
    assert "concurrency_mixed" in d.reason and "http_503: 2" in d.next_step


@pytest.mark.parametrize(
    ("ok", "samples", "needed"), [(6, 6, 6), (2, 6, 9), (1, 2, 6), (5, 6, 6), (0, 6, None)]
)
def test_samples_needed(ok, samples, needed):
    assert samples_needed(ok, samples) == needed


# --- findings ---


@pytest.mark.parametrize(
    ("changes", "name", "value"),
    [
        ({}, "greedy_at_temperature_0", True),
        ({"greedy": step("greedy", distinct=2, ok=3)}, "greedy_at_temperature_0", False),
        ({"greedy": step("greedy", ok=1)}, "greedy_at_temperature_0", None),
        ({"drop": ("greedy",)}, "greedy_at_temperature_0", None),
        ({}, "temperature_honoured", True),
        ({"temperature": step("temperature", ok=3)}, "temperature_honoured", False),
        ({"temperature": step("temperature", distinct=1, ok=1)}, "temperature_honoured", None),
        ({}, "seed_honoured", True),
        ({"dropped_fields": ("seed",), "drop": ("seed_repeat",)}, "seed_honoured", False),
        ({"seed_repeat": step("seed_repeat", distinct=3, ok=3)}, "seed_honoured", False),
        (
            {"seed_repeat": step("seed_repeat", ok=3, different_seeds_distinct=1)},
            "seed_honoured",
            None,
        ),
        ({"seed_repeat": step("seed_repeat", ok=1)}, "seed_honoured", None),
        ({}, "cache_effect", False),
        ({"cache": COLD_DIFFERS}, "cache_effect", True),
        (
            {"cache": replace(COLD_DIFFERS, cold_differs_rounds=1, warm_unstable_rounds=2)},
            "cache_effect",
            False,
        ),
        (
            {"cache": replace(COLD_DIFFERS, compared_rounds=0, cold_differs_rounds=0)},
            "cache_effect",
            None,
        ),
        ({}, "cache_off_converges", None),
        ({"cache_off": replace(CLEAN["cache"], key="cache_off")}, "cache_off_converges", True),
        ({"cache_off": replace(COLD_DIFFERS, key="cache_off")}, "cache_off_converges", False),
    ],
)
def test_findings(changes, name, value):
    assert getattr(findings(evidence(**changes)), name) is value


def test_findings_json_keeps_its_keys_and_adds_cache_off_only_when_measured():
    assert list(findings(evidence()).to_json()) == [
        "seed_honoured",
        "greedy_at_temperature_0",
        "temperature_honoured",
        "cache_effect",
    ]
    measured = evidence(cache=COLD_DIFFERS, cache_off=replace(CLEAN["cache"], key="cache_off"))
    assert findings(measured).to_json()["cache_off_converges"] is True


# --- what the next step says about seeds, and the temperature note ---

SEED_NOT_HONOURED = step("seed_repeat", distinct=3, ok=3)
SEED_NO_EFFECT = step("seed_repeat", ok=3, different_seeds_distinct=1)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"seed_repeat": SEED_NOT_HONOURED}, "one seed repeated gave 3 outputs in 3 calls"),
        ({"dropped_fields": ("seed",), "drop": ("seed_repeat",)}, "it rejects the seed field"),
        ({"seed_repeat": SEED_NO_EFFECT}, "the seed has no visible effect"),
        (
            {"seed_repeat": step("seed_repeat", ok=1, errors={"timeout": 2})},
            "could not be measured",
        ),
    ],
)
def test_seed_will_not_help_when_not_honoured_or_unknown(changes, why):
    assert findings(evidence(**changes)).seed_honoured is not True
    for extra in ({}, {"baseline": SAMPLING}, {"concurrency_single": CROSSTALK}):
        d = decide(evidence(**changes, **extra))
        assert f"{SEED_SENTENCE}: " in d.next_step and why in d.next_step, d.verdict
    sampling = decide(evidence(**changes, baseline=SAMPLING))
    assert (
        sampling.next_step.startswith("set temperature 0.")
        and "fix the seed" not in sampling.next_step
    )


def test_seed_sentence_absent_when_seed_honoured_or_temperature_ignored():
    honoured = decide(evidence(baseline=SAMPLING))
    assert findings(evidence()).seed_honoured is True
    assert (
        SEED_SENTENCE not in honoured.next_step
        and "fix the seed (this server honours it)" in honoured.next_step
    )
    # Temperature ignored: nothing samples, so the seed question does not arise.
    ignored = decide(
        evidence(
            seed_repeat=SEED_NOT_HONOURED,
            temperature=step("temperature", ok=3, params={"temperature": 0.8}),
        )
    )
    assert SEED_SENTENCE not in ignored.next_step


def test_sampling_next_names_the_seed_only_where_it_is_honoured():
    assert "fix the seed (this server honours it)" in decide(evidence(baseline=SAMPLING)).next_step
    # Temperature not measured: whether a seed would help is left open, and said so.
    unknown = decide(
        evidence(baseline=SAMPLING, seed_repeat=SEED_NOT_HONOURED, drop=("temperature",))
    )
    assert (
        "fix the seed (and check it is honoured)" in unknown.next_step
        and SEED_SENTENCE not in unknown.next_step
    )


def test_sampling_next_when_temperature_zero_still_samples():
    d = decide(evidence(baseline=SAMPLING, greedy=step("greedy", distinct=2, ok=3)))
    assert "temperature 0 alone still samples" in d.next_step


def test_ignored_temperature_is_noted():
    d = decide(evidence(temperature=step("temperature", ok=3, params={"temperature": 0.8})))
    assert d.verdict == "stable" and d.findings.temperature_honoured is False
    assert len(d.notes) == 1 and "ignores temperature" in d.notes[0] and "0.8" in d.notes[0]
    assert "one output in 3 calls" in d.notes[0]
    assert decide(evidence()).notes == ()
    assert d.to_json()["notes"] == list(d.notes)


def test_stable_rests_on_text_for_now():
    d = decide(evidence())
    assert d.evidence == "text" and d.to_json()["evidence"] == "text"
    assert (
        "n=6 per cell" in d.reason and "--samples 299" in d.next_step and "293 more" in d.next_step
    )


def test_json_keeps_the_old_keys():
    doc = decide(evidence(data=INSIDE)).to_json()
    assert {
        "verdict",
        "reason",
        "next",
        "steps",
        "findings",
        "runs",
        "causes",
        "dropped_fields",
    } <= set(doc)
    assert [s["step"] for s in doc["steps"]] == [*CLEAN, "data"]
    baseline = doc["steps"][0]
    assert (
        baseline["drift_rate_upper_95"] == pytest.approx(0.3930, abs=1e-4)
        and baseline["differing_calls"] == []
    )
    steps = decide(evidence(concurrency_single=CROSSTALK)).to_json()["steps"]
    crosstalk = next(s for s in steps if s["step"] == "concurrency_single")
    assert crosstalk["drift"] is True and crosstalk["drift_rate_upper_95"] is None


# --- reductions of a step's records ---


def test_differing_calls():
    rows = [("p", 0, "a"), ("p", 1, "b"), ("p", 2, "b"), ("p", 3, "b")]
    assert differing_calls(rows) == ((0,), 1)
    assert differing_calls([("p", i, h) for i, h in enumerate("abcb")]) == ((0, 2), 2)
    assert differing_calls([]) == ((), 0)


@pytest.mark.parametrize(
    ("rows", "counts"),
    [
        ([("r1", 0, "c"), ("r1", 1, "w"), ("r1", 2, "w")], (1, 1, 0)),
        (
            [("r1", 0, "w"), ("r1", 1, "w"), ("r2", 0, "x"), ("r2", 1, "y"), ("r2", 2, "z")],
            (2, 0, 1),
        ),
        ([("r1", 0, "c")], (0, 0, 0)),  # one answer: nothing to compare
        (
            [("r1", 1, "w"), ("r1", 2, "v")],
            (0, 0, 0),
        ),  # the cold answer failed: the round says nothing
    ],
)
def test_cold_warm_counts(rows, counts):
    assert cold_warm_counts(rows) == counts


def test_text_output_says_what_a_stable_verdict_rests_on():
    from kevload.guide.diagnosistext import diagnosis_text

    doc = decide(evidence()).to_json()
    assert "evidence: output text compared (hashes), not logprobs" in diagnosis_text(doc)
    assert "evidence: per-token logprobs bitwise equal" in diagnosis_text(
        {**doc, "evidence": "logprobs_bitwise"}
    )
    assert "evidence:" not in diagnosis_text(
        decide(evidence(concurrency_single=CROSSTALK)).to_json()
    )


# --- per-token logprobs: what a stable verdict rests on, and latent crosstalk ---

BITWISE = {
    k: replace(CLEAN[k], logprob_bitwise=True)
    for k in ("fixed", "concurrency_single", "concurrency_mixed")
}


def latent(key: str, *cells: str) -> StepResult:
    return replace(CLEAN[key], logprob_bitwise=False, latent_cells=cells, latent_from=3)


@pytest.mark.parametrize(
    ("name", "steps", "crosstalk", "evidence_kind"),
    [
        ("no logprobs", {}, None, "text"),
        ("bitwise everywhere", BITWISE, False, "logprobs_bitwise"),
        (
            "bitwise but one step without logprobs",
            {**BITWISE, "concurrency_mixed": CLEAN["concurrency_mixed"]},
            False,
            "text",
        ),
        (
            "latent at c=4",
            {**BITWISE, "concurrency_single": latent("concurrency_single", "probe@single/c=4")},
            True,
            "text",
        ),
        (
            "latent at c=1 too: the serial logprobs wobble, no crosstalk",
            {
                **BITWISE,
                "concurrency_single": latent(
                    "concurrency_single", "probe@single/c=1", "probe@single/c=4"
                ),
            },
            False,
            "text",
        ),
        (
            "fixed serial step not bitwise: no crosstalk",
            {
                **BITWISE,
                "fixed": replace(CLEAN["fixed"], logprob_bitwise=False),
                "concurrency_mixed": latent("concurrency_mixed", "probe@mixed/c=2"),
            },
            False,
            "text",
        ),
    ],
)
def test_logprob_evidence_and_latent_crosstalk(name, steps, crosstalk, evidence_kind):
    d = decide(evidence(**steps))
    assert (
        d.verdict == "stable"
    )  # the text held: latent drift is a finding, never a verdict of its own
    assert d.findings.latent_crosstalk is crosstalk
    assert d.evidence == evidence_kind
    assert ("latent_crosstalk" in d.findings.to_json()) is (crosstalk is not None)
    notes = [n for n in d.notes if n.startswith("latent crosstalk")]
    if crosstalk:
        assert notes == [
            "latent crosstalk: under concurrency the text stays the serial one but the per-token "
            "logprobs differ (probe@single/c=4; from token 3 (0-based)) while serial logprobs "
            "agree — "
            "batching already changes the numerics, and a longer answer or another prompt can flip "
            "a "
            "token"
        ]
    else:
        assert notes == []


SERIALIZED = replace(
    CLEAN["concurrency_single"], serialized_cells=("probe@single/c=2", "probe@single/c=4")
)
SERIALIZED_TEXT = (
    "the server ran ≤ 1 request at a time at probe@single/c=2, probe@single/c=4 while the others "
    "waited in its queue (its /metrics): those levels were serialized by the server, not batched"
)


def test_a_level_the_server_serialized_is_said_in_the_stable_reason():
    d = decide(evidence(concurrency_single=SERIALIZED))
    assert d.verdict == "stable"
    assert d.reason.endswith("; " + SERIALIZED_TEXT)
    assert "raise the server's batch limit" in d.next_step
    assert SERIALIZED_TEXT not in d.notes  # said once, in the reason
    assert d.steps[list(CLEAN).index("concurrency_single")].to_json()["serialized_cells"] == list(
        SERIALIZED.serialized_cells
    )
    assert (
        "serialized_cells" not in CLEAN["concurrency_mixed"].to_json()
    )  # absent where the server ran batches


def test_serialized_levels_are_a_note_under_another_verdict_and_nothing_beside_crosstalk():
    cache = decide(evidence(concurrency_single=SERIALIZED, cache=COLD_DIFFERS), run_all=True)
    assert cache.verdict == "cache" and cache.notes[0] == SERIALIZED_TEXT
    assert SERIALIZED_TEXT not in cache.reason
    # Drift at a batched level is crosstalk: no sentence about serialized levels then.
    mixed_drift = replace(CROSSTALK, key="concurrency_mixed", mode="mixed")
    crosstalk = decide(evidence(concurrency_single=SERIALIZED, concurrency_mixed=mixed_drift))
    assert crosstalk.verdict == "crosstalk"
    assert not any("serialized" in text for text in (crosstalk.reason, *crosstalk.notes))
