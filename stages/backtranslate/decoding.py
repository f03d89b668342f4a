"""Decoding settings shared by both engines, and the canonical labels the candidates record.

Labels (the ``decoding`` column): ``greedy``; ``beam(4)``; ``sample(top_k=50,top_p=0.95,
temperature=1.0)``. When one decoding returns several candidates per input (``n > 1``), each
candidate's label ends with ``#<index>`` (``sample(...)#0``, ``sample(...)#1``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Decoding(BaseModel):
    """One way to decode: greedy, beam search, or random sampling with ``n`` candidates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: Literal["greedy", "beam", "sample"] = "greedy"
    beams: int = Field(4, ge=1, description="beam width (beam only)")
    n: int = Field(1, ge=1, description="candidates per input: samples, or best beam hypotheses")
    top_k: int = Field(0, ge=0, description="sample only from the k most likely tokens; 0: all")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1.0: off")
    temperature: float = Field(1.0, gt=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> Decoding:
        if self.strategy == "greedy" and self.n != 1:
            raise ValueError(
                "greedy decoding gives one candidate: n must be 1 (use sample or beam)"
            )
        if self.strategy == "beam" and self.n > self.beams:
            raise ValueError(f"beam: n ({self.n}) must not exceed beams ({self.beams})")
        return self

    def label(self) -> str:
        """The canonical label (without the ``#index`` suffix)."""
        if self.strategy == "greedy":
            return "greedy"
        if self.strategy == "beam":
            return f"beam({self.beams})"
        return f"sample(top_k={self.top_k},top_p={self.top_p},temperature={self.temperature})"

    def candidate_labels(self) -> list[str]:
        """One label per returned candidate."""
        base = self.label()
        return [base] if self.n == 1 else [f"{base}#{i}" for i in range(self.n)]

    def cache_fields(self) -> dict[str, Any]:
        """What makes two decodings give different outputs (fields that do not matter dropped)."""
        if self.strategy == "greedy":
            return {"strategy": "greedy"}
        if self.strategy == "beam":
            return {"strategy": "beam", "beams": self.beams, "n": self.n}
        return {
            "strategy": "sample",
            "n": self.n,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "temperature": self.temperature,
        }

    @property
    def stochastic(self) -> bool:
        return self.strategy == "sample"


GREEDY = Decoding()


class Lengths(BaseModel):
    """Length limits in tokens. The output limit of a batch is ``max_length``, lowered to
    ``ceil(max_length_ratio * longest source) + 8`` when a ratio is set; ``min_length`` > 0
    forbids ending earlier (the benchmark sets min = max to make every engine do equal work)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_input_tokens: int = Field(256, ge=2)
    max_length: int = Field(256, ge=1)
    max_length_ratio: float | None = Field(2.0, gt=0.0)
    min_length: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _order(self) -> Lengths:
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length ({self.min_length}) must not exceed max_length ({self.max_length})"
            )
        return self

    def output_limit(self, longest_source: int) -> int:
        limit = self.max_length
        if self.max_length_ratio is not None:
            limit = min(limit, math.ceil(self.max_length_ratio * longest_source) + 8)
        return max(limit, self.min_length, 1)
