"""Stage `serve_check`: the exported drafters, run in vLLM exactly as `launch.md` tells users.

For each exported drafter it starts one vLLM engine on the verifier with the drafter attached
through the speculative config of `artifacts/export/<kind>/vllm.json` (the one launch.md shows) and
runs the corpus test prompts of every domain three ways: greedy one request at a time, greedy with
`serve_check.concurrency` requests sharing the engine's batches (how a server runs), and at each
evaluate temperature > 0 (seeded, batched). One engine without speculation runs the two greedy
ways too, and every drafter's greedy outputs are compared with it. vLLM runs in the serving
environment (`make serve-env`: vLLM without draftline, so the export has to stand on its own)
through `serve_eval/vllm_runner.py`. Per drafter and domain `metrics/serving.json` records whether
the outputs are identical, vLLM's spec-decode counters and the τ computed from them per run, vLLM
tokens/s with and without the drafter, and draftline's own τ on the same prompts at the same
temperatures, decoded here with `pipeline.drafters.speculative_loop`.

τ is compared in vLLM's definition: 1 + accepted drafts per drafting step (bonus token included;
the prefill step, which drafts nothing in vLLM, is left out on both sides, and so are draftline's
steps cut short by max_new_tokens, which vLLM drafts in full). A drafter fails when it does not
load, its greedy outputs differ, vLLM proposed nothing, its single-request or batched τ differs from
draftline's by more than `serve_check.max_tau_gap`, its batched τ differs from its single-request τ
by more than `serve_check.max_batch_tau_gap` (a drafter that only works alone does not pass), or a
sampled τ differs from draftline's by more than `serve_check.sampled_z` standard errors (see
`sampled_tolerance`; vLLM's draft sampling ignores request seeds, so its T > 0 numbers only compare
within noise: `SAMPLED_NOTE`). It is `skipped` when vLLM's CPU kernels cannot run the model.

With `serve_check.launch_command` (the default) every drafter that ran is also served by the command its
launch.md shows for this vLLM build, on 127.0.0.1 and a free port, and driven by OpenAI completions requests
(`serve_eval/launch_check.py`), started as soon as its in-process run is done, beside the next engines: the
same runs, the same rule, and the result must agree with the in-process run (greedy outputs identical, τ
within `serve_check.max_launch_tau_gap`, sampled τ within `serve_check.sampled_z` standard errors); a
command that does not start or serves without speculation fails the drafter with vLLM's first error line.
A failing drafter never fails the stage; `serve_check.required` makes `promote` refuse it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from export.launch_files import VLLM_NAME, resolved_job
from pipeline.atomic import write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.export_config import ExportConfig
from pipeline.config.sampling_config import SamplingConfig
from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import VerifierConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import measured_artifacts, verify_manifest
from pipeline.lineage import library_versions, read_json
from pipeline.paths import ArtifactPaths
from pipeline.process_tree import die_with_parent
from pipeline.progress import console, info, warn
from pipeline.server_process import check_not_killed, on_cpu, servers_stopped_on_error
from pipeline.serving_rule import (
    BATCHED,
    SINGLE,
    domain_failures,
    relative_gap,
    sampled_gaps,
    sampled_tolerance,
)
from pipeline.serving_venv import serve_python
from pipeline.vllm_launch import command_line
from serve_eval.forked_runner import ForkedRunner
from serve_eval.launch_check import engine_args, launch_argv, serve_launch_command
from serve_eval.serving_plots import write_serving_plots


class ServeCheckParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    export: ExportConfig = ExportConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    serve_check: ServeCheckConfig = ServeCheckConfig()


RUNNER = Path(__file__).with_name("vllm_runner.py")
SERVING_JSON = "serving.json"
LOG_DIR = "serve_check"  # under artifacts/: one vLLM log per engine, for the failures
# Limits of the CPU build, not of the export: its attention rejects some head sizes (e.g. head_dim 8), and
# DSpark (`method: dspark`) runs only in model runner V2, which needs Triton (absent from the CPU build)
SKIP_MARKERS = ("Unsupported CPU attention configuration", "does not support: dspark",
                "Model Runner V2 requires Triton")
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = (
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos")
GREEDY = "greedy"  # draftline's greedy run; vLLM's are SINGLE and BATCHED (sampled runs: "T=<t>")
# vLLM (0.32) skips drafting for the whole batch in any step where one request's sequence plus k + 1 passes
# max_model_len, and a DFlash drafter then never sees the tokens verified in that step: the other requests
# draft from a context with holes until they finish (serve_eval/repro/dflash_drafter_skip.py). A verify
# step holds up to prompt + max_new_tokens + k tokens, so two blocks past the longest request keep every
# request clear of that edge, as a server at the model's full length mostly is.
DRAFT_HEADROOM = 2
# vLLM 0.32's CPU engine dies on sampled speculation with top_k > 0 at its first step without drafts (a
# prefill): `v1/sample/ops/topk_topp_sampler.py` takes k.max() of an empty tensor. Nothing avoids it but top_k 0.
TOP_K_CRASH = "max(): Expected reduction dim to be specified for input.numel() == 0"
SAMPLED_NOTE = ("vLLM's draft sampling ignores per-request seeds (0.32: v1/spec_decode/llm_base_proposer.py): a "
                "request's drafts hang on the engine's seed and on what shares its batches, so T > 0 numbers differ "
                "between engines (in-process vs launch command) and batchings even with seeds; sampled tau is "
                "compared within serve_check.sampled_z standard errors, never to an exact value")
TAU_DEFINITION = ("1 + accepted draft tokens per drafting step (bonus/correction token included; vLLM's "
                  "prefill step, which drafts nothing, and draftline's steps cut short by max_new_tokens are not "
                  "counted)")


# --------------------------------------------------------------------------- vLLM engines


def explained(error: str) -> str:
    """vLLM's error, with the cause where serve_check knows it."""
    if TOP_K_CRASH in error:
        return ("vLLM's CPU engine crashed on sampled speculation with top_k > 0 (evaluate.top_k), as vLLM 0.32's "
                "does at a step without drafts (v1/sample/ops/topk_topp_sampler.py: k.max() of an empty tensor); "
                f"use evaluate.top_k: 0 or a GPU build ({error})")
    return error


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def engine_env(config: ServeCheckConfig) -> dict[str, str]:
    """The environment of every vLLM process serve_check starts, in-process runner and server alike."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib), "HF_HUB_OFFLINE": "1"}


def runner_env(config: ServeCheckConfig) -> dict[str, str]:
    # engine core in the runner's own process: its exceptions (not "engine core died") reach the result
    return {**engine_env(config), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def forked_runner(python: Path, log_dir: Path, config: ServeCheckConfig) -> ForkedRunner:
    """The runner that forks every engine of the stage from one vLLM import."""
    return ForkedRunner(python, RUNNER, runner_env(config), log_dir / "vllm-fork-server.log")


def run_engine(python: Path, job: dict, name: str, log_dir: Path, config: ServeCheckConfig,
               forked: ForkedRunner | None = None) -> dict:
    """One vLLM engine in the serving environment, forked by `forked` or in a runner of its own; the runner's
    result, or {"error": ...}."""
    log = log_dir / f"{name}.log"
    with tempfile.TemporaryDirectory(prefix="serve_check_") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        try:
            if forked is not None:
                returncode = forked.run(job_path, result_path, log, config.engine_timeout_s)
            else:
                with log.open("w", encoding="utf-8") as handle:
                    returncode = subprocess.run([str(python), "-I", str(RUNNER), str(job_path), str(result_path)],
                                                stdout=handle, stderr=subprocess.STDOUT, env=runner_env(config),
                                                timeout=config.engine_timeout_s, check=False,
                                                preexec_fn=die_with_parent).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"vLLM did not finish within {config.engine_timeout_s} s "
                             f"(serve_check.engine_timeout_s); log: {log}", "log": str(log)}
        # An engine that died (a signal, or an interpreter that failed before the runner could report) says
        # nothing about the drafter: the stage fails and serving.json keeps its last result.
        check_not_killed(returncode, f"the vLLM runner ({name})", log)
        if not result_path.is_file():
            raise DraftlineError(f"the vLLM runner ({name}) exited with code {returncode} without a result "
                                 f"({_last_line(log)}); serving.json keeps its last result; log: {log}")
        return {**runner_result(result_path, job, log), "log": str(log)}


def runner_result(path: Path, job: dict, log: Path) -> dict:
    """The runner's result, checked to hold an error or every run the job asked for: anything else comes
    from a runner or environment that does not match this stage, which fails the stage, not the drafter."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DraftlineError(f"the vLLM runner's result is not readable JSON ({error}); log: {log}") from None
    if isinstance(result, dict) and result.get("error"):
        return {**result, "error": explained(str(result["error"]))}
    runs = result.get("runs") if isinstance(result, dict) else None
    missing = [run["name"] for run in job["runs"] if not isinstance(runs, dict) or not isinstance(runs.get(run["name"]), dict)]
    if missing:
        raise DraftlineError(f"the vLLM runner's result has neither an error nor the runs {', '.join(missing)}: the "
                             f"serving environment's runner does not match this draftline ({RUNNER}); log: {log}")
    return result


# The first thing a reader of a skip needs: how to get the check to run, or what declining it gives up.
SKIP_ADVICE = ("this vLLM build cannot run it: run serve_check where a GPU build of vLLM is installed, or set "
               "serve_check.required: false (promote then registers drafters that vLLM never served: "
               "τ in the serving stack and lossless serving unchecked)")


def classify_error(error: str) -> tuple[str, str]:
    """(status, reason): the CPU build's known limits skip, with what to do; anything else fails."""
    if any(marker in error for marker in SKIP_MARKERS):
        return "skipped", f"{error}; {SKIP_ADVICE}"
    return "failed", error


def serving_env(config: ServeCheckConfig) -> tuple[Path, dict] | None:
    """The serve env's interpreter and its library versions, or None: no environment and not required.

    Checked before anything is measured or replaced: a missing or broken environment (one that cannot
    report a vLLM version) is this stage's failure, not the drafters', so serving.json keeps its last
    result and DVC reruns the stage once the environment is fixed."""
    python = serve_python()
    override = os.environ.get("DRAFTLINE_SERVE_PYTHON")
    if python is None and not override and not config.required:
        return None
    if python is None:
        where = f"DRAFTLINE_SERVE_PYTHON={override} does not exist" if override else "no .venv-serve"
        raise DraftlineError(f"no serving environment ({where}): run `make serve-env`, or point "
                             "DRAFTLINE_SERVE_PYTHON at its python")
    versions = library_versions(python)
    if "vllm" not in versions and "vllm-cpu" not in versions:
        raise DraftlineError(f"the serving environment {python} does not run or has no vLLM installed (it reported "
                             f"{sorted(versions) or 'nothing'}): rebuild it with `make serve-env`")
    return python, versions


def sampled_run_name(temperature: float) -> str:
    return f"T={temperature:g}"


def run_specs(params: ServeCheckParams, sampled: bool) -> list[dict]:
    """The greedy single-request and batched runs, then (`sampled`) one batched run per evaluate T > 0."""
    concurrency = params.serve_check.concurrency
    runs = [{"name": SINGLE, "concurrency": 1, "temperature": 0.0, "top_k": 0, "top_p": 1.0},
            {"name": BATCHED, "concurrency": concurrency, "temperature": 0.0, "top_k": 0, "top_p": 1.0}]
    if sampled:
        runs += [{"name": sampled_run_name(t), "concurrency": concurrency, "temperature": t,
                  "top_k": params.evaluate.top_k, "top_p": params.evaluate.top_p} for t in sampled_temperatures(params)]
    return runs


def sampled_temperatures(params: ServeCheckParams) -> list[float]:
    return [t for t in params.evaluate.temperatures if t > 0]


def engine_job(model: str, speculative_config: dict | None, prompts: dict[str, list[list[int]]],
               params: ServeCheckParams) -> dict:
    config = params.serve_check
    longest = max(len(ids) for domain in prompts.values() for ids in domain)
    k = (speculative_config or {}).get("num_speculative_tokens", 0)
    return {"model": model, "speculative_config": speculative_config, "prompts": prompts,
            "max_new_tokens": config.max_new_tokens, "dtype": params.verifier.dtype, "seed": params.project.seed,
            "max_model_len": longest + config.max_new_tokens + DRAFT_HEADROOM * (k + 1),
            "enforce_eager": config.enforce_eager,
            "runs": run_specs(params, sampled=speculative_config is not None)}


# --------------------------------------------------------------------------- draftline's side


def draftline_runs(params: ServeCheckParams, paths: ArtifactPaths, kinds: list[str],
                   prompts: dict[str, list[list[int]]]) -> dict[str, dict[str, dict[str, list]]]:
    """kind -> run name -> domain -> draftline's Generation per prompt (no EOS stop, as vLLM runs with
    ignore_eos): greedy (compared with both greedy vLLM runs) and every evaluate T > 0, seeded per prompt."""
    from pipeline.drafters.speculative_loop import decode
    from serve_eval.loading import load_drafters, load_verifier_for_decoding

    verifier, tokenizer = load_verifier_for_decoding(paths, params.verifier)
    evaluate = params.evaluate.model_copy(update={"drafters": kinds, "backend": "torch"})
    drafters = load_drafters(paths, evaluate, verifier, tokenizer)
    settings = {GREEDY: SamplingConfig()}
    settings.update({sampled_run_name(t): SamplingConfig(temperature=t, top_k=evaluate.top_k, top_p=evaluate.top_p)
                     for t in sampled_temperatures(params)})
    runs: dict[str, dict[str, dict[str, list]]] = {}
    for kind, drafter in drafters.items():
        info(f"serve_check: draftline decoding with the {kind} drafter ({', '.join(settings)})")
        runs[kind] = {name: {domain: [decode(verifier, ids, params.serve_check.max_new_tokens, proposer=drafter.proposer,
                                             sampling=sampling,
                                             generator=torch.Generator().manual_seed(params.project.seed + i))
                                      for i, ids in enumerate(domain_prompts)]
                             for domain, domain_prompts in prompts.items()}
                      for name, sampling in settings.items()}
    return runs


def tau_summary(histogram: Sequence[int]) -> dict:
    """τ, drafting steps and the standard error of τ from the number of steps that accepted 0..k drafts."""
    steps = sum(histogram)
    mean = sum(j * n for j, n in enumerate(histogram)) / max(1, steps)
    variance = sum(n * (j - mean) ** 2 for j, n in enumerate(histogram)) / max(1, steps - 1)
    return {"tau": 1 + mean if steps else None, "drafting_steps": steps,
            "tau_se": math.sqrt(variance / steps) if steps > 1 else None}


def draftline_metrics(generations: list, k: int) -> dict:
    """τ over the steps that drafted the full k: near max_new_tokens draftline drafts fewer, while vLLM
    drafts k anyway and counts acceptances past the limit, so the cut steps would bias the comparison."""
    drafting = [step for g in generations for step in g.steps if step.drafted == k]
    histogram = [0] * (k + 1)
    for step in drafting:
        histogram[step.accepted] += 1
    forwards = sum(g.verifier_forwards for g in generations)
    summary = tau_summary(histogram)
    return {"tau": summary["tau"] or 1.0, "tau_se": summary["tau_se"], "drafting_steps": len(drafting),
            "tau_evaluate": sum(len(g.new_ids) for g in generations) / max(1, forwards),
            "acceptance_rate": sum(step.accepted for step in drafting) / max(1, k * len(drafting)),
            "accepted_histogram": histogram}


# --------------------------------------------------------------------------- comparison


def accepted_histogram(counters: dict, k: int) -> list[int]:
    """Drafting steps that accepted exactly 0..k drafts, from vLLM's counters: per-position count j is the
    number of steps that accepted at least j + 1 drafts."""
    per_position = list(counters.get(PER_POSITION, []))[:k]
    at_least = [counters.get(DRAFTS, 0)] + per_position + [0] * (k - len(per_position)) + [0]
    return [max(0, at_least[j] - at_least[j + 1]) for j in range(k + 1)]


def vllm_metrics(domain: dict, k: int, baseline: dict | None) -> dict:
    counters = domain["counters"]
    drafts, accepted = counters.get(DRAFTS, 0), counters.get(ACCEPTED, 0)
    tokens_per_s = domain["tokens"] / max(domain["wall_s"], 1e-9)
    metrics = {"tau": 1 + accepted / drafts if drafts else None,
               "tau_se": tau_summary(accepted_histogram(counters, k))["tau_se"],
               "acceptance_rate": accepted / max(1, counters.get(DRAFT_TOKENS, 0)),
               "num_drafts": drafts, "num_draft_tokens": counters.get(DRAFT_TOKENS, 0), "num_accepted_tokens": accepted,
               "num_accepted_tokens_per_pos": counters.get(PER_POSITION, []), "tokens_per_s": tokens_per_s}
    if baseline is not None:
        baseline_tokens_per_s = baseline["tokens"] / max(baseline["wall_s"], 1e-9)
        metrics.update(baseline_tokens_per_s=baseline_tokens_per_s,
                       speedup=tokens_per_s / max(baseline_tokens_per_s, 1e-9))
    return metrics


def greedy_run(result: dict, baseline: dict, concurrency: int, k: int) -> dict:
    ours, reference = result["outputs"], baseline["outputs"]
    mismatched = sum(a != b for a, b in zip(ours, reference)) + abs(len(ours) - len(reference))
    return {"concurrency": concurrency, "prompts": len(reference), "outputs_identical": mismatched == 0,
            "mismatched_prompts": mismatched, "vllm": vllm_metrics(result, k, baseline)}


def compare_domain(runs: dict[str, dict], baseline: dict[str, dict], generations: dict[str, list] | None, k: int,
                   config: ServeCheckConfig, concurrency: dict[str, int]) -> tuple[dict, list[str]]:
    """One drafter x domain over all runs: (record, failure reasons by `serving_rule.domain_failures`)."""
    record: dict = {"prompts": len(baseline[SINGLE]["outputs"])}
    for name in (SINGLE, BATCHED):
        record[name] = greedy_run(runs[name], baseline[name], concurrency[name], k)
    if generations is not None:
        record["draftline"] = draftline_metrics(generations[GREEDY], k)
        # equal outputs expected too, but fp32 kernels may flip a near-tie: reported, not gated
        record["draftline_same_outputs"] = sum(g.new_ids == ids for g, ids in zip(generations[GREEDY],
                                                                                  runs[SINGLE]["outputs"]))
        record["sampled"] = {}
        for name, run in runs.items():
            if name in (SINGLE, BATCHED):
                continue
            vllm, theirs = vllm_metrics(run, k, None), draftline_metrics(generations[name], k)
            record["sampled"][name] = {"concurrency": concurrency[name], "vllm": vllm, "draftline": theirs,
                                       "tolerance": sampled_tolerance(vllm, theirs, config.sampled_z),
                                       "tau_diff": abs(vllm["tau"] - theirs["tau"]) if vllm["tau"] else None}
    single, batched = (record[name]["vllm"]["tau"] for name in (SINGLE, BATCHED))
    ours = (record.get("draftline") or {}).get("tau")
    if single and batched:
        record["batch_tau_gap"] = relative_gap(batched, single)
        if ours:
            record["single_tau_gap"], record["tau_gap"] = relative_gap(single, ours), relative_gap(batched, ours)
    reasons = domain_failures(record, config.max_tau_gap, config.max_batch_tau_gap, config.sampled_z,
                              config.gate_sampled)
    if not config.gate_sampled:
        record["sampled_warnings"] = sampled_gaps(record, config.sampled_z)
    if generations is None:  # the drafter did not load in draftline: only vLLM's side is judged here
        reasons = [reason for reason in reasons if reason != "no draftline tau recorded"]
    return record, reasons


def check_drafter(job: dict, result: dict, baseline: dict, generations: dict | None,
                  config: ServeCheckConfig) -> dict:
    entry = {"status": "passed", "reason": None, "speculative_config": job["speculative_config"],
             "max_model_len": job.get("max_model_len"), "engine_start_s": result.get("engine_start_s"),
             "log": result.get("log"), "domains": {}}
    if result.get("error"):
        status, reason = classify_error(result["error"])
        return {**entry, "status": status, "reason": reason}
    k = int(job["speculative_config"]["num_speculative_tokens"])
    concurrency = {run["name"]: run["concurrency"] for run in job["runs"]}
    reasons = []
    for domain in baseline["runs"][SINGLE]:
        record, domain_reasons = compare_domain(
            {name: run[domain] for name, run in result["runs"].items()},
            {name: run[domain] for name, run in baseline["runs"].items()},
            {name: run[domain] for name, run in generations.items()} if generations else None,
            k, config, concurrency)
        entry["domains"][domain] = record
        reasons += [f"{domain}: {reason}" for reason in domain_reasons]
    if reasons:
        entry.update(status="failed", reason="; ".join(reasons))
    return entry


# --------------------------------------------------------------------------- launch.md's command


def agreement(launched: dict, in_process: dict, k: int, max_gap: float, sampled_z: float) -> list[str]:
    """Where the launch-command run disagrees with the in-process run of the same drafter: greedy outputs
    not identical or τ more than `max_gap` apart; a sampled τ more than `sampled_z` standard errors apart
    (draft sampling ignores request seeds: two engines do not draw alike)."""
    reasons = []
    for name, run in in_process["runs"].items():
        greedy = name in (SINGLE, BATCHED)
        for domain, theirs in run.items():
            ours = launched["runs"][name][domain]
            a, b = vllm_metrics(ours, k, None), vllm_metrics(theirs, k, None)
            where = f"{domain} {name}"
            if greedy and ours["outputs"] != theirs["outputs"]:
                reasons.append(f"{where}: greedy outputs differ from the in-process run")
            if a["tau"] is None or b["tau"] is None:
                reasons.append(f"{where}: no drafts in one of the runs")
                continue
            gap = relative_gap(a["tau"], b["tau"])
            tolerance = None if greedy else sampled_tolerance(a, b, sampled_z)
            if greedy and gap > max_gap:
                reasons.append(f"{where}: tau {a['tau']:.3f} vs in-process {b['tau']:.3f} (gap {gap:.1%} > "
                               f"serve_check.max_launch_tau_gap {max_gap:.0%})")
            elif tolerance is not None and abs(a["tau"] - b["tau"]) > tolerance:
                reasons.append(f"{where}: tau {a['tau']:.3f} vs in-process {b['tau']:.3f} (more than "
                               f"{sampled_z:g} standard errors, {tolerance:.3f})")
    return reasons


def serve_by_launch_command(python: Path, export_dir: Path, job: dict, config: ServeCheckConfig, log: Path) -> dict:
    """launch.md's command for `job`'s drafter, served and driven by OpenAI requests: its argv, the runner-shaped
    result (or the reason it has no argv) and its wall time. Needs nothing from the in-process run, so it runs
    beside the in-process engines (`run`)."""
    started = time.perf_counter()
    try:
        argv = launch_argv(export_dir, job, on_cpu())
    except DraftlineError as error:
        return {"argv": None, "result": {"error": str(error)}, "wall_s": time.perf_counter() - started}
    result = serve_launch_command(python, argv, job, log, config.engine_timeout_s, engine_env(config))
    if result.get("error"):
        result["error"] = explained(result["error"])
    return {"argv": argv, "result": result, "wall_s": time.perf_counter() - started, "log": str(log)}


def launch_command_record(served: dict, job: dict, in_process: dict, baseline: dict, generations: dict | None,
                          config: ServeCheckConfig) -> dict:
    """The drafter served by launch.md's command (`serve_by_launch_command`): serve_check's pass rule on that
    run, and its agreement with the in-process run."""
    argv, result = served["argv"], served["result"]
    if argv is None:
        return {"ran": False, "status": "failed", "reason": result["error"], "agrees_with_in_process": False}
    checked = check_drafter(job, result, baseline, generations, config)
    k = int(job["speculative_config"]["num_speculative_tokens"])
    disagreements = [] if result.get("error") else agreement(result, in_process, k, config.max_launch_tau_gap,
                                                             config.sampled_z)
    return {"command": command_line(argv), "added_args": ["--host", "127.0.0.1", "--port", "<free>", *engine_args(job)],
            "ran": not result.get("error"), "status": checked["status"], "reason": checked["reason"],
            "agrees_with_in_process": not result.get("error") and not disagreements, "disagreements": disagreements,
            "engine_start_s": result.get("engine_start_s"), "wall_s": served["wall_s"],
            "log": served["log"], "domains": checked["domains"]}


def with_launch_command(entry: dict, launch: dict) -> dict:
    """The drafter fails when launch.md's command did not pass or disagrees with the in-process run."""
    problems = ([launch["reason"]] if launch["status"] != "passed" else []) + launch.get("disagreements", [])
    entry = {**entry, "launch_command": launch}
    if problems and entry["status"] == "passed":
        entry.update(status="failed", reason="launch.md's command: " + "; ".join(problems))
    return entry


# --------------------------------------------------------------------------- stage


def exported_jobs(params: ServeCheckParams, paths: ArtifactPaths) -> dict[str, dict]:
    jobs = {}
    for kind in params.export.kinds:
        path = paths.export(kind) / VLLM_NAME
        if not path.is_file():
            raise DraftlineError(f"no {path}; run `dvc repro export` (or `draftline export`) first")
        jobs[kind] = resolved_job(read_json(path), paths.export(kind))
    return jobs


def _same_model(a: str, b: str) -> bool:
    """One model: the same directory through symlinks, or (not a path here) the same HF name."""
    return Path(a).resolve() == Path(b).resolve() if Path(a).exists() or Path(b).exists() else a == b


def check_served_files(paths: ArtifactPaths, kind: str, job: dict, verifier: str) -> None:
    """What vLLM is about to serve is this project's, else one line: the export's own files, each as its
    manifest hashed it (vllm.json, which names them, included), the drafter from inside the export dir, and
    the verifier this project records. A vllm.json edited to point elsewhere, or an export dir swapped for
    another one, would otherwise be measured and recorded under this project's verifier hash. (The export
    dir itself resolves inside the project: ArtifactPaths refuses it otherwise.)"""
    export_dir = paths.export(kind)
    fix = "re-run `dvc repro -f export`"
    verify_manifest(export_dir)
    files = json.loads((export_dir / "manifest.json").read_text(encoding="utf-8"))["files"]
    draft, model = job["speculative_config"].get("model"), job.get("model")
    if not isinstance(draft, str) or not Path(draft).resolve().is_relative_to(export_dir.resolve()):
        raise DraftlineError(f"{export_dir / VLLM_NAME} serves the {kind} drafter from {draft}, not from its export dir "
                             f"{export_dir}; {fix}")
    unlisted = sorted(path.relative_to(export_dir.resolve()).as_posix() for path in Path(draft).resolve().rglob("*")
                      if path.is_file() and path.relative_to(export_dir.resolve()).as_posix() not in files)
    if unlisted:
        raise DraftlineError(f"{export_dir} holds {', '.join(unlisted[:3])}, which its manifest.json does not list "
                             f"(vLLM would load it); {fix}")
    if not isinstance(model, str) or not _same_model(model, verifier):
        raise DraftlineError(f"{export_dir / VLLM_NAME} serves the verifier {model}, not this project's ({verifier}); "
                             f"{fix}")


def run(params: ServeCheckParams, args: argparse.Namespace) -> dict:
    from pipeline.verifier_record import model_location, read_record, verifier_identity
    from serve_eval.loading import load_test_prompts

    paths = ArtifactPaths.from_params(params)
    config = params.serve_check
    python, serve_versions = serving_env(config) or (None, None)
    jobs = exported_jobs(params, paths)
    # hashed before anything runs: the results belong to the files as they were when read
    measured = {kind: measured_artifacts(paths.drafter(kind), paths.export(kind)) for kind in jobs}
    prompts = load_test_prompts(paths, config.prompts_per_domain)
    log_dir = paths.root / LOG_DIR
    shutil.rmtree(log_dir, ignore_errors=True)  # every log there belongs to this run (a DVC output)
    log_dir.mkdir(parents=True)
    model = next(iter(jobs.values()))["model"]
    report: dict = {"verifier": model, "verifier_hash": verifier_identity(paths)["hash"],
                    "serve_python": str(python) if python else None,
                    "library_versions": library_versions(),
                    "serve_library_versions": serve_versions,
                    "tau_definition": TAU_DEFINITION, "prompts_per_domain": config.prompts_per_domain,
                    "max_new_tokens": config.max_new_tokens, "concurrency": config.concurrency,
                    "temperatures": [0.0] + sampled_temperatures(params), "max_tau_gap": config.max_tau_gap,
                    "max_batch_tau_gap": config.max_batch_tau_gap, "sampled_z": config.sampled_z,
                    "gate_sampled": config.gate_sampled, "sampled_note": SAMPLED_NOTE,
                    "launch_command": config.launch_command,
                    "baseline": None, "drafters": {}}
    from serve_eval import llamacpp_engine  # imports this module

    report["llamacpp"], generations = llamacpp_engine.check(params, paths, prompts, log_dir)
    if python is None:
        reason = ("no serving environment (.venv-serve with vLLM) and serve_check.required is false: run "
                  "`make serve-env` to check the drafters in vLLM")
        report["drafters"] = {kind: {"status": "skipped", "reason": reason, "domains": {}} for kind in jobs}
        return finish(report, paths, measured)
    for kind, job in jobs.items():
        check_served_files(paths, kind, job, model_location(paths, read_record(paths)))

    info(f"serve_check: vLLM without speculation ({sum(map(len, prompts.values()))} prompts, {python})")
    launches: dict[str, Future] = {}
    # launch.md's servers start beside the in-process engines: each spends ~30 s importing vLLM in three
    # processes, mostly one core's work, while the in-process engines run in the fork server
    with forked_runner(python, log_dir, config) as forked, ThreadPoolExecutor(max_workers=len(jobs)) as launcher, \
            servers_stopped_on_error():
        baseline = run_engine(python, engine_job(model, None, prompts, params), "baseline", log_dir, config, forked)
        report["baseline"] = {"engine_start_s": baseline.get("engine_start_s"), "error": baseline.get("error"),
                              "log": baseline.get("log"),
                              "tokens_per_s": {name: {d: r["tokens"] / max(r["wall_s"], 1e-9) for d, r in run.items()}
                                               for name, run in baseline.get("runs", {}).items()}}
        if baseline.get("error"):
            status, why = classify_error(baseline["error"])
            reason = f"the verifier alone did not run in vLLM: {why}"
            report["drafters"] = {kind: {"status": status, "reason": reason, "domains": {}} for kind in jobs}
            return finish(report, paths, measured)

        engine_jobs = {kind: engine_job(model, job["speculative_config"], prompts, params) for kind, job in jobs.items()}
        results = {}
        launch_started = None
        for kind, job in engine_jobs.items():
            info(f"serve_check: vLLM with the {kind} drafter ({json.dumps(job['speculative_config'])}; runs: "
                 f"{', '.join(run['name'] for run in job['runs'])})")
            results[kind] = run_engine(python, job, kind, log_dir, config, forked)
            if results[kind].get("error"):
                info(f"serve_check: {kind}: {results[kind]['error']}")
            elif config.launch_command:  # only a drafter that ran in process: the command's check compares with it
                info(f"serve_check: the {kind} drafter served by launch.md's command, OpenAI requests")
                launch_started = launch_started or time.perf_counter()
                launches[kind] = launcher.submit(serve_by_launch_command, python, paths.export(kind), job, config,
                                                 log_dir / f"{kind}.launch.log")
        served = {kind: launch.result() for kind, launch in launches.items()}
        if served:  # the first command's start to the last one's end: they overlap each other and the engines
            report["launch_command_wall_s"] = time.perf_counter() - launch_started
    loaded = [kind for kind in jobs if not results[kind].get("error")]
    missing = [kind for kind in loaded if kind not in generations]
    generations.update(draftline_runs(params, paths, missing, prompts) if missing else {})
    for kind, job in engine_jobs.items():
        report["drafters"][kind] = check_drafter(job, results[kind], baseline, generations.get(kind), config)
    for kind, launch in served.items():
        record = launch_command_record(launch, engine_jobs[kind], results[kind], baseline, generations.get(kind), config)
        report["drafters"][kind] = with_launch_command(report["drafters"][kind], record)
    return finish(report, paths, measured)


def finish(report: dict, paths: ArtifactPaths, measured: dict[str, dict]) -> dict:
    for kind, entry in report["drafters"].items():
        entry.update(measured[kind])
    write_serving_plots(paths.plots, report)
    write_json_atomic(paths.metrics / SERVING_JSON, report)
    print_table(report)
    return report


def _tau(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(report: dict) -> None:
    from rich.table import Table

    table = Table(title="serve_check: vLLM vs draftline (tau = 1 + accepted per drafting step)", title_justify="left")
    for column in ("drafter", "status", "domain", "identical", "tau c=1", f"tau c={report['concurrency']}",
                   "draftline tau", "batch gap", "sampled tau vLLM / draftline", "launch.md cmd tau c=1 / sampled",
                   "tok/s c=1 (no spec)", f"tok/s c={report['concurrency']} (no spec)"):
        table.add_column(column)
    colour = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for kind, entry in report["drafters"].items():
        status = f"[{colour[entry['status']]}]{entry['status']}[/]"
        if not entry["domains"]:
            table.add_row(kind, status, *["-"] * 10)
        for domain, record in entry["domains"].items():
            single, batched = record[SINGLE], record[BATCHED]
            identical = single["outputs_identical"] and batched["outputs_identical"]
            sampled = ", ".join(f"{name}: {_tau(s['vllm']['tau'])} / {_tau(s['draftline']['tau'])}"
                                for name, s in record.get("sampled", {}).items()) or "-"
            speeds = [f"{r['vllm']['tokens_per_s']:.0f} ({r['vllm']['baseline_tokens_per_s']:.0f})"
                      for r in (single, batched)]
            launched = (entry.get("launch_command") or {}).get("domains", {}).get(domain)
            launch = "-" if launched is None else " / ".join(
                [_tau(launched[SINGLE]["vllm"]["tau"])] + [_tau(s["vllm"]["tau"]) for s in launched.get("sampled", {}).values()])
            table.add_row(kind, status, domain, "yes" if identical else "[red]no[/]", _tau(single["vllm"]["tau"]),
                          _tau(batched["vllm"]["tau"]), _tau(record.get("draftline", {}).get("tau")),
                          f"{record['batch_tau_gap']:.1%}" if "batch_tau_gap" in record else "-", sampled, launch,
                          *speeds)
    console.print(table)
    if len(report["temperatures"]) > 1:
        console.print(f"  sampled tau: {report['sampled_note']}")
    for kind, entry in report["drafters"].items():
        if entry["reason"]:
            console.print(f"  {kind}: {entry['status']}: {entry['reason']}")
        for domain, record in entry.get("domains", {}).items():
            for gap in record.get("sampled_warnings", []):
                warn(f"serve_check {kind} {domain}: {gap} (recorded, not gated: serve_check.gate_sampled is false)")
    baseline = report.get("baseline") or {}
    if baseline.get("engine_start_s") is not None:
        starts = [f"{kind} {e['engine_start_s']:.0f} s" for kind, e in report["drafters"].items()
                  if e.get("engine_start_s") is not None]
        info(f"vLLM engine start: no speculation {baseline['engine_start_s']:.0f} s, " + ", ".join(starts))
    info("metrics/serving.json and plots/serving_tau.* written")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline serve_check", __doc__.splitlines()[0])
    return run_stage(parser, ServeCheckParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
