"""Generation engines for `build_corpus`: `hf` (in-process), `vllm` (a `vllm serve` the stage starts)
and `openai` (already-running OpenAI-compatible servers, one replica per node).

Every engine takes a list of `Request`s, each with its own sampling params and seed, and returns one
`Result` per request, in order. Results carry token ids as the engine produced them (never
re-tokenised text when the engine can return ids), so the corpus holds exactly what the verifier
generated.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from transformers import GenerationConfig

from pipeline.config.corpus_config import CorpusConfig
from pipeline.config.sampling_config import SamplingConfig
from pipeline.integrity import stop_token_ids


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]  # the ids the verifier conditions on (templated ids for a chat prompt)
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    # A chat prompt's user turn: servers get it as a chat message and apply the template themselves.
    chat_text: str | None = None


@dataclass(frozen=True)
class Result:
    prompt_ids: list[int]  # what the engine actually conditioned on (a server's templated ids for chat)
    response_ids: list[int]  # includes the EOS token when finish_reason is 'eos'
    finish_reason: str  # 'eos' | 'length'
    retokenized: bool = False  # the server returned text only, so the ids are our tokenisation of it


class Engine(Protocol):
    def describe(self) -> dict:
        """Name, version and settings, recorded in the corpus stats."""

    def generate(self, requests: Sequence[Request], on_done: Callable[[int], None]) -> list[Result]:
        """One result per request, in order; `on_done(n)` reports progress."""


def served_generation_config(location: str) -> GenerationConfig | None:
    """The verifier's generation_config.json, when it has one (its end ids)."""
    try:
        return GenerationConfig.from_pretrained(location, local_files_only=True)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def open_engine(config: CorpusConfig, *, model_location: str, dtype: str, tokenizer, log_dir: Path,
                model=None, trust_remote_code: bool = False) -> Iterator[Engine]:
    """The configured engine, ready to generate; a server the engine started is stopped on exit."""
    if config.engine == "hf":
        from data_prep.engines.hf import HFEngine

        yield HFEngine(model, tokenizer, config.batch_size)
        return
    from data_prep.engines.openai_client import OpenAIEngine

    stop_ids = stop_token_ids(served_generation_config(model_location), tokenizer)
    if config.engine == "openai":
        yield OpenAIEngine(config.endpoints, tokenizer, config, name="openai", stop_ids=stop_ids)
        return
    from data_prep.engines.vllm_server import vllm_server

    with vllm_server(model_location, config.vllm, dtype=config.vllm.dtype or dtype,
                     log_path=log_dir / "vllm-serve.log", trust_remote_code=trust_remote_code) as server:
        engine = OpenAIEngine([server.url], tokenizer, config, name="vllm", stop_ids=stop_ids)
        engine.settings["vllm"] = {**config.vllm.model_dump(mode="json"), "dtype": server.dtype}
        yield engine
