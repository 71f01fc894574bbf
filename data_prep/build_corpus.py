"""Stage `build_corpus`: the verifier continues every prompt; the responses become the corpus.

Work is cut into shards of `shard_size` prompts, each committed atomically under
`paths.corpus_shards/<fingerprint>/`. The fingerprint covers the verifier hash, the corpus params and
the exact prompt list, so a restart (even after SIGKILL) reuses only shards made for the same inputs,
and the final corpus equals an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import datasets
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from data_prep.corpus import COLUMNS, SPLITS, STATS_NAME
from data_prep.generate import generate_batch
from data_prep.sources import DOMAINS, collect_prompts, split_of, stable_hash
from data_prep.verifier import load_verifier, verifier_identity
from pipeline.atomic import atomic_dir, write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config import CorpusConfig, Params, SamplingConfig
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary, progress

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


def work_items(config: CorpusConfig, tokenizer: PreTrainedTokenizerBase) -> list[WorkItem]:
    """Prompts truncated to their last `prompt_max_tokens` tokens, ordered by length so batches pad little."""
    items = []
    for prompt in collect_prompts(config):
        ids = tokenizer(prompt.prompt, add_special_tokens=False)["input_ids"][-config.prompt_max_tokens:]
        if not ids:
            continue
        digest = hashlib.sha256(prompt.prompt.encode()).hexdigest()[:16]
        items.append(WorkItem(
            id=f"{prompt.domain}-{digest}", domain=prompt.domain, source=prompt.source,
            split=split_of(prompt.prompt, config.split), prompt=tokenizer.decode(ids), prompt_ids=tuple(ids),
            seed=stable_hash(digest, f"seed{config.seed}") % 2**31,
        ))
    return sorted(items, key=lambda item: (len(item.prompt_ids), item.id))


def fingerprint(verifier_hash: str, config: CorpusConfig, items: list[WorkItem]) -> str:
    digest = hashlib.sha256()
    digest.update(verifier_hash.encode())
    digest.update(json.dumps(config.model_dump(mode="json"), sort_keys=True).encode())
    for item in items:
        digest.update(f"{item.id}:{item.split}:{item.seed}:{','.join(map(str, item.prompt_ids))}\n".encode())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- shards


def shard_path(shard_dir: Path, index: int) -> Path:
    return shard_dir / f"shard-{index:05d}.json"


def read_shard(path: Path, key: str, expected_ids: list[str]) -> list[dict]:
    """A committed shard's rows; anything that does not match what this run would write is an error."""
    try:
        shard = json.loads(path.read_text(encoding="utf-8"))
        rows = shard["rows"]
        valid = shard["fingerprint"] == key and [row["id"] for row in rows] == expected_ids
    except (OSError, ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise DraftlineError(
            f"corpus shard {path} is corrupt or does not match this run; delete {path.parent} and rerun build_corpus"
        )
    return rows


def item_sampling(config: CorpusConfig, item: WorkItem) -> SamplingConfig:
    """Greedy for a stable `greedy_share` of the prompts (chosen by id), `config.sampling` for the rest.

    Drafters are evaluated at T=0 too, and a block drafter's positions >= 2 only learn the verifier's
    greedy chain from responses that follow it.
    """
    if stable_hash(item.id, "greedy") % 10_000 < round(config.greedy_share * 10_000):
        return SamplingConfig(temperature=0.0)
    return config.sampling


def generate_shard(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: CorpusConfig,
                   items: list[WorkItem], bar) -> list[dict]:
    rows_by_id = {}
    greedy = [item for item in items if item_sampling(config, item).temperature == 0.0]
    sampled = [item for item in items if item_sampling(config, item).temperature > 0.0]
    for group in (greedy, sampled):
        for start in range(0, len(group), config.batch_size):
            batch = group[start : start + config.batch_size]
            sampling = item_sampling(config, batch[0])
            continuations = generate_batch(
                model, [item.prompt_ids for item in batch], max_new_tokens=config.max_new_tokens,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                sampling=sampling, seeds=[item.seed for item in batch],
            )
            for item, continuation in zip(batch, continuations):
                rows_by_id[item.id] = {
                    "id": item.id, "domain": item.domain, "source": item.source, "split": item.split,
                    "prompt": item.prompt, "prompt_ids": list(item.prompt_ids),
                    "response_ids": continuation.response_ids, "finish_reason": continuation.finish_reason,
                    "temperature": sampling.temperature, "seed": item.seed,
                }
            bar.update(len(batch))
            bar.set_postfix(tokens=sum(len(r["response_ids"]) for r in rows_by_id.values()))
    return [rows_by_id[item.id] for item in items]


def generate_all(model, tokenizer, config: CorpusConfig, items: list[WorkItem], shard_dir: Path, key: str) -> tuple[list[dict], int]:
    """Rows for every item, reusing committed shards; returns (rows, number of shards reused)."""
    shards = [items[i : i + config.shard_size] for i in range(0, len(items), config.shard_size)]
    rows: list[dict] = []
    reused = 0
    bar = progress(desc="build corpus", total=len(items), unit="prompt")
    for index, shard in enumerate(shards):
        path = shard_path(shard_dir, index)
        if path.exists():
            rows.extend(read_shard(path, key, [item.id for item in shard]))
            reused += 1
            bar.update(len(shard))
            continue
        shard_rows = generate_shard(model, tokenizer, config, shard, bar)
        write_json_atomic(path, {"fingerprint": key, "index": index, "rows": shard_rows})
        rows.extend(shard_rows)
    bar.close()
    return rows, reused


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

    by_split: dict[str, dict] = defaultdict(dict)
    for split in SPLITS:
        for domain in DOMAINS:
            by_split[split][domain] = summarise([r for r in rows if r["split"] == split and r["domain"] == domain])
    return {
        **summarise(rows),
        "by_domain": {domain: summarise([r for r in rows if r["domain"] == domain]) for domain in DOMAINS},
        "by_split": dict(by_split),
    }


def run(params: Params, args: argparse.Namespace) -> None:
    config = params.corpus
    paths = ArtifactPaths.from_params(params)
    start = time.perf_counter()
    datasets.disable_progress_bars()  # one progress bar (ours) per stage
    model, tokenizer = load_verifier(paths, params.verifier.dtype)
    identity = verifier_identity(paths)
    items = work_items(config, tokenizer)
    key = fingerprint(identity["hash"], config, items)
    shard_dir = prepare_shard_dir(paths.corpus_shards, key)
    shard_count = -(-len(items) // config.shard_size)
    info(f"{len(items)} prompts in {shard_count} shards of {config.shard_size} (fingerprint {key})")
    generation_start = time.perf_counter()
    rows, reused = generate_all(model, tokenizer, config, items, shard_dir, key)
    generation_seconds = time.perf_counter() - generation_start
    stats = corpus_stats(rows)
    stats.update({"verifier": identity, "fingerprint": key})
    with atomic_dir(paths.corpus) as tmp:
        build_dataset(rows).save_to_disk(str(tmp))
        write_json_atomic(tmp / STATS_NAME, stats)
    summary = {split: sum(1 for r in rows if r["split"] == split) for split in SPLITS}
    print_summary("build_corpus", {
        "rows (train/validation/test)": "/".join(str(summary[s]) for s in SPLITS),
        "rows code / text": f"{stats['by_domain']['code']['rows']} / {stats['by_domain']['text']['rows']}",
        "response tokens": stats["response_tokens"],
        "mean response length": stats["mean_response_length"],
        "finish eos / length": f"{stats['finish_reasons'].get('eos', 0)} / {stats['finish_reasons'].get('length', 0)}",
        "shards reused": f"{reused} / {shard_count}",
        "generation tokens/s": round(stats["response_tokens"] / max(generation_seconds, 1e-9), 1) if reused < shard_count else "n/a (all reused)",
        "stage seconds": round(time.perf_counter() - start, 1),
        "output": str(paths.corpus),
    })


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline build_corpus", __doc__.splitlines()[0])
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
