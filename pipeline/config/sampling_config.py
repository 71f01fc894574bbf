"""How tokens are drawn (`pipeline/sampling.py`): shared by the corpus, the decoding loop and evaluation."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.section import Section


class SamplingConfig(Section):
    """How tokens are drawn (pipeline/sampling.py); temperature 0 is greedy."""

    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
