"""Stops: SIGINT and SIGTERM end every command the same way (130 or 143, records kept, run.json
finished with its state, summary written), at once, with nothing sent after the stop and no process
left behind; a stop during the logprobs check is a stop too; a run stopped before a level (or an
answer) was measured claims neither a verdict on it nor a failed target. Each kevload runs as a real
subprocess in its own process group with a kill timer (tests.bounded)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from kevload.records.rundir import RunDir
from tests.bounded import PARALLEL_REDUCTION, Kevload, holder
from tests.conftest import cells_by_level, load_summary, run_cli, write_scenario
from tests.fakeserver import Behaviour, FakeServer

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNALS = pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)

# Reduces a run directory N times inside kevload's event loop, its SIGINT/SIGTERM handlers
# installed, with the parallel reduction forced (four processes): a reduction that forks the loop's
# process hangs in about one of four.
REDUCE_IN_LOOP = (
    "import os, sys; from pathlib import Path; from kevload.load import eventloop; "
    "from kevload.compare import reader; "
    "reader._PARALLEL_BYTES = 1; os.cpu_count = lambda: 4; from kevload.load.finishing "
    "import finish_run\n"
    "async def main(stop):\n"
    "    for _ in range(int(sys.argv[2])): finish_run(Path(sys.argv[1]))\n"
    "eventloop.run(main)"
)


def _closed_run(tmp_path, server, samples=12):
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=samples)
    return scenario, tmp_path / "run"


def test_parallel_reduction_finishes_and_leaves_no_process(tmp_path, server):
    scenario, out = _closed_run(tmp_path, server)
    with Kevload("run", scenario, "--out", out, "--quiet", code=PARALLEL_REDUCTION) as kevload:
        ended = kevload.end(timeout=60)
    assert ended.code == 0, ended.stderr
    assert ended.left == []
    parallel = load_summary(out)
    with Kevload(out, 10, code=REDUCE_IN_LOOP) as again:
        ended = again.end(timeout=120)
    assert (ended.code, ended.left) == (0, []), ended.stderr
    # The parts merged equal the file read in one process.
    with Kevload("report", out, "--format", "json") as report:
        assert report.end(timeout=30).code == 0
    assert load_summary(out) == parallel
    assert parallel["requests"] == 24


@pytest.mark.parametrize("group", [False, True], ids=["to kevload", "to its group"])
def test_sigterm_while_the_summary_is_reduced(tmp_path, server, group):
    scenario, out = _closed_run(tmp_path, server)
    with Kevload("run", scenario, "--out", out, "--quiet", code=PARALLEL_REDUCTION) as kevload:
        # Every request answered and the reduction's processes started: the run is writing its
        # summary.
        kevload.wait_for(lambda: len(server.requests) >= 24 and kevload.children(), timeout=60)
        kevload.signal(signal.SIGTERM, group=group)
        ended = kevload.end(timeout=60)
    assert ended.code == 143, ended.stderr
    assert "Traceback" not in ended.stderr
    assert ended.left == []
    assert load_summary(out)["requests"] == 24 and len(list(RunDir(out).record_dicts())) == len(
        server.requests
    )
    assert json.loads((out / "run.json").read_text())["state"] == "complete"  # every record was in


def _stopped(kevload: Kevload, server, signum: int, *, group: bool = False, timeout: float = 10.0):
    """Signal kevload once the server has seen a request; returns how it ended and when the signal
    went."""
    kevload.wait_for(lambda: len(server.requests) >= 1, timeout=60)
    at = kevload.signal(signum, group=group)
    ended = kevload.end(timeout=timeout)  # a stop that waits for the next arrival fails here
    assert ended.code == EXIT[signum], ended.stderr
    assert "Traceback" not in ended.stderr
    assert ended.left == []
    # Sends are far apart in these tests: one that reached the server after the signal was sent
    # after the stop.
    assert all(arrival < at + 0.05 for arrival in server.arrivals), (at, server.arrivals)
    return ended


def _finished_interrupted(run_dir, server) -> None:
    """Records kept (one per request the server saw), run.json finished as interrupted, the summary
    written."""
    assert len(list(RunDir(run_dir).record_dicts())) == len(server.requests) > 0
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"
    assert load_summary(run_dir)["state"] == "interrupted"


@SIGNALS
@pytest.mark.parametrize("rate", [0.05, 1e-9])
def test_an_open_loop_level_stops_at_once(tmp_path, server, signum, rate):
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[rate], samples=4)
    with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
        _stopped(kevload, server, signum)
    _finished_interrupted(tmp_path / "run", server)
    assert len(server.requests) == 1  # the next arrival was 20 s (or 30 years) away


@SIGNALS
def test_a_warm_up_in_flight_gets_the_grace_not_the_timeout(tmp_path, server, signum):
    """A warm-up is a request in flight like any other: a stop gives it 2 s, not target.timeout, it
    is recorded as cut, and no further warm-up is sent."""
    server.behaviour.on_arrival = lambda index, at_server: (
        20.0 if index == 0 else None
    )  # the first warm-up, held
    scenario = write_scenario(
        tmp_path / "s.toml",
        server.url,
        concurrency=[1, 2],
        samples=4,
        warmup=3,
        target={"timeout": 30},
    )
    with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
        _stopped(
            kevload, server, signum, timeout=6
        )  # before: the held warm-up's 20 s, then two more sent
    _finished_interrupted(tmp_path / "run", server)
    (record,) = RunDir(tmp_path / "run").record_dicts()
    assert (record["role"], record["status"], record["counted"]) == ("warmup", "timeout", False)
    assert record["error"] == "cut: still in flight 2 s after the stop"


@SIGNALS
def test_a_closed_loop_request_the_stop_cuts_is_recorded_not_lost(tmp_path, server, signum):
    """Requests still in flight when the stop's grace ends are cancelled: each keeps a record
    (uncounted), so the records hold every request the server saw, and the overlap check misses none
    of them."""
    server.behaviour.on_arrival = lambda index, at_server: (
        20.0 if index >= 8 else None
    )  # c=1 done, c=4's held
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=8, target={"timeout": 30}
    )
    with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
        kevload.wait_for(lambda: len(server.requests) >= 12, timeout=30)
        at = kevload.signal(signum)
        ended = kevload.end(timeout=10)
    assert ended.code == EXIT[signum] and time.monotonic() - at < 5, ended.stderr
    _finished_interrupted(tmp_path / "run", server)
    cut = [r for r in RunDir(tmp_path / "run").record_dicts() if r["concurrency"] == 4]
    assert len(cut) == 4 and all(r["status"] == "timeout" and r["counted"] is False for r in cut), (
        cut
    )


@SIGNALS
def test_a_second_signal_ends_at_once_with_the_signals_code(tmp_path, server, signum):
    server.behaviour.on_arrival = lambda index, at_server: (
        30.0 if at_server >= 2 else None
    )  # c=4 held
    scenario = write_scenario(tmp_path / "s.toml", server.url, concurrency=[1, 4], samples=6)
    with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
        kevload.wait_for(lambda: len(server.requests) >= 8, timeout=30)
        kevload.signal(signum)
        time.sleep(0.1)  # the stop's grace would end 1.9 s after the second signal
        at = kevload.signal(signum)
        ended = kevload.end(timeout=10)
    assert ended.code == EXIT[signum] and time.monotonic() - at < 1.5, (
        ended.stderr
    )  # before: 1, or death by SIGTERM
    assert "Traceback" not in ended.stderr and "Aborted" not in ended.stderr
    # What was written stays, and run.json says this part left requests without a record (their
    # others unknown).
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["state"] == "interrupted" and meta["parts"][0]["unrecorded"] > 0
    assert load_summary(tmp_path / "run")["verdict"] == "inconclusive"


@SIGNALS
def test_workers_stop_at_once_when_the_whole_group_is_signalled(tmp_path, server, signum):
    # Ctrl-C and a CI timeout signal every process of the group: the workers leave the stop to the
    # driver.
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[0.05], samples=4, workers=2)
    with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
        _stopped(kevload, server, signum, group=True)
    _finished_interrupted(tmp_path / "run", server)


def test_closed_loop_workers_keep_their_records_on_a_group_sigterm(tmp_path, server):
    server.behaviour.latency = 0.3
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=20, workers=2
    )
    with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
        kevload.wait_for(lambda: len(server.requests) >= 2, timeout=60)
        kevload.signal(signal.SIGTERM, group=True)
        ended = kevload.end(timeout=20)
    assert ended.code == 143, ended.stderr
    assert "Traceback" not in ended.stderr and ended.left == []
    _finished_interrupted(tmp_path / "run", server)


@SIGNALS
def test_diagnose_stops_after_the_step_it_interrupts(tmp_path, server, signum):
    server.behaviour.latency = 0.3
    out = tmp_path / "diag"
    with Kevload(
        "diagnose",
        "--url",
        server.url,
        "--model",
        "fake",
        "--prompt",
        "Say something.",
        "--samples",
        "6",
        "--out",
        out,
        "--json",
        tmp_path / "diagnosis.json",
    ) as kevload:
        ended = _stopped(kevload, server, signum)
    _finished_interrupted(out / "baseline", server)
    # The cut step is no evidence: nothing counts as measured, and the diagnosis says so; its run is
    # listed.
    assert "not measured: baseline" in ended.stdout
    diagnosis = json.loads((tmp_path / "diagnosis.json").read_text())
    assert (diagnosis["verdict"], diagnosis["steps"]) == ("inconclusive", [])
    assert diagnosis["runs"] == [str(out / "baseline")]


@SIGNALS
def test_sweep_stops_at_once(tmp_path, server, signum):
    scenario = write_scenario(tmp_path / "s.toml", server.url, rate=[0.05], samples=4)
    out = tmp_path / "sweep"
    with Kevload(
        "sweep", scenario, "--grid", "load.samples=3,4", "--out", out, "--quiet"
    ) as kevload:
        _stopped(kevload, server, signum)
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["complete"] is False
    _finished_interrupted(next(p for p in out.iterdir() if p.is_dir()), server)


@SIGNALS
def test_cases_rerun_stops_at_once(tmp_path, server, signum):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        json.dumps(
            {
                "id": "slow",
                "input": "Say something.",
                "params": {"temperature": 0, "rate": 0.05},
                "outputs": [],
                "expected": None,
                "verdict": "stable",
                "note": "",
            }
        )
        + "\n"
    )
    with Kevload(
        "cases",
        "rerun",
        cases,
        "--url",
        server.url,
        "--model",
        "fake",
        "--times",
        "3",
        "-o",
        tmp_path / "after.jsonl",
        "--out",
        tmp_path / "reruns",
    ) as kevload:
        _stopped(kevload, server, signum)
    assert (
        tmp_path / "after.jsonl"
    ).read_text() == ""  # the interrupted case is left out: incomplete evidence
    (rerun_dir,) = (tmp_path / "reruns").glob("cases-rerun-*/slow")
    _finished_interrupted(rerun_dir, server)


def test_a_worker_killed_while_it_waits_at_a_barrier_ends_the_run(tmp_path, server):
    server.behaviour.latency = 0.3
    out = tmp_path / "run"
    # At c=1 worker 0 holds the one slot; worker 1 waits at the level's end barrier until worker 0
    # is done.
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[1], samples=30, workers=2
    )
    with Kevload("run", scenario, "--out", out, "--quiet") as kevload:
        kevload.wait_for(lambda: len(server.requests) >= 2, timeout=60)
        os.kill(holder(kevload.proc.pid, out / "records-1.jsonl"), signal.SIGKILL)
        ended = kevload.end(timeout=20)
    assert ended.code == 3, (
        ended.stderr
    )  # a lost worker: the evidence is short, as for a lost Ray actor
    assert (
        "--workers: worker 1 died (exit code -9)" in ended.stderr
        and "Traceback" not in ended.stderr
    )
    assert ended.left == []
    _finished_interrupted(out, server)
    assert len(server.requests) < 30  # the others stopped; nothing waited for the dead one


def test_a_worker_that_never_reports_after_a_halt_is_killed_not_waited_for(tmp_path, server):
    # A worker killed while it held the level's shared lock leaves the other blocked on the lock,
    # alive, never seeing the halt: stopped with SIGSTOP here, it is the same for the driver, which
    # waited for it for ever.
    server.behaviour.latency = 0.3
    out = tmp_path / "run"
    scenario = write_scenario(
        tmp_path / "s.toml", server.url, concurrency=[2], samples=40, workers=2
    )
    with Kevload("run", scenario, "--out", out, "--quiet") as kevload:
        kevload.wait_for(lambda: len(server.requests) >= 4, timeout=60)
        os.kill(holder(kevload.proc.pid, out / "records-1.jsonl"), signal.SIGSTOP)
        os.kill(holder(kevload.proc.pid, out / "records-0.jsonl"), signal.SIGKILL)
        ended = kevload.end(timeout=30)
    assert ended.code == 3, ended.stderr
    assert "worker 0 died (exit code -9)" in ended.stderr
    assert "Traceback" not in ended.stderr and ended.left == []
    # What both had written stays (their requests in flight went with them), and the run is finished
    # as interrupted.
    assert 0 < len(list(RunDir(out).record_dicts())) <= len(server.requests)
    assert json.loads((out / "run.json").read_text())["state"] == "interrupted"
    assert load_summary(out)["state"] == "interrupted"


def _interrupted(tmp_path, on_full, *, concurrency, samples=6):
    """kevload run in its own group; ``on_full(kevload)`` is called at the server when
    ``concurrency`` requests are there (held 30 s: no answer comes before the stop). Returns how
    kevload ended."""
    with FakeServer(Behaviour(latency=0.02)) as server:
        scenario = write_scenario(
            tmp_path / "s.toml", server.url, concurrency=concurrency, samples=samples
        )
        fired: list[Kevload] = []
        kevload_box: list[Kevload] = []

        def on_arrival(index, at_server):
            if max(concurrency) == 1 or at_server >= 2:
                if at_server >= max(concurrency) and not fired:
                    fired.append(kevload_box[0])
                    on_full(kevload_box[0])
                return 30.0
            return None

        server.behaviour.on_arrival = on_arrival
        with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
            kevload_box.append(kevload)
            ended = kevload.end(timeout=60)
        server.behaviour.on_arrival = None
    assert fired, ended.stderr
    return ended


def test_an_interrupted_run_that_never_measured_a_level_is_not_deterministic(tmp_path):
    # c=1 done, then Ctrl-C while c=4's first requests are at the server: no c=4 sample was ever
    # counted.
    ended = _interrupted(tmp_path, lambda k: k.signal(signal.SIGINT), concurrency=[1, 4])
    assert ended.code == 130, ended.stderr
    summary = load_summary(tmp_path / "run")
    assert summary["state"] == "interrupted" and set(cells_by_level(summary)) == {1}
    # "one output per probe at every level" is a claim about c=4 too, which has no sample.
    assert summary["verdict"] != "deterministic", summary["verdict"]
    assert "at every level" not in " ".join((ended.stdout + ended.stderr).split())
    code, text = run_cli("report", tmp_path / "run")
    assert code != 0, text  # a CI that re-reports the directory must not read "all held"


def test_a_stop_before_any_answer_is_no_target_failure(tmp_path):
    # Ctrl-C while the first request is at the server, before it answered: nothing failed, nothing
    # was measured.
    ended = _interrupted(tmp_path, lambda k: k.signal(signal.SIGINT), concurrency=[1])
    assert ended.code == 130, ended.stderr
    summary = load_summary(tmp_path / "run")
    assert summary["errors"] == 0
    assert summary["verdict"] != "target_failed", summary
    assert "target failed" not in ended.stdout + ended.stderr, (
        ended.stdout
    )  # before: "0 of 0 … failed (none)"


class _HoldsTheCheck(FakeServer):
    """Holds kevload's one logprobs capability check 20 s (a server busy loading, say); answers the
    rest at once."""

    def __init__(self, behaviour=None):
        super().__init__(behaviour)
        self.checks: list[float] = []

    async def _handle(self, request):
        from kevload.wire.logprobcheck import LOGPROBS_CHECK_USER

        body = await request.json()
        if body.get("user") == LOGPROBS_CHECK_USER:
            self.checks.append(time.monotonic())
            await asyncio.sleep(20)
        return await super()._handle(request)


def test_sigterm_during_the_logprobs_check_stops_at_once(tmp_path):
    """The docs: a stop ends run at once, requests in flight get 2 s to finish. The start-up check
    is a request in flight too: a CI job's timeout must not wait for target.timeout."""
    with _HoldsTheCheck(Behaviour(latency=0.02)) as server:
        scenario = write_scenario(
            tmp_path / "s.toml", server.url, concurrency=[1, 2], samples=4, target={"timeout": 30}
        )
        with Kevload("run", scenario, "--out", tmp_path / "run", "--quiet") as kevload:
            kevload.wait_for(lambda: bool(server.checks), timeout=30)
            at = kevload.signal(signal.SIGTERM)
            ended = kevload.end(timeout=40)
            took = time.monotonic() - at
        sent = len(server.requests)
    assert ended.code == 143, ended.stderr
    assert took < 5.0, (
        f"ended {took:.1f} s after SIGTERM"
    )  # before: ~18 s, when the held check gave up
    assert sent == 0
