"""Tokens without a tokenizer: a word-level tokenizer, a content score, and deterministic output token streams.

The sim has no model weights, so "text" is a stand-in. What matters is that counts are stable (the same text always
has the same token count), that output round-trips (the reply, resent as part of the next prompt, tokenizes to the
same ids, so the prefix cache hits), and that greedy output is a function of the prompt alone.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import zlib

EOS_TOKEN_ID = 151645  # what finish_reason.matched reports for a natural stop
_TOKEN_RE = re.compile(r"<\|[A-Za-z_]+\|>|\w+|[^\w\s]")
# Punctuation that is common in code and rare in prose (',', '.', '!', '?' are left out on purpose).
_CODE_CHARS = frozenset("{}()[];=<>:_\"'#/*+-|&%$@`\\^~")

_WORDS = (  # noqa: SIM905 (a word list reads best as one string)
    "the of and to in is that for it as with was on be by this are from at or an which not have has but they "
    "more can their all one also were been other its when time model system data first two new each used some "
    "than these may into most only over such use between after many where under both through during under while "
    "value result process state number order level form point case part group work line set rate load request "
    "server token batch cache memory draft target step length output input query answer reason example method "
    "result design change test speed throughput latency queue table figure measure report detail context prompt "
    "simple large small long short high low early late fast slow clear exact known given common general specific "
    "because however therefore instead although whereas unless until since before above below across along "
    "describe explain compare consider include provide require allow follow produce reduce increase improve"
).split()
_CODE = (  # noqa: SIM905
    "def return if else for while in import from self None True False class int str list dict len range print "
    "x y i j n k value result data key item node = == != < > ( ) [ ] { } : ; . , + - * / # ' \""
).split()


def tokenize(text: str) -> list[str]:
    """Split text into word-level tokens: special markers, words, single punctuation characters."""
    return _TOKEN_RE.findall(text)


def token_id(tok: str) -> int:
    """A stable id for a token string (the same in every process)."""
    return 1000 + zlib.crc32(tok.encode()) % 150000


def token_ids(text: str) -> list[int]:
    return [token_id(t) for t in tokenize(text)]


def stable_hash(*parts: object) -> int:
    """A 63-bit hash of the parts' reprs that does not change between processes (unlike hash())."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big") >> 1


def content_score(tokens: list[str]) -> float:
    """How predictable the content is, 0 (varied prose) .. 1 (code or repetitive text), from the prompt's tokens.

    Two cheap signals: the share of code punctuation, and the share of repeated word bigrams (templated or
    repetitive text). Prose has few of either.
    """
    toks = tokens[-4096:]
    n = len(toks)
    if n < 4:
        return 0.2
    code_frac = sum(1 for t in toks if t in _CODE_CHARS) / n
    bigrams = list(zip(toks, toks[1:], strict=False))
    rep = 1.0 - len(set(bigrams)) / len(bigrams)
    code_s = min(1.0, code_frac / 0.25)
    rep_s = min(1.0, rep / 0.5)
    return 1.0 - (1.0 - code_s) * (1.0 - rep_s)


def natural_length(seed: int, score: float, median: float, slope: float, sigma: float) -> int:
    """Where the model would emit EOS: log-normal around a content-dependent median, fixed by the seed."""
    z = random.Random(seed ^ 0x5EED).gauss(0.0, 1.0)
    return max(1, int(round(math.exp(math.log(median) + slope * (score - 0.5) + sigma * z))))


class OutputStream:
    """The tokens a request generates, in order; the same seed always gives the same sequence.

    ``loop_from``: from this token on the output repeats its last ``period`` tokens (greedy decoding past its
    natural end with EOS ignored). ``eos_at``: the token at this 1-based position is EOS (natural stop).
    """

    __slots__ = ("_rng", "_code_p", "ids", "pieces", "loop_from", "period", "eos_at")

    def __init__(self, seed: int, score: float, loop_from: int | None, period: int, eos_at: int | None):
        self._rng = random.Random(seed)
        self._code_p = 0.8 * score if score > 0.5 else 0.0  # prose prompts answer in words
        self.ids: list[int] = []
        self.pieces: list[str] = []
        self.loop_from = loop_from
        self.period = max(1, min(period, loop_from)) if loop_from else period
        self.eos_at = eos_at

    def extend(self, n: int) -> tuple[list[int], str]:
        """Generate the next n tokens; return their ids and the text they add."""
        ids, pieces, rng = self.ids, self.pieces, self._rng
        start = len(ids)
        for pos in range(start, start + n):
            if self.eos_at is not None and pos + 1 == self.eos_at:
                ids.append(EOS_TOKEN_ID)
                pieces.append("")  # EOS is a special token: counted, not rendered
                continue
            if self.loop_from is not None and pos >= self.loop_from:
                j = self.loop_from - self.period + (pos - self.loop_from) % self.period
                ids.append(ids[j])
                pieces.append(pieces[j])
                continue
            word = rng.choice(_CODE) if rng.random() < self._code_p else rng.choice(_WORDS)
            ids.append(token_id(word))
            pieces.append(" " + word)
        return ids[start:], "".join(pieces[start:])


def render_chat(messages: list[dict]) -> str:
    """The chat template (Qwen style) the prompt is tokenized through."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)
