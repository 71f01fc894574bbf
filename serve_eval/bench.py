"""`python -m serve_eval.bench`: speculative vs verifier-only wall time, and our AR loop vs HF assisted
generation, on the same prompts in one process (greedy).

Runs on the pipeline's artifacts (verifier, corpus test prompts, trained drafters): `make demo` first.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from rich.table import Table

from pipeline.cli import run_bench, stage_parser
from pipeline.config.sampling_config import SamplingConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import stop_token_ids
from pipeline.paths import ArtifactPaths
from pipeline.progress import console, info
from serve_eval.evaluate import EvaluateParams, evaluate_cells
from serve_eval.loading import load_drafters, load_test_prompts, load_verifier_for_decoding


def demo_setup(params: EvaluateParams, per_domain: int):
    paths = ArtifactPaths.from_params(params)
    verifier, tokenizer = load_verifier_for_decoding(paths, params.verifier)
    prompts = [p for domain in load_test_prompts(paths, per_domain, verifier.config.vocab_size).values() for p in domain]
    kinds = [kind for kind in params.evaluate.drafters if (paths.drafter(kind) / "config.json").exists()]
    if not kinds:
        raise DraftlineError("no trained drafter in artifacts/drafters: run `make demo` (or `dvc repro evaluate`) first")
    config = params.evaluate.model_copy(update={"drafters": kinds, "backend": "torch"})
    proposers = {kind: (drafter.proposer, drafter.peer_model)
                 for kind, drafter in load_drafters(paths, config, verifier, tokenizer).items()}
    return verifier, stop_token_ids(verifier.generation_config, tokenizer), prompts, proposers


def run(params: EvaluateParams, args: argparse.Namespace) -> None:
    verifier, eos, prompts, proposers = demo_setup(params, args.prompts)
    info(f"bench on the pipeline's artifacts: {len(prompts)} test prompts, drafters {sorted(proposers)}")
    table = Table(title=f"bench: greedy, {args.max_new_tokens} new tokens, wall time summed over prompts",
                  title_justify="left")
    for column in ("drafter", "verifier only s", "speculative s", "speedup", "tau", "HF assisted s",
                   "ours vs HF"):
        table.add_column(column)
    tallies = evaluate_cells(verifier, {kind: proposer for kind, (proposer, _) in proposers.items()}, prompts,
                             SamplingConfig(), max_new_tokens=args.max_new_tokens, eos_token_id=eos, seed=0,
                             desc="bench", peer_drafters={kind: (peer, proposer.draft_tokens)
                                                          for kind, (proposer, peer) in proposers.items() if peer is not None})
    for kind, (_, peer) in proposers.items():
        tally = tallies[kind]
        metrics = tally.metrics()
        table.add_row(kind, f"{tally.base_s:.3f}", f"{tally.spec_s:.3f}", f"{metrics['speedup']:.2f}x",
                      f"{metrics['tau']:.2f}", f"{tally.peer_s:.3f}" if peer is not None else "-",
                      f"{metrics['ours_vs_hf_assisted']:.2f}x" if peer is not None else "-")
        if tally.mismatches:
            info(f"[red]{kind}: {tally.mismatches} prompt(s) differ from verifier-only greedy output[/]")
    console.print(table)
    info("speedup = verifier-only time / speculative time (tokens/s ratio); ours vs HF = HF time / ours; "
         "tau = tokens per verifier forward, bonus included")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m serve_eval.bench", __doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="test prompts per domain (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    return run_bench(parser, EvaluateParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
