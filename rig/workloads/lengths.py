"""Lengths in tokens without a tokenizer: a chars-per-token heuristic and clipped lognormal draws.

The rig never tokenizes (token counts come from the server), so target lengths are converted to characters:

* ``TEXT_CHARS_PER_TOKEN = 4.5``: our own English text (rig/workloads/data/chat.json) has 6.0 characters per
  whitespace-separated word (measured with ``str.split``); English BPE tokenizers give about 4 tokens per 3 words
  (the common "a token is 3/4 of a word" rule), so 6.0 / 1.33 = 4.5 characters per token.
* ``CODE_CHARS_PER_TOKEN = 3.5``: Python standard-library source has 3.8 characters per lexical piece (identifiers,
  numbers, punctuation marks, newlines and indentation runs, measured with a regex over 200 stdlib modules); BPE
  tokenizers split long identifiers into several tokens, so we use a little less.

These are estimates for shaping prompts; the server's ``prompt_tokens`` is what the records hold and what analysis
uses. Both constants can be overridden per workload (``text_chars_per_token`` / ``code_chars_per_token``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TEXT_CHARS_PER_TOKEN = 4.5
CODE_CHARS_PER_TOKEN = 3.5
# No prompt, output or tool result is longer (tokens); bigger is a typo that would eat memory. The spec's lengths and a
# dataset's max_tokens both hold to it.
MAX_TOKENS_LIMIT = 1_000_000

if TYPE_CHECKING:  # numpy loads when lengths are drawn: WorkloadSpec (and so the CLI) is imported without it
    import numpy as np


class Dist(BaseModel):
    """A clipped lognormal: ``median * exp(sigma * N(0, 1))`` limited to [min, max]; sigma 0 is a constant."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    median: float = Field(ge=0)
    sigma: float = Field(0.0, ge=0, le=4)  # beyond 4 the clip bounds are the distribution
    min: float = Field(0.0, ge=0)
    max: float = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _constant(cls, data: Any) -> Any:
        # A bare number is a constant: convenient in YAML (`chat_output_tokens: 256`) and on the command line.
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"median": data, "sigma": 0.0, "min": data, "max": data}
        return data

    @model_validator(mode="after")
    def _ordered(self) -> Dist:
        if self.min > self.max:
            raise ValueError(f"min ({self.min:g}) must not exceed max ({self.max:g})")
        if not self.min <= self.median <= self.max:
            raise ValueError(f"median ({self.median:g}) must lie within [min, max] = [{self.min:g}, {self.max:g}]")
        return self


def draw(dist: Dist, rng: np.random.Generator) -> float:
    """One draw of ``median * exp(sigma * N(0, 1))`` clipped to [min, max]."""
    import numpy as np

    # Always consume exactly one normal, even for sigma 0, so the draws after it do not shift.
    z = rng.standard_normal()
    return float(min(max(dist.median * float(np.exp(dist.sigma * z)), dist.min), dist.max))


def draw_int(dist: Dist, rng: np.random.Generator) -> int:
    """``draw`` rounded to an integer, still within [min, max]."""
    import numpy as np

    return int(min(max(round(draw(dist, rng)), np.ceil(dist.min)), np.floor(dist.max)))


def tokens_to_chars(tokens: float, chars_per_token: float) -> int:
    """Characters of text that make roughly ``tokens`` tokens."""
    return max(1, int(round(tokens * chars_per_token)))


def estimate_tokens(text: str, chars_per_token: float) -> int:
    """Rough token count of ``text`` under the heuristic (for metadata only; never a substitute for the server's)."""
    return max(1, int(round(len(text) / chars_per_token)))
