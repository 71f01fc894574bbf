"""Stage `evaluate`: speculative decoding of every drafter on the corpus test split.

Per drafter x temperature x domain it measures acceptance, tau (tokens committed per verifier
forward, bonus/correction token included), per-position acceptance, tokens/s and the speedup over
verifier-only decoding run on the same prompts in the same process (one baseline run a prompt, back to
back with every drafter's, in rotating order, after a warm-up). At T = 0 every speculative output is compared with
the baseline token for token. `per_position_acceptance[i]` is the fraction of verifier steps whose
draft position i+1 was accepted (so it is non-increasing). Writes `metrics/eval.json` and `plots/eval_*.{csv,png}`.

Design: docs/algorithms.md#metrics.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from pipeline.atomic import write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.evaluate_config import EvaluateConfig, temperature_key
from pipeline.config.sampling_config import SamplingConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import VerifierConfig
from pipeline.drafters.proposer import Proposer
from pipeline.drafters.speculative_loop import Generation, decode
from pipeline.integrity import measured_artifacts, stop_token_ids
from pipeline.lineage import library_versions
from pipeline.paths import ArtifactPaths
from pipeline.progress import console, info, progress, warn
from serve_eval.cell_sums import CellSums
from serve_eval.hf_assisted import hf_assisted_generate
from serve_eval.loading import load_drafters, load_test_prompts, load_verifier_for_decoding
from serve_eval.plots import write_plots


class EvaluateParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    evaluate: EvaluateConfig = EvaluateConfig()


def evaluate_cells(verifier, proposers: dict[str, Proposer], prompts: list[list[int]], sampling: SamplingConfig, *,
                   max_new_tokens: int, eos_token_id: list[int], seed: int, desc: str,
                   peer_drafters: dict | None = None, repeats: int = 1,
                   settled_spread: float = 0.0) -> dict[str, CellSums]:
    """One temperature x domain for every drafter in `proposers`, against one verifier-only baseline per prompt
    and repeat: the baseline decodes the same tokens whichever drafter it is timed against, so it runs once,
    in the same back-to-back group as the drafters' runs. Up to `repeats` passes; from the second on, the
    passes stop once every drafter's speedup spread is at most `settled_spread` (a pass that load ruined
    shows as a wide spread, and the next one outvotes it). Every pass seeds its runs afresh: sampled, it
    draws new tokens, and acceptance counts every pass's drafts (one seed's sampled τ over 12 prompts varies
    by about ±0.1); greedy, every pass decodes the same tokens, counted once. `peer_drafters[kind]`
    (model, draft tokens): HF assisted generation timed for that kind, first repeat only."""
    peer_drafters = peer_drafters or {}
    tallies = {kind: CellSums() for kind in proposers}
    run = dict(sampling=sampling, eos_token_id=eos_token_id)
    # warm-up: first-call allocations and kernel selection must not land in any timing
    for proposer in (None, *proposers.values()):
        decode(verifier, prompts[0], min(8, max_new_tokens), proposer=proposer, **run)

    def one_run(prompt: list[int], with_proposer: Proposer | None, seed_offset: int) -> Generation:
        return decode(verifier, prompt, max_new_tokens, proposer=with_proposer,
                      generator=torch.Generator().manual_seed(seed + seed_offset), **run)

    def add_first_pass(kind: str, spec: Generation, base: Generation, prompt: list[int]) -> None:
        """The lossless check and the peer's time: once."""
        tally = tallies[kind]
        if sampling.greedy and spec.new_ids != base.new_ids:
            tally.mismatches += 1
        if kind in peer_drafters:
            peer_drafter, draft_tokens = peer_drafters[kind]
            peer_ids, peer_s = hf_assisted_generate(verifier, peer_drafter, prompt, max_new_tokens,
                                                    draft_tokens, eos_token_id)
            tally.peer_s += peer_s
            tally.peer_tokens += len(peer_ids)

    # Whole passes over the prompts, each prompt's baseline and speculative runs back to back: a load
    # change mid-prompt hits both sides of a repeat, and a repeat it ruins is outvoted by the others.
    group: list[str | None] = [None, *proposers]
    with progress(desc=desc, total=repeats * len(prompts), unit="prompt") as bar:
        for repeat in range(repeats):
            if repeat >= 2 and all(tally.metrics()["speedup_spread"] <= settled_spread for tally in tallies.values()):
                bar.total = bar.n  # settled: the bar ends where the passes did
                break
            for index, prompt in enumerate(prompts):
                shift = (index + repeat) % len(group)  # rotate the order so drift (thermal, caches) hits every side
                outputs = {kind: one_run(prompt, None if kind is None else proposers[kind],
                                         (2 * repeat + (kind is not None)) * len(prompts) + index)
                           for kind in group[shift:] + group[:shift]}
                base = outputs.pop(None)
                for kind, spec in outputs.items():
                    tallies[kind].add_time(repeat, spec, base)
                    if not repeat or not sampling.greedy:
                        tallies[kind].add(spec, repeat)
                    if not repeat:
                        add_first_pass(kind, spec, base, prompt)
                bar.update()
    return tallies


def run(params: EvaluateParams, args: argparse.Namespace) -> dict:
    paths = ArtifactPaths.from_params(params)
    config = params.evaluate
    from data_prep.corpus import corpus_hash
    from pipeline.verifier_record import verifier_identity

    verifier, tokenizer = load_verifier_for_decoding(paths, params.verifier)
    prompts = load_test_prompts(paths, config.prompts_per_domain, verifier.config.vocab_size)
    # hashed before loading: the metrics belong to the files as they were when read
    measured = {kind: measured_artifacts(paths.drafter(kind), paths.export(kind)) for kind in config.drafters}
    identity = verifier_identity(paths)
    drafters = load_drafters(paths, config, verifier, tokenizer)  # fails early when one is missing
    report: dict = {"verifier": {"id": identity["id"], "hash": identity["hash"]},
                    "corpus_hash": corpus_hash(paths), "library_versions": library_versions(),
                    "tau_definition": "tokens committed per verifier forward, bonus/correction token included",
                    "drafters": {}}
    tallies: dict[tuple[str, str, str], CellSums] = {}
    torch.manual_seed(config.seed)
    entries = {kind: {"backend": drafter.backend, **measured[kind], "by_temperature": {}, "mismatches": 0}
               for kind, drafter in drafters.items()}
    proposers = {kind: drafter.proposer for kind, drafter in drafters.items()}
    eos_token_id = stop_token_ids(verifier.generation_config, tokenizer)
    for temperature in config.temperatures:
        sampling = SamplingConfig(temperature=temperature, top_k=config.top_k, top_p=config.top_p)
        key = temperature_key(temperature)
        peers = {kind: (drafter.peer_model, drafter.proposer.draft_tokens) for kind, drafter in drafters.items()
                 if config.peer_baseline and sampling.greedy and drafter.peer_model is not None}
        for domain, domain_prompts in prompts.items():
            cells = evaluate_cells(verifier, proposers, domain_prompts, sampling, max_new_tokens=config.max_new_tokens,
                                   eos_token_id=eos_token_id, seed=config.seed, desc=f"T={key} {domain}",
                                   peer_drafters=peers, repeats=config.timing_repeats,
                                   settled_spread=config.settled_spread)
            for kind, tally in cells.items():
                tallies[(kind, key, domain)] = tally
                entries[kind]["by_temperature"].setdefault(key, {})[domain] = metrics = tally.metrics()
                # recorded, not only warned about: promote leaves a speed check inside this noise undecided
                metrics["speedup_noisy"] = metrics["speedup_spread"] > config.max_speedup_spread
                if metrics["speedup_noisy"]:
                    warn(f"{kind} T={key} {domain}: speedup {metrics['speedup']:.2f}x varies by "
                         f"{metrics['speedup_spread']:.0%} over {len(metrics['speedup_runs'])} repeats (limit "
                         f"{config.max_speedup_spread:.0%}): the machine is too noisy for the speed gate to decide "
                         "(promote leaves the speed check undecided); re-run evaluate on a quieter machine or raise "
                         "evaluate.timing_repeats")
                entries[kind]["mismatches"] += tally.mismatches
    for kind, entry in entries.items():
        entry["lossless"] = entry["mismatches"] == 0
        report["drafters"][kind] = entry
    write_plots(paths.plots, tallies)
    write_json_atomic(paths.metrics / "eval.json", report)
    print_table(report)
    return report


def print_table(report: dict) -> None:
    from rich.table import Table

    table = Table(title="evaluate (tau = tokens per verifier forward, bonus included)", title_justify="left")
    for column in ("kind", "T", "domain", "alpha", "tau", "tok/s", "base", "speedup", "vs HF", "mism"):
        table.add_column(column)
    for kind, entry in report["drafters"].items():
        for key, domains in entry["by_temperature"].items():
            for domain, m in domains.items():
                vs_hf = m.get("ours_vs_hf_assisted")
                table.add_row(kind, key, domain, f"{m['acceptance_rate']:.2f}", f"{m['tau']:.2f}",
                              f"{m['tokens_per_s']:.0f}", f"{m['baseline_tokens_per_s']:.0f}",
                              f"{m['speedup']:.2f}x", "-" if vs_hf is None else f"{vs_hf:.2f}x",
                              str(entry["mismatches"]) if key == "0.0" else "-")
    console.print(table)
    info("metrics/eval.json and plots/eval_* written")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline evaluate", __doc__.splitlines()[0])
    return run_stage(parser, EvaluateParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
