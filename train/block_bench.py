"""Ablation of the block drafter's training choices, run by `python -m train.bench --block-ablation`.

Every variant trains a fresh drafter for the same number of steps on the same corpus and verifier,
then is measured the way it will be used: greedy speculative decoding of held-out prompts with the
serving loop (`decode_tau`, per-position acceptance), next to the teacher-forced proxy. Variants
change one thing at a time on the way from the original recipe (corpus-token CE, 8 sampled anchors,
sampled responses only, unit final norm) to the current default, then try alternatives on top of it.
Corpus rows are split by how they were generated (`temperature` column) to ablate the greedy share
without rebuilding the corpus: `sampled`/`greedy` use one half each, `all` both.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import DatasetDict

from data_prep.corpus import load_corpus
from data_prep.verifier import load_verifier
from pipeline.atomic import write_json_atomic
from pipeline.drafters.block.config import BlockFamilyConfig, build_target_layer_ids
from pipeline.drafters.block.lightning import BlockDistillModule, evaluate_blocks
from pipeline.drafters.block.mask import resolve_mask
from pipeline.drafters.block.model import build_drafter, verifier_parts
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from pipeline.training.frozen import FrozenVerifier
from pipeline.training.params import TrainParams
from pipeline.training.prompt_response_data import PromptResponseDataModule
from train.trainer import build_trainer


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    config: dict = field(default_factory=dict)  # overrides of train.block
    rows: str = "all"  # all | sampled | greedy: which corpus rows train
    norm_from_verifier: bool = True
    denoise_steps: int = 1  # evaluation only: iterative unmasking passes per block


def variants(depth: int, num_feature_layers: int) -> list[Variant]:
    # the earlier steps pin what they describe, whatever params.yaml's recipe is now
    response_anchors = {"anchors_per_sequence": "all", "prompt_anchors": False}
    old = {"loss": {"ce": 1.0, "fkl": 0.0, "labels": "corpus", "greedy_chain": False}, "anchors_per_sequence": 8,
           "prompt_anchors": False}
    no_chain = {"labels": "verifier", "greedy_chain": False}
    default_layers = build_target_layer_ids(depth, num_feature_layers)
    with_last = sorted(set(default_layers[:-1] + [depth - 1]))
    return [
        Variant("shipped", "corpus-token CE, 8 anchors, sampled rows, unit norm", old, "sampled", False),
        Variant("+verifier_labels", "item 1: CE on the verifier's argmax", {**old, "loss": no_chain},
                "sampled", False),
        Variant("+all_anchors", "item 2: every response position anchors a block",
                {**response_anchors, "loss": no_chain}, "sampled", False),
        Variant("+norm_init", "item 5: final norm from the verifier", {**response_anchors, "loss": no_chain},
                "sampled"),
        Variant("greedy_rows", "item 3: greedy rows only (same row count as sampled)",
                {**response_anchors, "loss": no_chain}, "greedy"),
        Variant("+greedy_chain", "sampled rows, labels only along the verifier's greedy chain", response_anchors,
                "sampled"),
        Variant("all_rows", "item 3: all rows (greedy_share of them greedy)", response_anchors),
        Variant("default", "params.yaml's recipe (anchors_per_sequence, prompt_anchors as set there)", {}),
        Variant("no_greedy_chain", "default without masking labels off the verifier's greedy chain",
                {"loss": {"greedy_chain": False}}),
        Variant("fkl", "forward KL on the verifier's logits instead of argmax CE",
                {"loss": {"ce": 0.0, "fkl": 1.0}}),
        Variant("ce+fkl", "argmax CE + forward KL", {"loss": {"ce": 1.0, "fkl": 1.0}}),
        Variant("last_layer", f"target layers {with_last} (with the last verifier layer)",
                {"target_layer_ids": with_last}),
        Variant("denoise2", "item 4: default model, 2 unmasking passes per block", {}, denoise_steps=2),
        Variant("denoise3", "item 4: default model, 3 unmasking passes per block", {}, denoise_steps=3),
    ]


def merged(cfg: BlockFamilyConfig, overrides: dict) -> BlockFamilyConfig:
    data = cfg.model_dump()
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return type(cfg).model_validate(data)


def select_rows(corpus: DatasetDict, rows: str) -> DatasetDict:
    if rows == "all":
        return corpus
    keep = (lambda t: t == 0.0) if rows == "greedy" else (lambda t: t > 0.0)
    train = corpus["train"].filter(keep, input_columns="temperature")
    if len(train) == 0:
        raise DraftlineError(f"the corpus has no {rows} training rows; rebuild it with 0 < corpus.greedy_share < 1")
    return DatasetDict({**corpus, "train": train})


def train_variant(params: TrainParams, cfg: BlockFamilyConfig, corpus: DatasetDict, verifier, tokenizer,
                  variant: Variant, steps: int):
    seed = params.project.seed
    tcfg = cfg.trainer.model_copy(update={
        "strategy": "auto", "devices": 1, "num_nodes": 1, "accelerator": "cpu", "max_steps": steps,
        "val_every_n_steps": 10 * steps, "checkpoint_every_n_steps": 10 * steps,
    })
    mask = resolve_mask(cfg.mask, verifier, tokenizer, corpus["train"], cfg.kind)
    drafter = build_drafter(verifier, cfg, mask and mask.token_id, mask and mask.rule, seed)
    if not variant.norm_from_verifier:
        with torch.no_grad():
            drafter.norm.weight.fill_(1.0)
    data = PromptResponseDataModule(select_rows(corpus, variant.rows), pad_id=tokenizer.pad_token_id,
                           max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size, seed=seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="draftline-block-bench-") as scratch:
        trainer = build_trainer(tcfg, checkpoint_dir=Path(scratch), enable_progress_bar=False, limit_val_batches=0)
        trainer.fit(BlockDistillModule(drafter, FrozenVerifier(verifier), cfg, tcfg, seed), datamodule=data)
    return drafter.eval(), data, time.perf_counter() - started


def ablation(params: TrainParams, steps: int, only: list[str] | None = None, decode_prompts: int = 12) -> dict:
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier(paths, params.verifier.dtype, params.verifier.trust_remote_code,
                                       params.verifier.allow_pickle_weights)
    corpus = load_corpus(paths)
    _, _, depth, _ = verifier_parts(verifier)
    base = params.train.block.model_copy(update={"decode_prompts": decode_prompts})
    teacher = FrozenVerifier(verifier)
    results: dict[str, dict] = {}
    trained: dict[str, tuple] = {}
    for variant in variants(depth, base.num_feature_layers):
        if only and variant.name not in only:
            continue
        cfg = merged(base, variant.config)
        key = (cfg.model_dump_json(), variant.rows, variant.norm_from_verifier)
        if key not in trained:  # denoise variants evaluate an already trained drafter
            info(f"training variant {variant.name} for {steps} steps")
            trained[key] = train_variant(params, cfg, corpus, verifier, tokenizer, variant, steps)
        drafter, data, train_s = trained[key]
        started = time.perf_counter()
        measured = evaluate_blocks(drafter, teacher, data.val_set, cfg, params.project.seed, max_new_tokens=48,
                                   denoise_steps=variant.denoise_steps)
        results[variant.name] = {
            "what": variant.what,
            "decode_tau": round(measured["decode_tau"], 3),
            "decode_tau_no_prefill": round(measured["decode_tau_no_prefill"], 3),
            "decode_acceptance": [round(rate, 3) for rate in measured["decode_acceptance"]],
            "proxy_tau": round(measured["simulated_acceptance_length"], 3),
            "draft_ms_per_block": round(measured["draft_ms_per_block"], 2),
            "val_loss": round(measured["loss"], 4),
            "train_s": round(train_s, 1),
            "eval_s": round(time.perf_counter() - started, 1),
        }
        info(f"{variant.name}: {results[variant.name]}")
    report = {"steps": steps, "decode_prompts": decode_prompts, "max_new_tokens": 48, "variants": results}
    write_json_atomic(paths.metrics / "bench_block_ablation.json", report)
    print_summary(f"block drafter ablation ({steps} steps each; greedy decode of {decode_prompts} validation prompts)", {
        name: f"tau {r['decode_tau']} (no prefill {r['decode_tau_no_prefill']}) proxy {r['proxy_tau']} "
              f"accept {r['decode_acceptance'][:4]} draft {r['draft_ms_per_block']} ms/block train {r['train_s']}s"
        for name, r in results.items()
    })
    return report
