"""Companions the client abandons mid-answer (``load.cancel_*``), as a user closing a tab: which
ones and when.

Which companions are cut is a pure function of the seed, the probe, the level and the companion's
number in it, so a rerun with the same ``load.seed`` cuts the same ones whatever the server's speed.
The cut itself is the client's (``Client.send``'s ``cancel``): the connection is closed, which is
how a server learns that a client went away, so it aborts the request and its batch changes. A cut
request is recorded with the status ``cancelled``, a word of kevload's: no answer and no error of
the server's.

Whether a probe drifted *because of* the cuts is the comparator's question
(``kevload.compare.cuts``); when a request is cut (``CancelAt``) is the client's, and ``cancelled``
is a word of the records (``kevload.inputs.wordsets.CANCELLED``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kevload.wire.client import CancelAt


@dataclass(frozen=True, slots=True)
class CancelPlan:
    """``load.cancel_share`` of a level's companions, chosen by ``load.seed``, each cut at
    ``at``."""

    share: float
    at: CancelAt
    seed: int

    @classmethod
    def of(
        cls, share: float, after_s: float | None, after_tokens: int | None, seed: int
    ) -> CancelPlan | None:
        """The plan of a [load] table; None when it cuts nothing."""
        if share <= 0 or (after_s is None and after_tokens is None):
            return None
        return cls(share, CancelAt(after_s, after_tokens), seed)

    def chosen(self, probe: str, level: str, worker: int, sample: int) -> bool:
        """Whether the ``sample``-th companion a worker sends at ``level`` (``c=4``, ``r=5/s``) of
        ``probe`` is cut.

        A hash, not a random stream: the choice does not depend on how many were asked before (a
        resume, a retry) nor move the seeded companion picker."""
        digest = hashlib.sha256(
            f"{self.seed}\0{probe}\0{level}\0{worker}\0{sample}".encode()
        ).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.share
