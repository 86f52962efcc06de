"""`kevload diagnose` reaches each verdict on a server built to have exactly that problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fakeserver import Behaviour, FakeServer


def diagnose(tmp_path, server, *extra, params='{"temperature": 0.8}'):
    out = tmp_path / "diag.json"
    code, output = run_cli(
        "diagnose",
        "--url",
        server.url,
        "--model",
        "fake",
        "--prompt",
        "Tell me a fact.",
        "--params",
        params,
        "--samples",
        "6",
        "--json",
        out,
        "--out",
        tmp_path / "runs",
        *extra,
    )
    return code, output, json.loads(out.read_text())


def test_stable(tmp_path, server):
    # text only: what a stable verdict rests on without logprobs
    server.behaviour.logprobs_supported = False
    code, output, d = diagnose(tmp_path, server)
    assert code == 0, output
    assert d["verdict"] == "stable"
    assert d["evidence"] == "text" and "evidence: output text compared" in output
    assert {s["step"] for s in d["steps"]} >= {
        "baseline",
        "fixed",
        "cache",
        "concurrency_single",
        "concurrency_mixed",
    }
    assert all(s["distinct"] == 1 for s in d["steps"] if "distinct" in s)
    assert "--samples 299" in output  # what a 1 % bound would need
    assert d["findings"]["cache_effect"] is False
    assert d["findings"]["greedy_at_temperature_0"] is True
    # One logprob check per diagnosis, not one per step: the later steps know the answer.
    assert output.count("returned no per-token logprobs") == 1, output
    checks = [json.loads((Path(run) / "run.json").read_text())["logprobs"] for run in d["runs"]]
    assert checks[0]["available"] is False and all(c["asked"] is False for c in checks[1:])


def test_sampling_with_honoured_seed(tmp_path, server):
    server.behaviour.sampling = True
    code, _, d = diagnose(tmp_path, server)
    assert code == 1
    assert d["verdict"] == "sampling"
    assert d["findings"]["seed_honoured"] is True
    assert "seed" in d["next"]
    assert "will not help" not in d["next"]  # the seed is honoured here: fixing it does help
    assert d["findings"]["temperature_honoured"] is True
    steps = {s["step"]: s for s in d["steps"]}
    assert steps["baseline"]["distinct"] > 1 and steps["fixed"]["distinct"] == 1
    assert "concurrency_single" not in steps  # cause found: later steps skipped without --all
    assert all(path.startswith(str(tmp_path)) for path in d["runs"])


def test_seed_not_honoured(tmp_path, server):
    server.behaviour.sampling = True
    server.behaviour.seed_honoured = False
    code, _, d = diagnose(tmp_path, server, "--all")
    assert code == 1
    assert d["findings"]["seed_honoured"] is False
    assert d["findings"]["greedy_at_temperature_0"] is True
    assert "concurrency_mixed" in {s["step"] for s in d["steps"]}  # --all runs every step
    assert d["verdict"] == "sampling"
    assert "Fixing the seed will not help on this server" in d["next"]


def test_temperature_ignored_is_named(tmp_path, server):
    # Sampling would vary the outputs, but the server answers greedily whatever temperature says.
    server.behaviour.sampling = True
    server.behaviour.ignore_temperature = True
    code, output, d = diagnose(tmp_path, server)
    assert code == 0, output
    assert d["verdict"] == "stable"
    assert d["findings"]["temperature_honoured"] is False
    assert "note: the server ignores temperature: at temperature 0.8 without a seed" in output
    assert d["notes"] and "not sampling" in d["notes"][0]
    assert "will not help" not in d["next"]
    steps = {s["step"]: s for s in d["steps"]}
    assert (
        steps["temperature"]["params"] == {"temperature": 0.8}
        and steps["temperature"]["distinct"] == 1
    )


def test_temperature_step_uses_the_users_temperature(tmp_path, server):
    server.behaviour.sampling = True
    _, output, d = diagnose(tmp_path, server, params='{"temperature": 0.3, "top_p": 0.9}')
    steps = {s["step"]: s for s in d["steps"]}
    assert steps["temperature"]["params"] == {"temperature": 0.3}  # no seed, no other fixing field
    assert d["findings"]["temperature_honoured"] is True
    assert "note:" not in output


def test_temperature_zero_still_sampling(tmp_path, server):
    server.behaviour.sampling = True
    server.behaviour.greedy_at_zero = False
    _, _, d = diagnose(tmp_path, server, "--all")
    assert d["findings"]["greedy_at_temperature_0"] is False


def test_crosstalk(tmp_path, server):
    server.behaviour.drift_at = 2
    server.behaviour.latency = 0.1
    code, _, d = diagnose(tmp_path, server, params='{"temperature": 0}')
    assert code == 1
    assert d["verdict"] == "crosstalk"
    assert "batch" in d["next"]
    steps = {s["step"]: s for s in d["steps"]}
    assert steps["fixed"]["distinct"] == 1 and steps["concurrency_single"]["drift"]


def test_cache(tmp_path, server):
    server.behaviour.cold_differs = True
    code, _, d = diagnose(tmp_path, server, params='{"temperature": 0}')
    assert code == 1
    assert d["verdict"] == "cache"
    assert d["findings"]["cache_effect"] is True
    assert d["findings"]["cache_off_converges"] is True
    assert "cach" in d["next"]


def test_server_nondeterministic(tmp_path, server):
    server.behaviour.always_drift = True
    code, _, d = diagnose(tmp_path, server, params='{"temperature": 0}')
    assert code == 1
    assert d["verdict"] == "server_nondeterministic"
    # Its warm answers vary too: the cache step's run makes no claim about the cache, and neither
    # does diagnose.
    assert d["findings"]["cache_effect"] is None


def test_rejected_field_is_dropped_and_reported(tmp_path, server):
    server.behaviour.reject_fields = ("top_k",)
    code, output, d = diagnose(tmp_path, server)
    assert code == 0, output
    assert d["dropped_fields"] == ["top_k"]
    assert "top_k" not in next(s for s in d["steps"] if s["step"] == "fixed")["params"]
    assert "rejected (dropped): top_k" in output


def test_data_verdict(tmp_path, server):
    train = tmp_path / "train.jsonl"
    train.write_text(
        "\n".join(json.dumps({"input": f"weather report number {i} for today"}) for i in range(20))
    )
    online = tmp_path / "online.jsonl"
    online.write_text(json.dumps({"input": "Tell me a fact."}) + "\n")
    code, output, d = diagnose(tmp_path, server, "--online", online, "--train", train)
    assert code == 1, output
    assert d["verdict"] == "data"
    data = next(s for s in d["steps"] if s["step"] == "data")
    assert data["outside"] and any("length" in r for r in data["reasons"])


def test_inconclusive_when_target_fails(tmp_path, server):
    server.behaviour.faults = ["http_500"] * 200
    code, _, d = diagnose(tmp_path, server)
    assert code == 3
    assert d["verdict"] == "inconclusive"


def test_fewer_samples_than_a_step_can_conclude_from_are_bad_usage_before_anything_is_sent(
    tmp_path, server
):
    # Two samples always ended "inconclusive: 3 at least are needed", and exit 1, the drift code.
    code, output = run_cli(
        "diagnose",
        "--url",
        server.url,
        "--model",
        "fake",
        "--prompt",
        "hi",
        "--samples",
        "2",
        "--out",
        tmp_path / "runs",
    )
    assert code == 2 and "'--samples': 2 is not in the range 3<=x" in output, output
    assert server.requests == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--params", "[1]"], "--params: expected a JSON object"),
        (["--prompt", "x", "--messages", "m.json"], "exactly one of --prompt"),
    ],
)
def test_bad_usage(tmp_path, args, expected):
    base = ["diagnose", "--url", "http://127.0.0.1:9/v1", "--model", "m"]
    if "--prompt" not in args:
        base += ["--prompt", "x"]
    code, output = run_cli(*base, *args)
    assert code == 2 and expected in output


def test_messages_file(tmp_path, server):
    messages = tmp_path / "m.json"
    messages.write_text(
        json.dumps(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me a fact."},
            ]
        )
    )
    out = tmp_path / "d.json"
    code, output = run_cli(
        "diagnose",
        "--url",
        server.url,
        "--model",
        "fake",
        "--messages",
        messages,
        "--samples",
        "3",
        "--json",
        out,
        "--out",
        tmp_path / "runs",
    )
    assert code == 0, output
    assert json.loads(out.read_text())["verdict"] == "stable"
    # The system message as given; the cache step's marker opens it (kevload.load.prefixcache), so
    # no cache keeps it.
    assert all(
        re.fullmatch(r"(\[round \d+ of \S+ in \S+\] )?Be brief\.", body["messages"][0]["content"])
        for body in server.requests
        if "messages" in body and len(body["messages"]) == 2
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"role": "user"}')
    code, output = run_cli("diagnose", "--url", server.url, "--model", "fake", "--messages", bad)
    assert code == 2 and "bad.json: --messages: expected a JSON list" in output


def test_diagnose_names_latent_crosstalk_and_rests_stable_on_bitwise_logprobs(tmp_path):
    def run(server, out):
        code, output = run_cli(
            "diagnose",
            "--url",
            server.url,
            "--model",
            "fake",
            "--prompt",
            "Tell me a fact.",
            "--samples",
            "4",
            "--max-concurrency",
            "2",
            "--json",
            out / "d.json",
            "--out",
            out / "runs",
        )
        return code, output, json.loads((out / "d.json").read_text())

    with FakeServer(Behaviour(logprob_drift_at=2, latency=0.2)) as server:
        code, output, d = run(server, tmp_path / "latent")
    assert code == 0 and d["verdict"] == "stable", output
    assert d["findings"]["latent_crosstalk"] is True and d["evidence"] == "text"
    assert any(
        n.startswith("latent crosstalk: under concurrency the text stays the serial one")
        for n in d["notes"]
    )
    with FakeServer(Behaviour(latency=0.05)) as server:
        code, output, d = run(server, tmp_path / "bitwise")
    assert code == 0 and d["verdict"] == "stable", output
    assert d["evidence"] == "logprobs_bitwise" and d["findings"]["latent_crosstalk"] is False
    assert "evidence: per-token logprobs bitwise equal, as well as the text" in output


def test_diagnose_says_the_server_serialized_the_levels(tmp_path):
    # Batched it would drift (drift_at=2), but it runs one request at a time: stable, and the reason
    # says why.
    with FakeServer(Behaviour(latency=0.06, drift_at=2, max_running=1, metrics="vllm")) as fake:
        code, output, d = diagnose(tmp_path, fake, params='{"temperature": 0}')
    assert code == 0, output
    assert d["verdict"] == "stable"
    assert "those levels were serialized by the server, not batched" in d["reason"]
    steps = {s["step"]: s for s in d["steps"]}
    assert steps["concurrency_single"]["serialized_cells"] == [
        "probe@single/c=2",
        "probe@single/c=4",
    ]
    with FakeServer(Behaviour(latency=0.06, drift_at=2, metrics="vllm")) as fake:
        code, output, d = diagnose(tmp_path / "batched", fake, params='{"temperature": 0}')
    assert code == 1 and d["verdict"] == "crosstalk"
    assert "serialized" not in d["reason"] and not any("serialized" in n for n in d["notes"])


def test_diagnose_grades_each_steps_answers_beside_its_distinct_count(tmp_path, server):
    # Right serially ("The answer is 42."), a wrong number once others are in flight: each step says
    # how many answers were good and bad, and the concurrency steps how many load turned bad.
    server.behaviour.latency = 0.1
    server.behaviour.answer_for = lambda prompt, overlap: (
        "The answer is 42." if overlap < 2 else "43"
    )
    code, output, d = diagnose(tmp_path, server, "--expected", "42", params='{"temperature": 0}')
    steps = {s["step"]: s for s in d["steps"]}
    assert (steps["baseline"]["graded_good"], steps["baseline"]["graded_bad"]) == (6, 0)
    assert steps["baseline"]["flips_good_to_bad"] == 0
    loaded = steps["concurrency_single"]  # c=1 right, c=2 and c=4 wrong: 6 samples each
    assert (loaded["graded_good"], loaded["graded_bad"], loaded["flips_good_to_bad"]) == (6, 12, 12)
    assert (
        "1 repeat baseline (current params, serial, nonce on): 1 distinct, graded 6 good, 0 bad, "
        "n=6" in output
    )
    assert (
        "4 concurrency [1, 2, 4], single: 1, all ≠ serial, graded 6 good, 12 bad (12 good→bad "
        "against serial)," in output
    )
    assert code == 1 and d["verdict"] == "crosstalk"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--grade", "nonsense", "--expected", "x"], "--grade: expected "),
        (["--grade", "regex", "--expected", "(["], "--expected: expected "),
        (["--grade-tolerance", "1", "--expected", "x"], "--grade-tolerance: expected "),
    ],
)
def test_diagnose_refuses_a_bad_grader_before_sending(tmp_path, server, args, expected):
    code, output = run_cli("diagnose", "--url", server.url, "--model", "m", "--prompt", "x", *args)
    assert code == 2 and expected in output and "Traceback" not in output, output
    assert server.requests == []
