"""Stage `build_corpus`: the verifier continues every prompt; the responses become the corpus.

Work is cut into shards of `shard_size` prompts, each committed atomically under
`paths.corpus_shards/<fingerprint>/`. The fingerprint covers the verifier hash, the corpus params and
the exact prompt list, so a restart (even after SIGKILL) reuses only shards made for the same inputs,
and the final corpus equals an uninterrupted run's.

The verifier runs through `corpus.engine` (`data_prep.engines`): in-process HF generation, a `vllm
serve` the stage starts (only when some shard is left to generate), or running OpenAI-compatible
endpoints. Where the engine, its endpoints or its concurrency change between runs, finished shards
still count: only what decides the outputs is in the fingerprint.

Design: docs/algorithms.md#corpus.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import datasets
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from data_prep.corpus import COLUMNS, SPLITS, STATS_NAME
from data_prep.engines import Engine, Request, open_engine
from data_prep.sources import Prompt, collect_prompts, split_of, stable_hash
from data_prep.verifier import load_verifier
from pipeline.atomic import atomic_dir, write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.corpus_config import CorpusConfig
from pipeline.config.sampling_config import SamplingConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import load_pretrained
from pipeline.lineage import library_versions
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary, progress
from pipeline.stage_inputs import InputParams
from pipeline.verifier_record import model_location, read_record, verifier_identity


class CorpusParams(InputParams):
    """`verifier` and `corpus`: the sections whose named files are this stage's inputs too."""

FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "domain": datasets.Value("string"),
    "source": datasets.Value("string"),
    "prompt": datasets.Value("string"),
    "prompt_ids": datasets.Sequence(datasets.Value("int32")),
    "response_ids": datasets.Sequence(datasets.Value("int32")),
    "finish_reason": datasets.Value("string"),
    "temperature": datasets.Value("float32"),
    "seed": datasets.Value("int64"),
})


@dataclass(frozen=True)
class WorkItem:
    id: str
    domain: str
    source: str
    split: str
    prompt: str  # the (truncated) prompt text the verifier saw
    prompt_ids: tuple[int, ...]
    seed: int
    chat_text: str | None = None  # a chat prompt's (truncated) user turn, before the template


# A chat template is code that came with the verifier: jinja2's sandbox bounds what it can touch, not how
# long it runs or how much it writes, so rendering one prompt has a deadline and a size cap.
CHAT_TEMPLATE_TIMEOUT_S = 10.0
CHAT_TEMPLATE_MAX_CHARS = 1_000_000


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, user_text: str) -> list[int]:
    """The verifier's chat template around one user turn, ready for the assistant's answer."""
    outcome: list = []

    def render() -> None:
        try:
            outcome.append(tokenizer.apply_chat_template([{"role": "user", "content": user_text}],
                                                         add_generation_prompt=True, tokenize=False))
        except Exception as error:  # noqa: BLE001 - any template failure becomes the one line below
            outcome.append(error)

    # a daemon thread: one stuck in a template's loop is abandoned, and dies with the stage
    thread = threading.Thread(target=render, daemon=True)
    thread.start()
    thread.join(CHAT_TEMPLATE_TIMEOUT_S)
    fix = ("fix or remove the verifier's chat template (chat_template.jinja, or chat_template in tokenizer_config.json), "
           "or set chat: false on the source")
    if not outcome:
        raise DraftlineError(f"the verifier's chat template did not render within {CHAT_TEMPLATE_TIMEOUT_S:g} s; {fix}")
    if isinstance(outcome[0], Exception):
        lines = str(outcome[0]).strip().splitlines()
        raise DraftlineError(f"the verifier's chat template fails to render "
                             f"({lines[0] if lines else type(outcome[0]).__name__}); {fix}")
    if not isinstance(outcome[0], str) or len(outcome[0]) > CHAT_TEMPLATE_MAX_CHARS:
        raise DraftlineError(f"the verifier's chat template renders over {CHAT_TEMPLATE_MAX_CHARS} characters "
                             f"for one prompt; {fix}")
    return list(tokenizer(outcome[0], add_special_tokens=False)["input_ids"])


def served_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str, max_tokens: int) -> list[int]:
    """`text` encoded as a server encodes a prompt, with the special tokens the tokenizer adds (a Llama
    tokenizer's BOS), its text part cut to the last `max_tokens` tokens."""
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    full = tokenizer(text)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start] + plain[-max_tokens:] + full[start + len(plain):]
    return full[-max_tokens:]  # specials that change the text's own tokens: keep the tail as encoded


@dataclass
class PromptFit:
    """How many prompt text tokens an item keeps, and how many prompts the verifier's positions cut.

    A prompt plus its `max_new_tokens` response must fit the verifier's positions: a longer one would be
    answered past the positions the model was trained on, and such a row would teach the drafter noise."""

    limit: int
    positions: int | None = None
    room: int | None = None  # positions less max_new_tokens: the most prompt ids, special tokens included
    cut: int = 0  # prompts whose text was cut shorter than prompt_max_tokens to fit the positions
    dropped: int = 0  # prompts that did not fit even cut

    @classmethod
    def for_verifier(cls, config: CorpusConfig, positions: int | None) -> "PromptFit":
        if positions is None:
            return cls(config.prompt_max_tokens)
        room = positions - config.max_new_tokens
        if room < 1:
            raise DraftlineError(f"corpus.max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the "
                                 f"verifier's {positions} positions; lower it")
        return cls(min(config.prompt_max_tokens, room), positions, room)


def verifier_positions(location: str) -> int | None:
    """The verifier's positions from its config.json (None where it names none)."""
    try:
        config = json.loads((Path(location) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(section.get(key), int) and section[key] > 0:
                return section[key]
    return None


def prompt_ids_within(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, text_ids: list[int],
                      limit: int) -> tuple[list[int], str | None]:
    """The ids served for the last `limit` text tokens, and the chat turn they came from (None: plain)."""
    if prompt.chat and tokenizer.chat_template:
        chat_text = tokenizer.decode(text_ids[-limit:])
        return chat_prompt_ids(tokenizer, chat_text), chat_text
    return served_prompt_ids(tokenizer, prompt.prompt, limit), None


def work_items(config: CorpusConfig, tokenizer: PreTrainedTokenizerBase, fit: PromptFit | None = None) -> list[WorkItem]:
    """Prompts truncated to their last `prompt_max_tokens` tokens (fewer where `fit` says the verifier's
    positions need it), ordered by length so batches pad little.

    A prompt is encoded as the verifier is served: with the tokenizer's own special tokens (BOS), or,
    for a chat source when the verifier has a chat template, as the templated ids of its (truncated)
    user turn: the limit applies to the user's text, the template adds its own tokens.
    """
    fit = fit or PromptFit(config.prompt_max_tokens)
    items = []
    for prompt in collect_prompts(config):
        text_ids = tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"]
        if not text_ids:
            continue
        limit = fit.limit
        ids, chat_text = prompt_ids_within(tokenizer, prompt, text_ids, limit)
        if fit.room is not None and len(ids) > fit.room:  # the specials or template need room too
            limit -= len(ids) - fit.room
            if limit < 1:
                fit.dropped += 1
                continue
            ids, chat_text = prompt_ids_within(tokenizer, prompt, text_ids, limit)
            if len(ids) > fit.room:
                fit.dropped += 1
                continue
        if limit < config.prompt_max_tokens and len(text_ids) > limit:
            fit.cut += 1
        digest = hashlib.sha256(prompt.prompt.encode()).hexdigest()[:16]
        items.append(WorkItem(
            id=f"{prompt.domain}-{digest}", domain=prompt.domain, source=prompt.source,
            split=split_of(prompt.prompt, config.split), prompt=tokenizer.decode(ids), prompt_ids=tuple(ids),
            seed=stable_hash(digest, f"seed{config.seed}") % 2**31, chat_text=chat_text,
        ))
    return sorted(items, key=lambda item: (len(item.prompt_ids), item.id))


# How the engine is reached, not what it computes: changing these keeps finished shards valid.
RUNTIME_ONLY = {"endpoints": True, "concurrency": True, "request_timeout_s": True, "retries": True,
                "vllm": {"startup_timeout_s"}}


def fingerprint(verifier_hash: str, config: CorpusConfig, items: list[WorkItem]) -> str:
    digest = hashlib.sha256()
    digest.update(verifier_hash.encode())
    digest.update(json.dumps(config.model_dump(mode="json", exclude=RUNTIME_ONLY), sort_keys=True).encode())
    for item in items:
        digest.update(f"{item.id}:{item.split}:{item.seed}:{','.join(map(str, item.prompt_ids))}\n".encode())
    return digest.hexdigest()[:16]


def load_verifier_tokenizer(location: str, trust_remote_code: bool,
                            allow_pickle_weights: bool = False) -> PreTrainedTokenizerBase:
    return load_pretrained(AutoTokenizer.from_pretrained, Path(location), "the verifier's tokenizer",
                           "check verifier.name_or_path", trust_remote_code, allow_pickle_weights)


# --------------------------------------------------------------------------- shards


def shard_path(shard_dir: Path, index: int) -> Path:
    return shard_dir / f"shard-{index:05d}.json"


def _is_token_ids(ids: object, vocab_size: int) -> bool:
    return isinstance(ids, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids)


def row_problem(row: object, item: WorkItem, vocab_size: int, max_new_tokens: int) -> str | None:
    """Why a generated row cannot be in the corpus (None: it can). Checked before a shard is committed
    and again when a committed one is reused, so ids a bad server returned never stay."""
    if not isinstance(row, dict) or row.get("id") != item.id:
        return f"row for {item.id} is missing"
    for column in ("prompt_ids", "response_ids"):
        if not _is_token_ids(row.get(column), vocab_size):
            return f"{item.id}: {column} are not token ids of the verifier's vocabulary [0, {vocab_size})"
    if not row["prompt_ids"] or (item.chat_text is None and row["prompt_ids"] != list(item.prompt_ids)):
        return f"{item.id}: prompt_ids differ from the prompt that was sent"
    if len(row["response_ids"]) > max_new_tokens + 1:  # + the stop token the corpus keeps
        return f"{item.id}: {len(row['response_ids'])} response tokens for corpus.max_new_tokens {max_new_tokens}"
    if row.get("finish_reason") not in ("eos", "length"):
        return f"{item.id}: finish_reason {row.get('finish_reason')!r} is neither 'eos' nor 'length'"
    return None


def load_shard(path: Path, key: str, items: list[WorkItem], vocab_size: int, max_new_tokens: int) -> dict | None:
    """A committed shard, or None when it is damaged, holds rows no verifier could have generated, or
    does not match what this run would write."""
    try:
        shard = json.loads(path.read_text(encoding="utf-8"))
        valid = (shard["fingerprint"] == key and len(shard["rows"]) == len(items) and not any(
            row_problem(row, item, vocab_size, max_new_tokens) for row, item in zip(shard["rows"], items)))
    except (OSError, ValueError, KeyError, TypeError):
        valid = False
    return shard if valid else None


def item_sampling(config: CorpusConfig, item: WorkItem) -> SamplingConfig:
    """Greedy for a stable `greedy_share` of the prompts (chosen by id), `config.sampling` for the rest.

    Drafters are evaluated at T=0 too, and a block drafter's positions >= 2 only learn the verifier's
    greedy chain from responses that follow it.
    """
    if stable_hash(item.id, "greedy") % 10_000 < round(config.greedy_share * 10_000):
        return SamplingConfig(temperature=0.0)
    return config.sampling


def generate_shard(engine: Engine, config: CorpusConfig, items: list[WorkItem], bar) -> list[dict]:
    requests = [Request(item.prompt_ids, item_sampling(config, item), config.max_new_tokens, item.seed,
                        item.chat_text) for item in items]
    results = engine.generate(requests, bar.update)
    rows = []
    for item, request, result in zip(items, requests, results):
        rows.append({
            "id": item.id, "domain": item.domain, "source": item.source, "split": item.split,
            # a server's templated prompt is what the verifier saw, even where our template differs
            "prompt": item.prompt, "prompt_ids": result.prompt_ids,
            "response_ids": result.response_ids, "finish_reason": result.finish_reason,
            "temperature": request.sampling.temperature, "seed": item.seed,
            # for the stats only (not corpus columns)
            "retokenized": result.retokenized, "template_mismatch": result.prompt_ids != list(item.prompt_ids),
        })
    bar.set_postfix(tokens=sum(len(r["response_ids"]) for r in rows))
    return rows


def generate_all(start_engine, config: CorpusConfig, items: list[WorkItem], shard_dir: Path,
                 key: str, vocab_size: int) -> tuple[list[dict], int, list[dict], int]:
    """Rows for every item, reusing committed shards.

    Returns (rows, shards reused, the engines that made the shards, response tokens generated now).

    `start_engine()` is called only when a shard is left to generate: a full resume starts no server.
    """
    shards = [items[i : i + config.shard_size] for i in range(0, len(items), config.shard_size)]
    rows: list[dict] = []
    reused = 0
    engines: list[dict] = []
    engine = None
    generated_tokens = 0
    bar = progress(desc="build corpus", total=len(items), unit="prompt")
    for index, shard in enumerate(shards):
        path = shard_path(shard_dir, index)
        committed = load_shard(path, key, shard, vocab_size, config.max_new_tokens) if path.exists() else None
        if committed is not None:
            rows.extend(committed["rows"])
            description = committed.get("engine", {"name": "hf"})
            reused += 1
            bar.update(len(shard))
        else:
            if path.exists():
                info(f"corpus shard {path} is damaged or stale; regenerating only that shard")
            engine = engine or start_engine()
            description = engine.describe()
            shard_rows = generate_shard(engine, config, shard, bar)
            problem = next(filter(None, (row_problem(row, item, vocab_size, config.max_new_tokens)
                                         for row, item in zip(shard_rows, shard))), None)
            if problem:
                raise DraftlineError(f"corpus shard {index} not committed: {problem} ({description['name']} engine)")
            write_json_atomic(path, {"fingerprint": key, "index": index, "engine": description, "rows": shard_rows})
            rows.extend(shard_rows)
            generated_tokens += sum(len(row["response_ids"]) for row in shard_rows)
        if description not in engines:
            engines.append(description)
    bar.close()
    return rows, reused, engines, generated_tokens


def prepare_shard_dir(root: Path, key: str) -> Path:
    """This fingerprint's shard folder; folders of other fingerprints are stale and removed."""
    if root.exists():
        for stale in root.iterdir():
            if stale.name != key:
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    shard_dir = root / key
    shard_dir.mkdir(parents=True, exist_ok=True)
    return shard_dir


# --------------------------------------------------------------------------- dataset and stats


def build_dataset(rows: list[dict]) -> datasets.DatasetDict:
    """Content fingerprints (not the random in-memory default) so identical rows save to identical bytes."""
    splits = {}
    for split in SPLITS:
        columns = {column: [row[column] for row in rows if row["split"] == split] for column in COLUMNS}
        table = datasets.Dataset.from_dict(columns, features=FEATURES)
        content = hashlib.sha256(json.dumps(columns, sort_keys=True).encode()).hexdigest()[:16]
        splits[split] = datasets.Dataset(table.data, info=table.info, fingerprint=f"{split}-{content}")
    return datasets.DatasetDict(splits)


def roundtrip_mismatches(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> int:
    """Responses whose ids do not survive decode -> encode: re-tokenised text would have changed them."""
    return sum(
        tokenizer(tokenizer.decode(row["response_ids"]), add_special_tokens=False)["input_ids"] != row["response_ids"]
        for row in rows
    )


def corpus_stats(rows: list[dict]) -> dict:
    def summarise(group: list[dict]) -> dict:
        response_tokens = sum(len(row["response_ids"]) for row in group)
        return {
            "rows": len(group),
            "prompt_tokens": sum(len(row["prompt_ids"]) for row in group),
            "response_tokens": response_tokens,
            "mean_response_length": round(response_tokens / len(group), 3) if group else 0.0,
            "finish_reasons": dict(sorted(Counter(row["finish_reason"] for row in group).items())),
        }

    domains = sorted({row["domain"] for row in rows})
    by_split: dict[str, dict] = defaultdict(dict)
    for split in SPLITS:
        for domain in domains:
            by_split[split][domain] = summarise([r for r in rows if r["split"] == split and r["domain"] == domain])
    return {
        **summarise(rows),
        "by_domain": {domain: summarise([r for r in rows if r["domain"] == domain]) for domain in domains},
        "by_split": dict(by_split),
    }


def fit_summary(fit: PromptFit, config: CorpusConfig) -> dict:
    if not (fit.cut or fit.dropped):
        return {}
    return {f"prompts cut to fit {fit.positions} positions": f"{fit.cut} (to at most {fit.limit} tokens, not "
                                                              f"corpus.prompt_max_tokens={config.prompt_max_tokens})",
            "prompts left out (too long even cut)": fit.dropped}


def end_id_summary(stats: dict, rows: int) -> dict:
    """A verifier that never ends a response on one of its end ids (generation_config's eos_token_id) answers
    every prompt up to max_new_tokens: its responses then run through document boundaries."""
    if not rows or stats["finish_reasons"].get("eos", 0):
        return {}
    return {"responses ending on an end id": f"0 of {rows}: the verifier never produced an end id of its "
                                             "generation_config, so responses run through document boundaries"}


def run(params: CorpusParams, args: argparse.Namespace) -> None:
    config = params.corpus
    paths = ArtifactPaths.from_params(params)
    start = time.perf_counter()
    datasets.disable_progress_bars()  # one progress bar (ours) per stage
    record = read_record(paths)
    location = model_location(paths, record)
    if config.engine == "hf":
        model, tokenizer = load_verifier(paths, params.verifier.dtype, params.verifier.trust_remote_code,
                                         params.verifier.allow_pickle_weights)
    else:  # the server holds the model; this process needs only the tokenizer
        model, tokenizer = None, load_verifier_tokenizer(location, params.verifier.trust_remote_code,
                                                          params.verifier.allow_pickle_weights)
    identity = verifier_identity(paths)
    fit = PromptFit.for_verifier(config, verifier_positions(location))
    items = work_items(config, tokenizer, fit)
    key = fingerprint(identity["hash"], config, items)
    shard_dir = prepare_shard_dir(paths.corpus_shards, key)
    shard_count = -(-len(items) // config.shard_size)
    info(f"{len(items)} prompts in {shard_count} shards of {config.shard_size} (fingerprint {key}, engine {config.engine})")
    generation_start = time.perf_counter()
    startup_seconds = 0.0  # a server's start is not generation: tokens/s leaves it out
    with contextlib.ExitStack() as stack:
        def start_engine() -> Engine:
            nonlocal startup_seconds
            begin = time.perf_counter()
            engine = stack.enter_context(open_engine(config, model_location=location, dtype=params.verifier.dtype,
                                                     tokenizer=tokenizer, log_dir=paths.corpus_shards, model=model,
                                                     trust_remote_code=params.verifier.trust_remote_code))
            startup_seconds = time.perf_counter() - begin
            return engine

        rows, reused, engines, generated_tokens = generate_all(start_engine, config, items, shard_dir, key, len(tokenizer))
        generation_seconds = time.perf_counter() - generation_start - startup_seconds
    stats = corpus_stats(rows)
    stats.update({
        "verifier": identity, "fingerprint": key,
        "engine": engines[0] if len(engines) == 1 else engines,
        "sampling": {**config.sampling.model_dump(), "max_new_tokens": config.max_new_tokens,
                     "seed": f"per prompt (column 'seed', derived from corpus.seed={config.seed})"},
        "roundtrip_mismatches": roundtrip_mismatches(tokenizer, rows),
        "retokenized_responses": sum(bool(row.get("retokenized")) for row in rows),
        "chat_template_mismatches": sum(bool(row.get("template_mismatch")) for row in rows),
        "library_versions": library_versions(),
    })
    with atomic_dir(paths.corpus) as tmp:
        build_dataset(rows).save_to_disk(str(tmp))
        write_json_atomic(tmp / STATS_NAME, stats)
    summary = {split: sum(1 for r in rows if r["split"] == split) for split in SPLITS}
    print_summary("build_corpus", {
        "rows (train/validation/test)": "/".join(str(summary[s]) for s in SPLITS),
        "rows per domain": ", ".join(f"{domain} {entry['rows']}" for domain, entry in stats["by_domain"].items()),
        "response tokens": stats["response_tokens"],
        "mean response length": stats["mean_response_length"],
        "finish eos / length": f"{stats['finish_reasons'].get('eos', 0)} / {stats['finish_reasons'].get('length', 0)}",
        **fit_summary(fit, config),
        **end_id_summary(stats, len(rows)),
        "shards reused": f"{reused} / {shard_count}",
        "engine": ", ".join(dict.fromkeys(f"{e['name']} {e.get('version', '')}".strip() for e in engines)),
        "engine start seconds": round(startup_seconds, 1),
        "decode->encode mismatches": stats["roundtrip_mismatches"],
        "generation tokens/s": (round(generated_tokens / max(generation_seconds, 1e-9), 1) if reused < shard_count
                                else "n/a (all reused)"),
        "stage seconds": round(time.perf_counter() - start, 1),
        "output": str(paths.corpus),
    })


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline build_corpus", __doc__.splitlines()[0])
    return run_stage(parser, CorpusParams, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
