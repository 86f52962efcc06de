"""One request of a level, sent and recorded: its id and body, the level's claim, retries after
429/503, and a cut; and a conversation sample, its turns sent one after another under one claim
(``Sender.converse``).

The level (``kevload.load.level``) decides what counts; the sender asks it around the request's time
in flight and turns the ``Outcome`` into the ``Record`` the run keeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import operator
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import msgspec

from kevload.inputs.conversation import conversation_sha256, history_sha256
from kevload.inputs.probe import Probe
from kevload.inputs.scenario import Scenario
from kevload.load.level import Claim, Level
from kevload.load.prefixcache import CacheControl
from kevload.load.schedule import PROBE, ClosedLoop, Role
from kevload.records.store import Record, answer_text
from kevload.wire.answer import Outcome
from kevload.wire.client import CancelAt, Client, build_body


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which answers are tried again (``load.retries`` times at most) and after how long: the
    server's Retry-After, or else an exponential back-off, never longer than ``max_s``."""

    retries: int
    statuses: tuple[str, ...] = ("http_429", "http_503")
    base_s: float = 0.2
    max_s: float = 10.0

    def delay(self, outcome: Outcome, attempt: int) -> float | None:
        """Seconds to wait before trying again after ``attempt`` retries, or None when ``outcome``
        is final."""
        if outcome.status not in self.statuses or attempt >= self.retries:
            return None
        wait = outcome.retry_after if outcome.retry_after is not None else self.base_s * 2**attempt
        return min(wait, self.max_s)


@dataclass(frozen=True, slots=True)
class Cut:
    """Why a request still in flight was cancelled, carried by the cancel itself
    (``task.cancel(Cut(…))``): it is recorded as a ``timeout`` saying so. ``stop``: the stop's grace
    ran out (no answer of the server's)."""

    why: str
    stop: bool = False


@dataclass(frozen=True, slots=True)
class Cell:
    """What every record of one level shares."""

    mode: str
    concurrency: int
    rate: float | None
    max_in_flight: int | None


class Sender:
    """Sends the requests of a run, numbered in turn with the other workers, and makes each one's
    record."""

    def __init__(
        self,
        scenario: Scenario,
        client: Client,
        *,
        run_id: str,
        part: int,
        first_seq: int,
        worker: int,
        workers: int,
        hear_stop: Callable[[], object],
        stop: asyncio.Event,
        cache: CacheControl | None = None,
    ):
        self.scenario, self.client, self.run_id = scenario, client, run_id
        # load.prefix_cache = "cold_warm": makes each probe sample cold or warm before it is sent
        self.cache = cache
        # Request ids: <run_id>-<seq> in the run's first part, <run_id>-r<k>-<seq> in its k-th
        # resume. A killed part may have sent requests it never recorded, so numbering on from the
        # records alone could repeat an id.
        self.ids = run_id if part == 0 else f"{run_id}-r{part}"
        self.seq, self.step = (
            first_seq + worker,
            workers,
        )  # workers number their sends in turn: seqs stay unique
        self.sent = 0
        self.retry = RetryPolicy(scenario.load.retries)
        # Tells the level now running of a stop, an abort or another worker's halt (the run's
        # ``halted``).
        self._hear_stop = hear_stop
        self._stop = stop

    async def send(
        self,
        level: Level,
        cell: Cell,
        role: Role,
        item: Probe,
        sample: int,
        *,
        at: float = 0.0,
        t_scheduled: float | None = None,
        cancel: CancelAt | None = None,
    ) -> Record:
        """``at``: seconds into the level (scheduled, in the open loop), which decides a ramp-up's
        sends. ``cancel``: when the client abandons this request (``kevload.load.cancel``); its slot
        sends the next at once."""
        seq, request_id = self._number()
        body = self._body(item, request_id)
        state = None
        if self.cache is not None and role == PROBE:
            # Before the claim: a reset is no part of the request's time in flight.
            state = self.cache.state(sample)
            body.update(await self.cache.prepare(state))
        # Nothing between a slot's answer and this claim suspends: a slot that resends at once keeps
        # c in flight.
        claim = level.claim(role, at)
        try:
            outcome, retries, cut = await self._exchange(level, body, request_id, cancel)
        finally:
            # before the answer is weighed: one that comes after a stop does not count
            self._hear_stop()
            counted = level.release(claim)
        # A request the stop cut is no answer of the server's, at any level.
        return record(
            outcome,
            body,
            run_id=self.run_id,
            seq=seq,
            probe=item.id,
            role=role,
            mode=cell.mode,
            concurrency=cell.concurrency,
            rate=cell.rate,
            sample=sample,
            in_flight=claim.others,
            counted=counted and not (cut is not None and cut.stop),
            max_in_flight=cell.max_in_flight,
            t_scheduled=t_scheduled,
            retries=retries,
            request_id=request_id,
            cache=state,
            cancel_planned=cancel is not None,
        )

    async def converse(
        self,
        level: Level,
        cell: Cell,
        role: Role,
        item: Probe,
        sample: int,
        *,
        at: float = 0.0,
        t_scheduled: float | None = None,
        cancel: CancelAt | None = None,
    ) -> AsyncIterator[Record]:
        """A conversation sample: its turns one after another in this slot, each a request and a
        record, turn k asked with the answers turns 0 … k − 1 received (or those the file gives). It
        ends at its last turn or at the first that failed (no answer to go on with), or at a stop
        (nothing is sent after it). A conversation ``load.cancel_share`` chose is abandoned in the
        first turn the cut reaches: that turn is ``cancelled`` and ends it, as a user closing the
        tab ends the chat.

        The sample holds one claim from its first send to its last answer, as one request would: its
        first turn's claim decides whether the level counts it, every later turn counts only if it
        too went with c − 1 others in flight (``Level.claim_turn``) and every turn before it
        counted. So the record that ends the sample says whether the whole conversation was sent at
        full load."""
        assert item.turns is not None
        first = level.claim(role, at)
        talk = _Talk(self.run_id, cell, role, item, sample, t_scheduled, cancel is not None)
        answers: list[str] = []
        counted, held = first.counted, True
        started = time.perf_counter()  # a cut by time counts from the first turn's send
        try:
            for k in range(len(item.turns)):
                if (
                    k and level.halted
                ):  # nothing is sent after a stop: the sample ends here, uncounted
                    return
                claim = first if k == 0 else level.claim_turn(first)
                cut_at = cancel.since(time.perf_counter() - started) if cancel and k else cancel
                turn = await self._send_turn(level, item.turn(k, answers), cut_at)
                ends = k == len(item.turns) - 1 or turn.outcome.status != "ok"
                cut = turn.cut
                counted = counted and claim.counted and not (cut is not None and cut.stop)
                held = not ends
                counted = _turn_counted(level, first, counted, ends=ends)
                yield talk.record(k, turn, in_flight=claim.others, counted=counted)
                if ends:
                    return
                answers.append(turn.outcome.output or "")
        finally:
            if held:  # torn down mid-conversation
                level.release(first)

    async def _send_turn(self, level: Level, asked: Probe, cancel: CancelAt | None) -> _Turn:
        """One turn of a conversation, numbered, sent and answered; the stop heard before it is
        weighed."""
        seq, request_id = self._number()
        body = self._body(asked, request_id)
        outcome, retries, cut = await self._exchange(level, body, request_id, cancel)
        self._hear_stop()
        return _Turn(asked, seq, request_id, body, outcome, retries, cut)

    def _number(self) -> tuple[int, str]:
        """The next request's seq and id. Sent as X-Request-Id; a 429/503 retry and a transport's
        reconnect resend keep it."""
        seq = self.seq
        self.seq += self.step
        self.sent += 1
        return seq, f"{self.ids}-{seq}"

    def _body(self, item: Probe, request_id: str) -> dict[str, Any]:
        load = self.scenario.load
        nonce = f"kevload-{request_id}" if load.nonce else None
        return build_body(
            self.scenario.target, item, self.scenario.params, stream=load.stream, nonce=nonce
        )

    async def _exchange(
        self, level: Level, body: dict[str, Any], request_id: str, cancel: CancelAt | None = None
    ) -> tuple[Outcome, int, Cut | None]:
        """The request sent, retried after a 429/503 as the policy says, or cut: the outcome, the
        retries, the cut."""
        retries, cut = 0, None
        t_send = time.perf_counter()
        try:
            outcome = await self.client.send(body, request_id=request_id, cancel=cancel)
            while (
                wait := self.retry.delay(outcome, retries)
            ) is not None and not self._stop.is_set():
                # Backing off is not being in flight: the other slots' sends meanwhile are not at
                # full load.
                level.pause()
                try:
                    await asyncio.sleep(wait)
                finally:
                    level.resume()
                retries += 1
                outcome = await self.client.send(body, request_id=request_id, cancel=cancel)
        except asyncio.CancelledError as exc:
            cut = next((arg for arg in exc.args if isinstance(arg, Cut)), None)
            if cut is None:  # torn down, not cut: nothing to record
                raise
            outcome = Outcome(
                status="timeout", t_send=t_send, t_last_byte=time.perf_counter(), error=cut.why
            )
        return outcome, retries, cut


def _turn_counted(level: Level, first: Claim, counted: bool, *, ends: bool) -> bool:
    """Whether a turn counts, given whether it and every turn before it went at full load
    (``counted``). The turn that ends the sample releases its claim, which has the last word; an
    earlier one's answer after a halt lost its batch on the way, as ``Level.release`` says of
    one."""
    if not ends:
        return counted and not (level.halted and isinstance(level.plan, ClosedLoop))
    kept = level.release(first)
    if kept and not counted:  # counted when it began, then a later turn lost full load
        level.lost(first)
    return kept and counted


class _Turn(NamedTuple):
    """One turn of a conversation as sent and answered (a named tuple: cheap to make per turn)."""

    asked: Probe
    seq: int
    request_id: str
    body: dict[str, Any]
    outcome: Outcome
    retries: int
    cut: Cut | None


@dataclass(slots=True)
class _Talk:
    """One conversation sample as its turns' records name it: what they share, its id (its first
    turn's request id) and the hash chained over its answers so far."""

    run_id: str
    cell: Cell
    role: Role
    item: Probe
    sample: int
    t_scheduled: float | None
    cancel_planned: bool
    conversation: str | None = None
    chained: str | None = None

    def record(self, k: int, turn: _Turn, *, in_flight: int, counted: bool) -> Record:
        """Turn ``k``'s record, its conversation hash chained on from the turns before it."""
        assert self.item.turns is not None  # a conversation's
        self.conversation = self.conversation or turn.request_id
        messages = turn.asked.messages or ()
        cell = self.cell
        done = record(
            turn.outcome,
            turn.body,
            run_id=self.run_id,
            seq=turn.seq,
            probe=self.item.id,
            role=self.role,
            mode=cell.mode,
            concurrency=cell.concurrency,
            rate=cell.rate,
            sample=self.sample,
            in_flight=in_flight,
            counted=counted,
            max_in_flight=cell.max_in_flight,
            t_scheduled=self.t_scheduled if k == 0 else None,
            retries=turn.retries,
            request_id=turn.request_id,
            turn=k,
            turns=len(self.item.turns),
            conversation=self.conversation,
            history=list(messages),
            history_sha256=history_sha256(messages),
            cancel_planned=self.cancel_planned,
        )
        if done.sha256 is None:
            return done
        self.chained = conversation_sha256(self.chained, done.sha256, done.finish_reason)
        return msgspec.structs.replace(done, conversation_sha256=self.chained)


# Every field an Outcome shares with a Record is copied by name, so a field added to both travels on
# its own; read in one call per request.
_FROM_OUTCOME = tuple(
    name for name in Record.__struct_fields__ if name in {g.name for g in fields(Outcome)}
)
_shared = operator.attrgetter(*_FROM_OUTCOME)


def record(outcome: Outcome, body: dict[str, Any], **given: Any) -> Record:
    """The record of ``outcome``, built once: the fields it shares with the record, ``given`` (what
    the sender knows of the request), the answer's hash and the body's parameters."""
    values = dict(zip(_FROM_OUTCOME, _shared(outcome), strict=True))
    output = outcome.output
    values.update(given)
    params = (
        body.copy()
    )  # the body less its prompt: a copy and two pops cost a third of a filtering comprehension
    params.pop("messages", None)
    params.pop("prompt", None)
    return Record(
        **values,
        sha256=hashlib.sha256(
            answer_text(output, outcome.reasoning, outcome.tool_calls).encode()
        ).hexdigest()
        if outcome.status == "ok" and output is not None
        else None,
        params=params,
    )
