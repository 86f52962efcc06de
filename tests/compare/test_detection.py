"""Each kind of drift is found where it exists and nowhere else, against a server with known
behaviour."""

from __future__ import annotations

import pytest

from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario


def run(tmp_path, server, **kwargs):
    scenario = write_scenario(tmp_path / "s.toml", server.url, **kwargs)
    out = tmp_path / "run"
    code, output = run_cli("run", scenario, "--out", out, "--quiet")
    return code, output, load_summary(out)


def test_deterministic_server_one_output_everywhere(tmp_path, server):
    code, output, summary = run(tmp_path, server, concurrency=[1, 2, 4], samples=8)
    assert code == 0, output
    cells = cells_by_level(summary)
    assert sorted(cells) == [1, 2, 4]
    for cell in cells.values():
        assert cell["ok"] == 8
        assert cell["distinct"] == 1
        assert cell["new_vs_serial"] == 0
        assert cell["drift"] is False
        # 8 clean samples bound the drift rate below 1 - 0.05**(1/8) ≈ 31 %.
        assert cell["drift_rate_upper_95"] == pytest.approx(0.3123, abs=1e-3)
    assert "deterministic" in output


def test_sampling_without_seed_drifts_even_serially(tmp_path, server):
    server.behaviour.sampling = True
    code, _, summary = run(
        tmp_path, server, params={"temperature": 0.8}, concurrency=[1], samples=6
    )
    assert code == 1
    assert cells_by_level(summary)[1]["distinct"] > 1


def test_fixed_seed_converges(tmp_path, server):
    server.behaviour.sampling = True
    code, output, summary = run(
        tmp_path, server, params={"temperature": 0.8, "seed": 7}, concurrency=[1, 4]
    )
    assert code == 0, output
    assert all(c["distinct"] == 1 for c in cells_by_level(summary).values())


def test_drift_only_when_crowded(tmp_path, server):
    server.behaviour.drift_at = 3
    # long enough that concurrent requests surely overlap on a busy machine
    server.behaviour.latency = 0.1
    code, _, summary = run(tmp_path, server, concurrency=[1, 2, 4], samples=8)
    assert code == 1
    cells = cells_by_level(summary)
    assert cells[1]["distinct"] == 1 and not cells[1]["drift"]
    assert cells[2]["distinct"] == 1 and not cells[2]["drift"]
    assert cells[4]["drift"] and cells[4]["distinct"] > 1
    assert cells[4]["new_vs_serial"] >= 1
    # The server changes words from the 6th on: "w1 w2 w3 w4 w5 " is a shared prefix.
    serial = cells[1]
    assert cells[4]["first_divergence_chars"] >= len(" ".join(["x"] * 5))
    assert serial["first_divergence_chars"] is None
    assert summary["drift_cells"] == ["p1@single/c=4"]


def test_level_agreeing_with_itself_but_not_serial_is_drift(tmp_path, server):
    server.behaviour.drift_at = 2
    server.behaviour.batched_variant = True
    server.behaviour.latency = 0.1
    code, _, summary = run(tmp_path, server, concurrency=[1, 2], samples=6)
    assert code == 1
    cell = cells_by_level(summary)[2]
    assert cell["distinct"] == 1
    assert cell["agrees_with_serial"] is False
    assert cell["new_vs_serial"] == 1 and cell["overlap_with_serial"] == 0
    assert cell["drift"] and cell["drift_rate"] == 1.0


def test_mixed_batch_drift_needs_mixed_mode(tmp_path, server):
    server.behaviour.drift_when_mixed = True
    (tmp_path / "a").mkdir()
    code, _, single = run(tmp_path / "a", server, mode="single", concurrency=[1, 4])
    assert code == 0
    assert all(c["distinct"] == 1 for c in cells_by_level(single).values())
    (tmp_path / "b").mkdir()
    code, _, mixed = run(tmp_path / "b", server, mode="mixed", concurrency=[1, 4], samples=8)
    assert code == 1
    cells = cells_by_level(mixed)
    assert cells[1]["distinct"] == 1 and not cells[1]["drift"]
    assert cells[4]["drift"]
    companions = [c for c in mixed["cells"] if c["role"] == "companion"]
    assert companions and all(c["concurrency"] == 4 for c in companions)


def test_cold_cache_answer_differs(tmp_path, server):
    server.behaviour.cold_differs = True
    code, _, summary = run(tmp_path, server, concurrency=[1], samples=5)
    assert code == 1
    cell = cells_by_level(summary)[1]
    assert cell["distinct"] == 2
    assert cell["modal_share"] == pytest.approx(0.8)


@pytest.mark.parametrize("mode", ["prefix", "needle"])
def test_companion_modes_send_companions_and_compare_probe_only(tmp_path, server, mode):
    code, output, summary = run(tmp_path, server, mode=mode, concurrency=[1, 3], samples=4)
    assert code == 0, output
    bodies = server.requests
    prompts = {b["messages"][-1]["content"] for b in bodies}
    assert "Say something." in prompts and len(prompts) > 1
    if mode == "prefix":
        assert any(p.startswith("Say somet") and p != "Say something." for p in prompts)
    else:
        assert max(len(p) for p in prompts) >= 1900
    assert cells_by_level(summary)[3]["ok"] == 4
