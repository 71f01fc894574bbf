"""`corpus`: prompt sources, the generation engine, sampling and splits of stage `build_corpus`."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, StrictBool, field_validator, model_validator

from pipeline.config.base import STDLIB_DOMAINS, DomainName, Seed
from pipeline.config.sampling_config import SamplingConfig
from pipeline.config.section import Section
from pipeline.config.vllm_config import VllmConfig
from pipeline.errors import redact_url


class PromptSourceConfig(Section):
    """One prompt source, mapped to (prompt, domain).

    `kind`: `stdlib_code` / `stdlib_text` are built in and offline; `file` reads JSON/JSONL/JSONL.GZ/
    Parquet; `hf` loads a dataset by name from the local HF cache.
    """

    kind: Literal["stdlib_code", "stdlib_text", "file", "hf"]
    domain: Optional[DomainName] = None
    path: Optional[str] = None
    name: Optional[str] = None
    subset: Optional[str] = None
    split: str = "train"
    prompt_field: str = "prompt"
    domain_field: Optional[str] = None
    limit: Optional[int] = Field(None, ge=1)
    # Prompts are user turns (MT-Bench style): with a chat-template verifier they are sent as chat
    # messages and the stored prompt ids are the templated ids.
    chat: StrictBool = False

    @model_validator(mode="after")
    def _kind_fields(self) -> "PromptSourceConfig":
        if self.kind == "file" and not self.path:
            raise ValueError("a 'file' source needs 'path'")
        if self.kind == "hf" and not self.name:
            raise ValueError("an 'hf' source needs 'name'")
        if self.kind in ("file", "hf") and self.domain is None and self.domain_field is None:
            raise ValueError("a 'file'/'hf' source needs 'domain' or 'domain_field'")
        return self

    @property
    def fixed_domain(self) -> str | None:
        """The domain of every prompt of this source; None when a record field decides it."""
        return None if self.domain_field else self.domain or STDLIB_DOMAINS.get(self.kind)


class SplitConfig(Section):
    validation: float = Field(0.1, ge=0.0, lt=0.5)
    test: float = Field(0.1, ge=0.0, lt=0.5)

    @model_validator(mode="after")
    def _leaves_training_data(self) -> "SplitConfig":
        if self.validation + self.test > 0.5:
            raise ValueError(
                f"validation + test = {self.validation + self.test:g} leaves less than half the prompts to train on; "
                "keep their sum <= 0.5"
            )
        return self


class CorpusConfig(Section):
    sources: list[PromptSourceConfig] = Field(
        default_factory=lambda: [
            PromptSourceConfig(kind="stdlib_code", domain="code"),
            PromptSourceConfig(kind="stdlib_text", domain="text"),
        ],
        min_length=1,
    )
    max_prompts_per_domain: Union[int, dict[DomainName, int]] = Field(
        400, description="one limit for every domain, or a limit per domain name (domains left out: no limit)"
    )
    prompt_max_tokens: int = Field(96, ge=4)
    max_new_tokens: int = Field(64, ge=1)
    # Sampled like the traffic the drafter will serve, with half the prompts greedy for the T=0 case.
    sampling: SamplingConfig = SamplingConfig(temperature=0.8, top_k=50)
    greedy_share: float = Field(
        0.5, ge=0.0, le=1.0,
        description="fraction of prompts (chosen by id) answered greedily whatever `sampling` says",
    )
    batch_size: int = Field(16, ge=1)
    shard_size: int = Field(64, ge=1)
    seed: Seed = 0
    split: SplitConfig = SplitConfig()
    # hf: generate in-process (the demo); vllm: start `vllm serve` from .venv-serve for the stage;
    # openai: already-running OpenAI-compatible servers listed in `endpoints` (one replica per node)
    engine: Literal["hf", "vllm", "openai"] = "hf"
    vllm: VllmConfig = VllmConfig()
    endpoints: list[str] = Field(default_factory=list, description="base URLs, e.g. http://node1:8000/v1")
    concurrency: int = Field(64, ge=1, description="requests in flight per endpoint")
    request_timeout_s: float = Field(600.0, gt=0)
    retries: int = Field(4, ge=0, description="per request, with exponential backoff, before an endpoint counts as down")

    @model_validator(mode="after")
    def _openai_needs_endpoints(self) -> "CorpusConfig":
        if self.engine == "openai" and not self.endpoints:
            raise ValueError("corpus.engine is 'openai' but corpus.endpoints is empty; list the servers' base URLs")
        for url in self.endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"corpus.endpoints: '{redact_url(url)}' is not an http(s) URL")
        return self

    @field_validator("max_prompts_per_domain")
    @classmethod
    def _positive_limits(cls, value: int | dict[str, int]) -> int | dict[str, int]:
        for domain, limit in (value.items() if isinstance(value, dict) else [("every", value)]):
            if limit < 1:
                raise ValueError(f"limit for domain '{domain}' must be >= 1, got {limit}")
        return value

    def prompt_limit(self, domain: str) -> int | None:
        limits = self.max_prompts_per_domain
        return limits.get(domain) if isinstance(limits, dict) else limits

    def domains(self) -> set[str] | None:
        """The domains the sources give; None when a source reads them from its records."""
        fixed = [source.fixed_domain for source in self.sources]
        return None if None in fixed else set(fixed)
