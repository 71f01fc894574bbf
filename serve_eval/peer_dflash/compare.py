"""Our block drafter against peer DFlash checkpoints, served by the same vLLM build on the same prompts.

`python -m serve_eval.peer_dflash.compare PEER_DIR [PEER_DIR ...] [--out metrics/peer_dflash.json]`

Every engine runs through serve_check's runner and job (greedy, serve_check's max_new_tokens, single and
batched): vLLM alone, our exported block drafter, then each peer checkpoint as `method: dflash` with our
k. Two prompt sets: serve_check's (its first `prompts_per_domain` test prompts per domain) and every test +
validation prompt per domain (`all:<domain>`), where differences of a few percent are several standard
errors wide. Greedy speculation is lossless, so every drafter's outputs must equal vLLM's alone; a drafter
whose outputs differ is reported as such, not compared.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Sequence

from data_prep.corpus import load_corpus
from pipeline.atomic import write_json_atomic, write_text_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import info
from serve_eval.loading import held_out_prompts, load_test_prompts
from serve_eval.serve_check import (
    BATCHED,
    SINGLE,
    ServeCheckParams,
    engine_job,
    exported_jobs,
    greedy_run,
    run_engine,
    serving_env,
)

ALL = "all:"  # prefix of the every-prompt set's domains
PEER_METHOD = "dflash"  # how vLLM serves speculators' DFlash checkpoints


def prompt_sets(paths: ArtifactPaths, per_domain: int) -> dict[str, list[list[int]]]:
    every = held_out_prompts(load_corpus(paths), vocab_size=None)
    return {**load_test_prompts(paths, per_domain), **{ALL + domain: prompts for domain, prompts in every.items()}}


def run(params: ServeCheckParams, args: argparse.Namespace) -> dict:
    paths = ArtifactPaths.from_params(params)
    config = params.serve_check
    environment = serving_env(config)
    if environment is None:
        raise DraftlineError("no serving environment: run `make serve-env`")
    python, versions = environment
    # ours: the export vLLM serves the way it serves the peer (`method: dflash`, the block drafter's layout)
    dflash = {kind: job for kind, job in exported_jobs(params, paths).items()
              if job["speculative_config"].get("method") == PEER_METHOD}
    if not dflash:
        raise DraftlineError(f"no exported drafter is served with method {PEER_METHOD}: export the block drafter "
                             "(export.kinds) and run `dvc repro export`")
    ours_name, ours = next(iter(dflash.items()))
    k = ours["speculative_config"]["num_speculative_tokens"]
    drafters = {ours_name: ours["speculative_config"]}
    for peer in args.peers:
        if not (peer / "config.json").is_file():
            raise DraftlineError(f"{peer} has no config.json: pass a speculators checkpoint directory")
        drafters[f"peer:{peer}"] = {"method": PEER_METHOD, "model": str(peer.resolve()), "num_speculative_tokens": k}
    prompts = prompt_sets(paths, config.prompts_per_domain)
    log_dir = paths.root / "peer_dflash"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    results = {}
    for index, (name, speculative_config) in enumerate({"baseline": None, **drafters}.items()):
        info(f"vLLM: {name} ({sum(map(len, prompts.values()))} prompts)")
        results[name] = run_engine(python, engine_job(ours["model"], speculative_config, prompts, params),
                                   f"engine{index}", log_dir, config)
        if results[name].get("error"):
            raise DraftlineError(f"vLLM with {name} failed: {results[name]['error']}")
    baseline = results.pop("baseline")["runs"]
    report = {"serve_library_versions": versions, "max_new_tokens": config.max_new_tokens, "k": k, "ours": ours_name,
              "drafters": {drafter: {"speculative_config": drafters[drafter],
                                     "runs": {run: {domain: greedy_run(result["runs"][run][domain],
                                                                       baseline[run][domain],
                                                                       1 if run == SINGLE else config.concurrency, k)
                                                    for domain in prompts} for run in (SINGLE, BATCHED)}}
                           for drafter, result in results.items()}}
    write_json_atomic(args.out, report)
    table = summary_table(report)
    write_text_atomic(args.out.with_suffix(".md"), table + "\n")
    print(table)
    return report


def summary_table(report: dict) -> str:
    """Markdown: per prompt set and domain, batched τ ± SE of our drafter and every peer, identical outputs,
    per-position acceptance, and our τ over each peer's."""
    drafters, ours = report["drafters"], report["ours"]
    lines = ["| prompts | domain | drafter | τ batched ± SE | τ single | outputs identical | acceptance per position | "
             "ours / this |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for domain in drafters[ours]["runs"][BATCHED]:
        ours_tau = drafters[ours]["runs"][BATCHED][domain]["vllm"]["tau"]
        for name, drafter in drafters.items():
            batched, single = drafter["runs"][BATCHED][domain], drafter["runs"][SINGLE][domain]
            metrics = batched["vllm"]
            drafts = max(1, metrics["num_drafts"])
            acceptance = " ".join(f"{count / drafts:.2f}" for count in metrics["num_accepted_tokens_per_pos"])
            comparable = name != ours and batched["outputs_identical"]
            ratio = f"{ours_tau / metrics['tau']:.2f}x" if comparable else ""
            lines.append(f"| {'all' if domain.startswith(ALL) else 'serve_check'} ({batched['prompts']}) | "
                         f"{domain.removeprefix(ALL)} | {name.removeprefix('peer:')} | {metrics['tau']:.3f} ± "
                         f"{metrics['tau_se']:.3f} | {single['vllm']['tau']:.3f} | "
                         f"{batched['outputs_identical'] and single['outputs_identical']} | {acceptance} | {ratio} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m serve_eval.peer_dflash.compare", "our block drafter against peer DFlash, in vLLM")
    parser.add_argument("peers", nargs="+", type=Path, help="speculators DFlash checkpoint directories")
    parser.add_argument("--out", type=Path, default=Path("metrics/peer_dflash.json"),
                        help="results JSON (the table beside it as .md)")
    return run_stage(parser, ServeCheckParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
