"""Agreement with the serial reference: how often a cell's outputs are the serial one, how many of
their tokens agree, and whether their per-token logprobs are the serial ones bitwise (latent drift
when the text agrees)."""

from __future__ import annotations

from dataclasses import dataclass

from kevload.compare.cells import CellAccumulator, OutputKey
from kevload.compare.divergence import common_prefix_length
from kevload.compare.stats import mean_share_interval, wilson_interval


@dataclass(frozen=True)
class Agreement:
    """The ``CellSummary`` fields of the same names; None where the cell makes no claim."""

    exact_match_rate: float | None = None
    exact_match_ci95: list[float] | None = None
    token_agreement: float | None = None
    token_agreement_ci95: list[float] | None = None


@dataclass(frozen=True)
class LogprobAgreement:
    """The ``CellSummary`` fields of the same names; None where the cell makes no claim."""

    samples: int | None = None
    bitwise: bool | None = None
    max_abs_diff: float | None = None
    first_divergence_token: int | None = None
    missing: int | None = None
    partial: int | None = None
    nonfinite_samples: int | None = None


def agreement(
    cell: CellAccumulator, reference: CellAccumulator, serial: OutputKey | None
) -> Agreement:
    """How often and how far the cell's outputs agree with the serial one, with 95 % intervals.

    ``exact_match_rate``: share of ok samples whose output is the serial output (Wilson interval).
    ``token_agreement``: per sample, the share of token positions equal to the serial output's
    before the first divergence (common prefix over the longer length), averaged over the samples
    that have tokens (interval: ``stats.mean_share_interval``).
    """
    ok = cell.ok
    if not ok or serial is None:
        return Agreement()
    matches = cell.counts.get(serial, 0)
    rate, ci95 = round(matches / ok, 6), [round(x, 6) for x in wilson_interval(matches, ok)]
    ref_tokens = reference.tokens.get(serial)
    if not ref_tokens:
        return Agreement(exact_match_rate=rate, exact_match_ci95=ci95)
    shares = []
    for key, n in cell.counts.items():
        if key == serial:
            shares.append((1.0, n))
        elif key in cell.tokens:
            tokens = cell.tokens[key]
            shares.append(
                (common_prefix_length(ref_tokens, tokens) / max(len(ref_tokens), len(tokens)), n)
            )
    interval = mean_share_interval(shares)
    if interval is None:
        return Agreement(exact_match_rate=rate, exact_match_ci95=ci95)
    return Agreement(
        exact_match_rate=rate,
        exact_match_ci95=ci95,
        token_agreement=round(interval[0], 6),
        token_agreement_ci95=[round(interval[1], 6), round(interval[2], 6)],
    )


def logprob_agreement(
    cell: CellAccumulator, reference: CellAccumulator, serial: OutputKey | None
) -> LogprobAgreement:
    """The cell's logprobs against the serial reference's at the same token positions.

    The reference is the most common logprob vector of the serial output in the serial cell. Each
    output is compared where its tokens agree with the serial tokens (an output with the serial text
    everywhere; another output up to its first differing token, where it counts as differing).
    """
    in_play = bool(cell.logprobs or cell.logprobs_missing)
    missing = cell.logprobs_missing if in_play else None
    nonfinite = cell.logprob_nonfinite if in_play else None
    if serial is None or serial not in reference.logprobs:
        return LogprobAgreement(missing=missing, nonfinite_samples=nonfinite)
    ref = reference.logprobs[serial].modal()
    ref_tokens = reference.tokens.get(serial)
    samples, partial, firsts, diffs = 0, 0, [], []
    for key, track in cell.logprobs.items():
        tokens = cell.tokens.get(key)
        if ref_tokens and tokens:
            upto = common_prefix_length(ref_tokens, tokens)
            # The serial text whose tokens (read from its logprobs) stop early has the serial
            # tokens, not others.
            same = (
                tokens == ref_tokens or key == serial and upto == min(len(tokens), len(ref_tokens))
            )
            upto = len(ref_tokens) if same else upto
        elif key == serial:
            upto, same = len(ref), True
        else:
            # another output without tokens: its positions cannot be lined up with the serial ones
            continue
        first, diff, covered = track.compare(ref, upto, same)
        samples += covered
        partial += track.n - covered
        if first is not None:
            firsts.append(first)
        if diff is not None:
            diffs.append(diff)
    if not samples:
        return LogprobAgreement(
            missing=missing, partial=partial if in_play else None, nonfinite_samples=nonfinite
        )
    # A difference among the compared samples is evidence whatever the others hold; equality is
    # claimed only over every ok sample of the cell, never over the ones that happened to have
    # logprobs.
    return LogprobAgreement(
        samples=samples,
        bitwise=False if firsts else True if samples == cell.ok else None,
        max_abs_diff=max(diffs) if diffs else None,
        first_divergence_token=min(firsts) if firsts else None,
        missing=missing,
        partial=partial if in_play else None,
        nonfinite_samples=nonfinite,
    )
