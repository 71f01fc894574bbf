"""Stage `bootstrap_verifier`: train the offline demo verifier, or record an external one.

`verifier.source: bootstrap` trains a byte-level BPE tokenizer and a small `Qwen3ForCausalLM` on the
standard library's source and documentation for a fixed number of steps from a fixed seed (same
params, same weights), checks its greedy continuations of held-in test prompts for loops, and saves
a normal HF checkpoint dir. `verifier.source: hf` only checks that the named local model loads and
records its path and content hash (no copy).

Design: docs/algorithms.md#verifier.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch
from transformers import (
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from data_prep.continuation import generate_batch
from data_prep.sources import split_of, stable_hash, stdlib_code_prompts, stdlib_text_prompts
from data_prep.stdlib_text import collect_stdlib_texts
from data_prep.tokenizer import train_bpe_tokenizer
from data_prep.verifier import load_model_and_tokenizer
from pipeline.atomic import atomic_dir, write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.corpus_config import SplitConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import BootstrapConfig, VerifierConfig
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary, progress
from pipeline.verifier_record import configured_location, write_record


class VerifierParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()

VALIDATION_FRACTION = 50  # 1/50 of each stream, its tail (whole modules/topics unseen in training)
VALIDATION_BATCHES = 4
# Prose paragraphs are grouped into documents so EOS is rare in prose, as in real text: with one
# paragraph per document the verifier learns to stop after a sentence or two and text drafts starve.
PARAGRAPHS_PER_DOCUMENT = 8
# The quality bar of the demo verifier: below it, drafters mostly learn to copy loops.
TARGET_VAL_LOSS = 4.0
TARGET_DISTINCT_4GRAM = 0.5
# Loop check: greedy continuations of the corpus's default test-split prompts, as build_corpus sees them.
PROBE_PROMPTS_PER_DOMAIN = 16
PROBE_PROMPT_TOKENS = 96
PROBE_NEW_TOKENS = 64


# --------------------------------------------------------------------------- data


def token_streams(docs: list[str], tokenizer: PreTrainedTokenizerBase, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) token streams: documents joined with EOS; the last 2% is held out."""
    eos = tokenizer.eos_token_id
    stream = [token for ids in tokenizer(docs, add_special_tokens=False)["input_ids"] for token in ids + [eos]]
    held_out = max(len(stream) // VALIDATION_FRACTION, 4 * seq_len)
    if len(stream) < 2 * held_out:
        raise DraftlineError(
            f"only {len(stream)} tokens of stdlib text; raise verifier.bootstrap.max_corpus_chars or lower seq_len"
        )
    tensor = torch.tensor(stream, dtype=torch.long)
    return tensor[:-held_out], tensor[-held_out:]


def training_batches(stream: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless batches of non-overlapping windows, each window once per epoch in a seeded order.

    Epoch e starts its windows at a seeded offset, so later epochs cut the stream at new places.
    """
    while True:
        offset = int(torch.randint(0, length, (1,), generator=generator))
        count = (len(stream) - offset) // length
        windows = stream[offset : offset + count * length].view(count, length)
        order = torch.randperm(count, generator=generator)
        for first in range(0, count - batch + 1, batch):
            yield windows[order[first : first + batch]]


def fixed_windows(stream: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """Evenly spaced validation windows, the same at every evaluation."""
    usable = len(stream) - length
    step = max(1, usable // count)
    return torch.stack([stream[i * step : i * step + length] for i in range(count)])


# --------------------------------------------------------------------------- model and schedule


def build_model(config: BootstrapConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model_config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3ForCausalLM(model_config)


def make_schedule(optimizer: torch.optim.Optimizer, config: BootstrapConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine to 10% exactly at `max_steps` (transformers' schedule, as the drafters use)."""
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, config.warmup_steps, config.max_steps,
                                                       min_lr_rate=0.1)


def make_optimizer(model: torch.nn.Module, config: BootstrapConfig) -> torch.optim.AdamW:
    # fused: one kernel over all parameters instead of a dozen small ops per tensor
    return torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95),
                             weight_decay=0.1, fused=True)


def train_step(model: Qwen3ForCausalLM, optimizer: torch.optim.Optimizer, batch: torch.Tensor,
               config: BootstrapConfig) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.autocast_bf16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with `count` intra-op threads, then restore the caller's setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@torch.no_grad()
def mean_loss(model: Qwen3ForCausalLM, windows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    losses = [model(input_ids=chunk, labels=chunk).loss.item() for chunk in windows.split(batch_size)]
    model.train()
    return sum(losses) / len(losses)


def train(model: Qwen3ForCausalLM, config: BootstrapConfig, train_stream: torch.Tensor,
          validation: dict[str, torch.Tensor], seed: int) -> dict:
    """Exactly `max_steps` steps; past `max_time_s` it raises instead of returning a shorter run."""
    batches = training_batches(train_stream, config.batch_size, config.seq_len, torch.Generator().manual_seed(seed))
    optimizer = make_optimizer(model, config)
    schedule = make_schedule(optimizer, config)
    model.train()
    start, cpu_start = time.perf_counter(), time.process_time()
    history: list[dict] = []
    running = None
    bar = progress(desc="bootstrap verifier", total=config.max_steps, unit="step")
    for step in range(1, config.max_steps + 1):
        elapsed = time.perf_counter() - start
        if elapsed > config.max_time_s:
            bar.close()
            raise DraftlineError(
                f"bootstrap verifier: {step - 1} of {config.max_steps} steps took {elapsed:.0f} s, over "
                f"verifier.bootstrap.max_time_s={config.max_time_s:g}; lower max_steps or raise max_time_s"
            )
        loss = train_step(model, optimizer, next(batches), config)
        schedule.step()
        running = loss if running is None else 0.95 * running + 0.05 * loss
        bar.update(1)
        bar.set_postfix(loss=f"{running:.3f}")
        if step % config.eval_every == 0 or step == config.max_steps:
            history.append(_evaluate(model, config, validation, step, running, start))
    bar.close()
    model.eval()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = config.max_steps * config.batch_size * config.seq_len
    # per CPU-second as well: on a shared machine it says what an unloaded run would take
    info(f"trained {tokens:,} tokens in {seconds:.0f} s: {tokens / seconds:,.0f} tokens/s, "
         f"{tokens / cpu_seconds:,.0f} per CPU-second")
    return {"steps": config.max_steps, "tokens": tokens, "history": history,
            "timing": {"train_seconds": round(seconds, 1), "tokens_per_second": round(tokens / seconds),
                       "tokens_per_cpu_second": round(tokens / cpu_seconds)}}


def _evaluate(model, config: BootstrapConfig, validation: dict[str, torch.Tensor], step: int,
              running: float, start: float) -> dict:
    """Losses only: everything in bootstrap.json is a function of the params, so the dir hash is too."""
    losses = {domain: round(mean_loss(model, windows, config.batch_size), 4) for domain, windows in validation.items()}
    entry = {"step": step, "train_loss": round(running, 4), **{f"val_loss_{domain}": value for domain, value in losses.items()}}
    info(f"step {step} ({time.perf_counter() - start:.0f} s): train loss {running:.3f}, " +
         ", ".join(f"val loss {domain} {value:.3f}" for domain, value in losses.items()))
    return entry


# --------------------------------------------------------------------------- loop check


@functools.lru_cache(maxsize=1)  # parsing the whole stdlib takes ~10 s; the answer never changes
def probe_prompts(per_domain: int) -> dict[str, list[str]]:
    """Test-split prompts of the built-in corpus sources (default split), a fixed spread sample."""
    sources = {"code": stdlib_code_prompts(), "text": stdlib_text_prompts()}
    chosen = {}
    for domain, prompts in sources.items():
        test = [text for text in dict.fromkeys(prompts) if split_of(text, SplitConfig()) == "test"]
        chosen[domain] = sorted(test, key=lambda text: stable_hash(text, "verifier-probe"))[:per_domain]
    return chosen


def distinct_4gram_ratio(sequences: list[list[int]]) -> float:
    """Distinct 4-grams over all 4-grams, pooled over the sequences (each counted within itself)."""
    distinct = total = 0
    for tokens in sequences:
        grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
        distinct += len(set(grams))
        total += len(grams)
    return distinct / total if total else 0.0


def loop_check(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerBase, prompts: dict[str, list[str]]) -> dict:
    """Per domain: distinct-4gram ratio of greedy continuations (EOS excluded) and two samples."""
    result = {}
    for domain, texts in prompts.items():
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"][-PROBE_PROMPT_TOKENS:] for text in texts]
        outputs = generate_batch(model, ids, max_new_tokens=PROBE_NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        responses = [[t for t in out.response_ids if t != tokenizer.eos_token_id] for out in outputs]
        result[domain] = {
            "prompts": len(texts),
            "distinct_4gram": round(distinct_4gram_ratio(responses), 4),
            "mean_new_tokens": round(sum(map(len, responses)) / max(1, len(responses)), 1),
            "samples": [{"prompt": text[-200:], "continuation": tokenizer.decode(response)}
                        for text, response in zip(texts[:2], responses[:2])],
        }
    return result


def targets(final: dict, loops: dict) -> dict:
    checks = {}
    for domain in loops:
        loss, ratio = final[f"val_loss_{domain}"], loops[domain]["distinct_4gram"]
        checks[f"val_loss_{domain}"] = {"value": loss, "target": f"<= {TARGET_VAL_LOSS}", "met": loss <= TARGET_VAL_LOSS}
        checks[f"distinct_4gram_{domain}"] = {"value": ratio, "target": f">= {TARGET_DISTINCT_4GRAM}",
                                              "met": ratio >= TARGET_DISTINCT_4GRAM}
    return checks


# --------------------------------------------------------------------------- stage


def bootstrap(params: VerifierParams, paths: ArtifactPaths) -> None:
    config = params.verifier.bootstrap
    seed = params.project.seed
    stage_start = time.perf_counter()
    texts = collect_stdlib_texts(config.max_corpus_chars)
    info(f"stdlib text: {len(texts.code)} code chunks, {len(texts.prose)} prose paragraphs, {texts.chars:,} chars")
    tokenizer = train_bpe_tokenizer(texts.code + texts.prose, config.vocab_size)
    code_train, code_val = token_streams(texts.code, tokenizer, config.seq_len)
    prose_documents = [
        "\n\n".join(texts.prose[start : start + PARAGRAPHS_PER_DOCUMENT])
        for start in range(0, len(texts.prose), PARAGRAPHS_PER_DOCUMENT)
    ]
    prose_train, prose_val = token_streams(prose_documents, tokenizer, config.seq_len)
    train_stream = torch.cat([code_train, prose_train])
    windows = VALIDATION_BATCHES * config.batch_size
    validation = {"code": fixed_windows(code_val, windows, config.seq_len),
                  "text": fixed_windows(prose_val, windows, config.seq_len)}
    info(f"tokens: {len(train_stream):,} train, {len(code_val) + len(prose_val):,} validation "
         f"(vocab {len(tokenizer)}); {config.max_steps} steps of {config.batch_size} x {config.seq_len}")
    with torch_threads(config.threads):
        model = build_model(config, tokenizer, seed)
        result = train(model, config, train_stream, validation, seed)
        loops = loop_check(model, tokenizer, probe_prompts(PROBE_PROMPTS_PER_DOMAIN))
    timing = result.pop("timing")  # printed, not saved: wall time would make every run's hash differ
    final = result["history"][-1]
    checks = targets(final, loops)
    with atomic_dir(paths.verifier) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / "bootstrap.json", {"params": config.model_dump(mode="json"), **result,
                                                   "loop_check": loops, "targets": checks})
        record = write_record(tmp, source="bootstrap", name_or_path=str(paths.verifier),
                              id_prefix=f"bootstrap-qwen3-{config.num_layers}l{config.hidden_size}d")
    print_summary("bootstrap_verifier", {
        "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M",
        "layers x width": f"{config.num_layers} x {config.hidden_size}",
        "steps": result["steps"], "train tokens": f"{result['tokens']:,}",
        "train tokens/s": f"{timing['tokens_per_second']:,} ({timing['tokens_per_cpu_second']:,} per CPU-second)",
        "train loss": final["train_loss"],
        **{name.replace("_", " "): f"{check['value']} (target {check['target']}: {'met' if check['met'] else 'MISSED'})"
           for name, check in checks.items()},
        "train seconds": timing["train_seconds"], "stage seconds": round(time.perf_counter() - stage_start, 1),
        "id": record["id"], "output": str(paths.verifier),
    })


def resolve_external(config: VerifierConfig) -> Path:
    """A local directory, or the snapshot of a model already in the local HF cache."""
    location = Path(config.name_or_path).expanduser()
    if location.is_dir():
        # checked before anything reads the tree: `/` would otherwise be walked file by file
        if not (location / "config.json").is_file():
            raise DraftlineError(f"verifier.name_or_path '{config.name_or_path}' is a directory but not a model "
                                 "checkpoint (no config.json in it); point it at the directory holding the model")
        return location.resolve()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(config.name_or_path, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        raise DraftlineError(
            f"verifier '{config.name_or_path}' is neither a local directory nor a model in the local HF cache; "
            "set verifier.name_or_path to a downloaded checkpoint"
        ) from None


def check_tokenizer_fits(location: Path, tokenizer: PreTrainedTokenizerBase, embedding_rows: int) -> None:
    """Every later stage tokenizes with the verifier's tokenizer. A directory without tokenizer files still
    loads one (transformers builds an empty tokenizer for the model type), and build_corpus would then write
    an empty corpus; ids past the embedding rows are an IndexError mid-stage."""
    if not tokenizer("The verifier's tokenizer encodes text.", add_special_tokens=False)["input_ids"]:
        raise DraftlineError(f"verifier {location}: its tokenizer encodes text to no ids (no tokenizer files in the "
                             "directory?); save the model's tokenizer there (tokenizer.save_pretrained)")
    if len(tokenizer) > embedding_rows:
        raise DraftlineError(f"verifier {location}: its tokenizer has {len(tokenizer)} ids but the model has "
                             f"{embedding_rows} embedding rows (ids past them cannot be embedded); use the "
                             "tokenizer the model was trained with")


def record_external(params: VerifierParams, paths: ArtifactPaths) -> None:
    config = params.verifier
    location = resolve_external(config)
    model, tokenizer = load_model_and_tokenizer(str(location), config.dtype, config.trust_remote_code,
                                                config.allow_pickle_weights)
    check_tokenizer_fits(location, tokenizer, model.get_input_embeddings().num_embeddings)
    with atomic_dir(paths.verifier) as tmp:
        record = write_record(tmp, source="hf", name_or_path=str(location), id_prefix=Path(config.name_or_path).name,
                              trust_remote_code=config.trust_remote_code, model_dir=location,
                              configured=configured_location(config))
    print_summary("bootstrap_verifier (external)", {
        "model": type(model).__name__, "path": str(location),
        "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M", "id": record["id"],
    })


def run(params: VerifierParams, args: argparse.Namespace) -> None:
    paths = ArtifactPaths.from_params(params)
    if params.verifier.source == "hf":
        record_external(params, paths)
    else:
        bootstrap(params, paths)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline bootstrap_verifier", __doc__.splitlines()[0])
    return run_stage(parser, VerifierParams, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
