"""The words a trace's synthetic prompts are made of, fitted to a model's own tokenizer
(``load.trace_tokenizer``).

A replayed request must reach the server at its recorded input length. kevload's words are one token
each in SmolLM2's vocabulary; another model's may split some of them. Given that model's
``tokenizer.json`` (read from disk with Hugging Face's ``tokenizers``, nothing downloaded), only the
words that are one token both opening a prompt and after a space are kept, and the first prompts are
encoded whole to measure how their token counts compare with the trace's input lengths (run.json).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevload.errors import ScenarioError

if TYPE_CHECKING:  # imported when a tokenizer is read: the package is optional (kevload[tokenizer])
    from tokenizers import Tokenizer

MIN_WORDS = 32  # fewer one-token words than this: the tokenizer is not one for English text
# the first prompts are encoded whole up to about this many tokens (well under a second)
CHECK_TOKENS = 200_000
MAX_BYTES = (
    256 << 20
)  # the largest models' tokenizer.json are tens of MB; their weights, named by mistake, GBs


@dataclass(frozen=True)
class TokenizerWords:
    """The words kept (in the built-in vocabulary's order), the ones dropped, and the tokenizer they
    were checked with: run.json's ``tokenizer`` under the trace dataset, with what encoding the
    first prompts found."""

    path: str
    sha256: str
    words: tuple[str, ...]
    dropped: tuple[str, ...]
    encode: Callable[[str], int]

    def check(self, prompts: Iterable[tuple[str, int]]) -> dict[str, Any]:
        """Encode whole prompts (text, input length asked), up to ``CHECK_TOKENS`` tokens, the first
        at least: how many lines were checked, how many came out at their length exactly, and the
        largest difference."""
        lines = exact = total = 0
        worst = 0
        for text, asked in prompts:
            if lines and total + asked > CHECK_TOKENS:
                break
            off = self.encode(text) - asked
            lines, total = lines + 1, total + asked
            exact += off == 0
            worst = max(worst, off, key=abs)
        return {"lines": lines, "exact": exact, "max_off": worst}

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "words": len(self.words),
            "dropped": list(self.dropped),
        }


def words_for(path: Path, vocabulary: Sequence[str], *, what: str) -> TokenizerWords:
    """The words of ``vocabulary`` that the tokenizer at ``path`` makes one token each; ``what``
    names the key."""
    data, tokenizer = _tokenizer(path, what)

    def ids(text: str) -> tuple[int, ...]:
        try:
            return tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        except (
            Exception
        ) as exc:  # a model the file cannot run, e.g. a WordLevel without its unknown token
            raise _not_a_tokenizer(path, what, "encoding with it", exc) from None

    def encode(text: str) -> int:
        return len(ids(text))

    # Opening a prompt (after a chat template's newline, too) a word has no space before it; inside
    # one it has.
    # Each its own token, too: a word the file does not know is its unknown token, as every other
    # unknown word is.
    alone = {w: ids(w) for w in vocabulary}
    shared = Counter(alone.values())
    kept = tuple(
        w
        for w in vocabulary
        if len(alone[w]) == 1 and shared[alone[w]] == 1 and encode(f"{w} {w}") == 2
    )
    if len(kept) < MIN_WORDS:
        raise ScenarioError(
            f"{path}: {what}: expected a tokenizer that makes common English words one token each "
            f"(at least {MIN_WORDS} of kevload's {len(vocabulary)}), got {len(kept)}"
        )
    return TokenizerWords(
        path=str(path),
        sha256=hashlib.sha256(data).hexdigest(),
        words=kept,
        dropped=tuple(w for w in vocabulary if w not in kept),
        encode=encode,
    )


def _tokenizer(path: Path, what: str) -> tuple[bytes, Tokenizer]:
    """The tokenizer.json at ``path``: its bytes (run.json hashes them) and the tokenizer they load,
    set to encode a prompt whole, as a server counts it."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ScenarioError(
            f"{what}: the tokenizers package is not installed (pip install 'kevload[tokenizer]')"
        ) from None
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:  # refused unread: reading it whole would take that much memory
            raise ScenarioError(
                f"{path}: {what}: expected a Hugging Face tokenizer.json (at most "
                f"{MAX_BYTES >> 20:,} MiB), got {size >> 20:,} MiB"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: {what}: cannot read: {exc.strerror}") from None
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # the library raises plain Exception for a file it cannot take
        raise _not_a_tokenizer(path, what, "reading it", exc) from None
    # A file saved for training may truncate or pad what it encodes; a server counts a prompt whole,
    # unpadded.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return data, tokenizer


def _not_a_tokenizer(path: Path, what: str, doing: str, exc: Exception) -> ScenarioError:
    first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    return ScenarioError(
        f"{path}: {what}: expected a Hugging Face tokenizer.json, got an error {doing}: {first}"
    )
