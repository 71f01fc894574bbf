"""The block drafter's training recipe against the peer's (vllm-project/speculators DFlash), arm by arm.

`python -m train.block_recipe_bench [--arms baseline muon ...] [--seeds 0 1] [--steps 500]`

Every arm trains a fresh drafter from `train.block` with the arm's overrides, for the same number of steps
(params.yaml's demo budget unless --steps), then decodes every prompt of the corpus test and validation
splits with the serving loop the way `evaluate` does (bonus token included in τ, sampled runs seeded by
10000 + prompt index, top_k 0 / top_p 1), at T = 0 and T = 0.8, per domain. τ's standard error treats
prompts as the unit (ratio estimator Σ committed / Σ forwards); seeds are reported apart, so the seed
spread can be set beside it. Results accumulate in `metrics/bench_block_recipe.json` (or --out; an
(arm, seed) already there is skipped, so a killed run resumes) and the table beside it (`.md`).

On a loaded machine run it with OMP_NUM_THREADS=1: with two intra-op threads on oversubscribed cores every
small matmul of the decode loop spin-waits (measured: 20x slower decoding); s/step is only comparable
between arms run under the same load and thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Sequence

import torch

from data_prep.corpus import load_corpus
from data_prep.verifier import load_verifier
from pipeline.atomic import write_json_atomic, write_text_atomic
from pipeline.cli import run_bench, stage_parser
from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.speculative_loop import decode
from pipeline.errors import DraftlineError
from pipeline.integrity import stop_token_ids
from pipeline.paths import ArtifactPaths
from pipeline.progress import info
from pipeline.training.params import TrainParams
from serve_eval.loading import held_out_prompts
from train.block_bench import Variant, merged, train_variant

# the recipe before this comparison, pinned under every arm so the arms keep their meaning as the defaults move
BEFORE = {"trainer": {"optimizer": "adamw", "learning_rate": 2e-3, "lr_schedule": "cosine"},
          "loss": {"position_weights": "exponential", "ce": 1.0, "fkl": 0.0, "greedy_chain": True},
          "anchors_per_sequence": 64, "attention": "bidirectional", "feature_noise": 0.0, "prompt_anchors": True}
PEER_OPTIMIZER = {"trainer": {"optimizer": "muon", "learning_rate": 1e-3, "lr_schedule": "linear"}}

# overrides of BEFORE: each difference from the peer's recipe alone, then combinations
ARMS: dict[str, dict] = {
    "baseline": {},
    "muon": {"trainer": {"optimizer": "muon"}},
    "muon_lr4e-3": {"trainer": {"optimizer": "muon", "learning_rate": 4e-3}},
    "lr1e-3": {"trainer": {"learning_rate": 1e-3}},
    "linear": {"trainer": {"lr_schedule": "linear"}},
    "dpace": {"loss": {"position_weights": "dpace"}},
    "anchors_all": {"anchors_per_sequence": "all"},
    "causal": {"attention": "causal"},
    "peer_optimizer": PEER_OPTIMIZER,
    "muon+dpace": {"trainer": {"optimizer": "muon"}, "loss": {"position_weights": "dpace"}},
    "peer_optimizer+dpace": {**PEER_OPTIMIZER, "loss": {"position_weights": "dpace"}},
    "muon+dpace+noise": {"trainer": {"optimizer": "muon"}, "loss": {"position_weights": "dpace"},
                         "feature_noise": 0.05},
    "muon_lr3e-3+dpace": {"trainer": {"optimizer": "muon", "learning_rate": 3e-3}, "loss": {"position_weights": "dpace"}},
    "muon+dpace+fkl": {"trainer": {"optimizer": "muon"}, "loss": {"position_weights": "dpace", "fkl": 1.0}},
    "muon+dpace+fkl-chain": {"trainer": {"optimizer": "muon"}, "loss": {"position_weights": "dpace", "fkl": 1.0,
                                                                       "greedy_chain": False}},
    "muon+dpace+fkl-prompt": {"trainer": {"optimizer": "muon"}, "loss": {"position_weights": "dpace", "fkl": 1.0},
                              "prompt_anchors": False},
    "muon+dpace+fkl_only": {"trainer": {"optimizer": "muon"}, "loss": {"position_weights": "dpace", "fkl": 1.0,
                                                                      "ce": 0.0}},
    "peer_recipe": {**PEER_OPTIMIZER, "loss": {"position_weights": "dpace"}, "anchors_per_sequence": "all"},
}
TEMPERATURES = (0.0, 0.8)
MAX_NEW_TOKENS = 48  # serve_check's generation length


def ratio_with_se(numerators: list[int], denominators: list[int]) -> tuple[float, float]:
    """Σn / Σd and its standard error with prompts as the sampling unit (delta method for a ratio)."""
    count, total = len(numerators), sum(denominators)
    ratio = sum(numerators) / max(1, total)
    if count < 2:
        return ratio, float("nan")
    residuals = [n - ratio * d for n, d in zip(numerators, denominators)]
    return ratio, math.sqrt(sum(r * r for r in residuals) / (count * (count - 1))) / (total / count)


def decode_cell(proposer: BlockProposer, verifier, prompts: list[list[int]], temperature: float,
                eos_token_id: list[int], seed: int) -> dict:
    """τ (± SE) and per-position acceptance (share of drafting steps accepting ≥ k) over `prompts`."""
    sampling = SamplingConfig(temperature=temperature, top_k=0, top_p=1.0)
    committed, forwards = [], []
    drafted, accepted = [0] * proposer.draft_tokens, [0] * proposer.draft_tokens
    for index, prompt in enumerate(prompts):
        generation = decode(verifier, prompt, MAX_NEW_TOKENS, proposer=proposer, sampling=sampling,
                            eos_token_id=eos_token_id, generator=torch.Generator().manual_seed(seed + 10_000 + index))
        committed.append(len(generation.new_ids))
        forwards.append(generation.verifier_forwards)
        for step in generation.steps:
            for position in range(step.drafted):
                drafted[position] += 1
                accepted[position] += position < step.accepted
    tau, se = ratio_with_se(committed, forwards)
    return {"tau": round(tau, 4), "se": round(se, 4), "prompts": len(prompts), "drafting_steps": drafted[0],
            "acceptance": [round(a / d, 3) if d else 0.0 for a, d in zip(accepted, drafted)]}


def run_arm(params: TrainParams, corpus, verifier, tokenizer, prompts: dict, arm: str, seed: int, steps: int) -> dict:
    seeded = params.model_copy(update={"project": params.project.model_copy(update={"seed": seed})})
    cfg = merged(merged(params.train.block.model_copy(update={"decode_prompts": 0}), BEFORE), ARMS[arm])
    info(f"arm {arm} seed {seed}: training {steps} steps")
    drafter, _, train_s = train_variant(seeded, cfg, corpus, verifier, tokenizer, Variant(arm, arm), steps)
    proposer = BlockProposer(BlockDrafter(drafter, verifier))
    eos = stop_token_ids(verifier.generation_config, tokenizer)
    cells = {str(t): {domain: decode_cell(proposer, verifier, domain_prompts, t, eos, params.project.seed)
                      for domain, domain_prompts in prompts.items()} for t in TEMPERATURES}
    return {"arm": arm, "seed": seed, "steps": steps, "s_per_step": round(train_s / steps, 3), "cells": cells}


def summary_rows(runs: dict) -> list[str]:
    """Markdown: per arm, τ per (T, domain) as the seed mean ± the mean per-seed SE [seed values]."""
    by_arm: dict[str, list[dict]] = {}
    for result in runs.values():
        by_arm.setdefault(result["arm"], []).append(result)
    cells = [(t, d) for t, domains in next(iter(runs.values()))["cells"].items() for d in domains]
    header = "| arm | seeds | s/step | " + " | ".join(f"τ {d} T={t}" for t, d in cells) + " | accept T=0 " + \
        " / ".join(d for t, d in cells if t == "0.0") + " (seed 1st) |"
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for arm in ARMS:
        results = sorted(by_arm.get(arm, []), key=lambda r: r["seed"])
        if not results:
            continue
        row = [arm, ",".join(str(r["seed"]) for r in results),
               f"{statistics.mean(r['s_per_step'] for r in results):.3f}"]
        for t, d in cells:
            taus = [r["cells"][t][d]["tau"] for r in results]
            se = statistics.mean(r["cells"][t][d]["se"] for r in results) / math.sqrt(len(results))
            row.append(f"{statistics.mean(taus):.3f} ± {se:.3f} [{' '.join(f'{x:.2f}' for x in taus)}]")
        row.append(" / ".join(" ".join(f"{a:.2f}" for a in results[0]["cells"][t][d]["acceptance"])
                              for t, d in cells if t == "0.0"))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def run(params: TrainParams, args: argparse.Namespace) -> dict:
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown:
        raise DraftlineError(f"unknown arms {unknown}; known: {list(ARMS)}")
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier(paths, params.verifier.dtype, params.verifier.trust_remote_code,
                                       params.verifier.allow_pickle_weights)
    corpus = load_corpus(paths)
    prompts = held_out_prompts(corpus, verifier.config.vocab_size)
    steps = args.steps or params.train.block.trainer.max_steps
    out = args.out or paths.metrics / "bench_block_recipe.json"
    report = read_report(out)
    for seed in args.seeds:
        for arm in args.arms:
            key = f"{arm}/seed{seed}/steps{steps}"
            if key in report["runs"]:
                continue
            report["runs"][key] = run_arm(params, corpus, verifier, tokenizer, prompts, arm, seed, steps)
            info(f"{key}: {report['runs'][key]}")
            write_json_atomic(out, report)
            write_text_atomic(out.with_suffix(".md"), "\n".join(summary_rows(report["runs"])) + "\n")
    return report


def read_report(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"temperatures": list(TEMPERATURES), "max_new_tokens": MAX_NEW_TOKENS,
            "prompts": "corpus test + validation splits, every prompt", "runs": {}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m train.block_recipe_bench", "the block drafter's recipe, arm by arm, decoded τ")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help="arms to run (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="training seeds (default: 0)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: train.block's max_steps)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default: metrics/bench_block_recipe.json; the table beside it as .md)")
    return run_bench(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
