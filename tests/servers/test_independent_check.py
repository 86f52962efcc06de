"""The independent check the real-server tests rest on (tests/rawclient.py), against crafted servers
whose truth is known: it sees drift where the server drifts and none where it holds, and kevload's
verdicts agree with it both ways. So both branches of every real-server test (the engine drifts on
this CPU, or holds bitwise) are exercised on every machine, whichever one the real engine takes
here."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer
from tests.rawclient import (
    Answer,
    alone_and_together,
    answer_of,
    assert_cells_agree,
    assert_diagnosis_agrees,
    chat,
    seen,
    seen_in,
)
from tests.recording_proxy import RecordingProxy

DRIFTS = {"drift_at": 2, "batched_variant": True, "latency": 0.1}
LATENT = {"logprob_drift_at": 2, "latency": 0.1}


def test_an_answer_is_read_whole_or_streamed_with_its_logprobs():
    whole = {
        "choices": [
            {
                "message": {"content": "ab"},
                "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}]},
            }
        ]
    }
    assert answer_of(json.dumps(whole).encode()) == Answer("ab", (-0.5, -1.0))
    chunks = [
        {"choices": [{"delta": {"content": "a"}, "logprobs": {"content": [{"logprob": -0.5}]}}]},
        {"choices": [{"delta": {"content": "b"}, "logprobs": {"content": [{"logprob": -1.0}]}}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    stream = ": keep-alive\n\n" + "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    stream += "data: [DONE]\n\n"
    assert answer_of(stream.encode()) == Answer("ab", (-0.5, -1.0))
    bare = {"choices": [{"message": {"content": "ab"}}]}
    assert answer_of(json.dumps(bare).encode()) == Answer("ab", None)


def test_a_level_against_serial_follows_the_modal_serial_answer():
    a, b = Answer("x", (-1.0,)), Answer("y", (-1.0,))
    held = seen({1: [a, a], 4: [a, a]})
    assert (held.of(4).drift, held.of(4).bitwise, held.drift) == (False, True, False)
    other = seen({1: [a, a, b], 4: [b, b]})  # one text, not the serial one
    assert (other.of(4).distinct, other.of(4).drift, other.of(4).bitwise) == (1, True, None)
    latent = seen({1: [a, a], 4: [a, Answer("x", (-1.5,))]})
    assert (latent.of(4).drift, latent.of(4).latent, latent.latent) == (False, True, True)


@pytest.mark.parametrize(
    ("behaviour", "drift", "latent"),
    [({}, False, False), (DRIFTS, True, False), (LATENT, False, True)],
    ids=["holds", "drifts", "latent"],
)
def test_the_raw_client_sees_what_the_server_does(behaviour, drift, latent):
    with FakeServer(Behaviour(**behaviour)) as fake:
        found = alone_and_together(fake.url, chat("fake", "Say something.", 16), n=2, k=4)
    assert (found.drift, found.latent) == (drift, latent)
    assert [len(found.of(c).answers) for c in (1, 4)] == [2, 8]


@pytest.mark.parametrize("behaviour", [{}, DRIFTS, LATENT], ids=["holds", "drifts", "latent"])
def test_a_runs_cells_agree_with_the_requests_it_made(tmp_path, behaviour):
    with (
        FakeServer(Behaviour(**behaviour)) as fake,
        RecordingProxy(fake.url.removesuffix("/v1")) as proxy,
    ):
        scenario = write_scenario(tmp_path / "s.toml", proxy.url, concurrency=[1, 4], samples=4)
        code, output = run_cli("run", scenario, "--out", tmp_path / "r", "--quiet")
        exchanges = list(proxy.exchanges)
    found = seen_in(exchanges, tmp_path / "r")
    assert_cells_agree(cells_by_level(load_summary(tmp_path / "r")), found)
    assert code == (1 if found.drift else 0), output
    assert found.drift == (behaviour is DRIFTS) and found.latent == (behaviour is LATENT)


def test_the_check_fails_a_cell_that_claims_what_the_requests_do_not_show(tmp_path):
    with (
        FakeServer(Behaviour(**DRIFTS)) as fake,
        RecordingProxy(fake.url.removesuffix("/v1")) as proxy,
    ):
        scenario = write_scenario(tmp_path / "s.toml", proxy.url, concurrency=[1, 4], samples=4)
        run_cli("run", scenario, "--out", tmp_path / "r", "--quiet")
        exchanges = list(proxy.exchanges)
    cells = cells_by_level(load_summary(tmp_path / "r"))
    cells[4] = {**cells[4], "drift": False}
    with pytest.raises(AssertionError):
        assert_cells_agree(cells, seen_in(exchanges, tmp_path / "r"))


@pytest.mark.parametrize(
    ("behaviour", "verdict"),
    [({}, "stable"), (DRIFTS, "crosstalk"), (LATENT, "stable")],
    ids=["holds", "drifts", "latent"],
)
def test_diagnose_agrees_with_the_requests_it_made(tmp_path, behaviour, verdict):
    with (
        FakeServer(Behaviour(**behaviour)) as fake,
        RecordingProxy(fake.url.removesuffix("/v1")) as proxy,
    ):
        code, output = _diagnose(tmp_path, proxy.url)
        exchanges = list(proxy.exchanges)
    steps = assert_diagnosis_agrees(tmp_path / "d", exchanges, code)
    diagnosis = json.loads((tmp_path / "d.json").read_text())
    assert diagnosis["verdict"] == verdict, output
    assert {"fixed", "concurrency_single", "concurrency_mixed"} <= set(steps)
    assert bool(diagnosis["findings"].get("latent_crosstalk")) == (behaviour is LATENT)


def _diagnose(tmp_path, url: str) -> tuple[int, str]:
    return run_cli(
        "diagnose",
        "--url",
        url,
        "--model",
        "fake",
        "--prompt",
        "Say something.",
        "--params",
        '{"temperature": 0}',
        "--samples",
        "3",
        "--max-concurrency",
        "4",
        "--json",
        tmp_path / "d.json",
        "--out",
        tmp_path / "d",
    )


def test_cells_of_a_server_without_logprobs_agree_on_text_alone(tmp_path):
    # transformers serve ignores the logprobs field: summary.json then holds no logprob keys at all.
    beh = Behaviour(logprobs_supported=False, **DRIFTS)
    with FakeServer(beh) as fake, RecordingProxy(fake.url.removesuffix("/v1")) as proxy:
        scenario = write_scenario(tmp_path / "s.toml", proxy.url, concurrency=[1, 4], samples=4)
        code, output = run_cli("run", scenario, "--out", tmp_path / "r", "--quiet")
        exchanges = list(proxy.exchanges)
    found = seen_in(exchanges, tmp_path / "r")
    cells = cells_by_level(load_summary(tmp_path / "r"))
    assert "latent_drift" not in cells[4] and found.of(4).bitwise is None
    assert_cells_agree(cells, found)
    assert found.drift and code == 1, output
