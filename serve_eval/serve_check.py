"""Stage `serve_check`: the exported drafters, run in vLLM exactly as `launch.md` tells users.

For each exported drafter it starts one vLLM engine on the verifier with the drafter attached
through the speculative config of `artifacts/export/<kind>/vllm.json` (the one launch.md shows),
greedy, on the corpus test prompts of every domain, plus one engine without speculation whose
outputs every drafter is compared with. vLLM runs in the serving environment (`make serve-env`:
vLLM without draftline, so the export has to stand on its own) through `serve_eval/vllm_runner.py`.
Per drafter and domain `metrics/serving.json` records whether the outputs are identical, vLLM's
spec-decode counters and the τ computed from them, vLLM tokens/s with and without the drafter, and
draftline's own τ on the same prompts, decoded here with `serve_eval.decoding`.

τ is compared in vLLM's definition: 1 + accepted drafts per drafting step (bonus token included;
the prefill step, which drafts nothing in vLLM, is left out on both sides, and so are draftline's
steps cut short by max_new_tokens, which vLLM drafts in full). A drafter fails when it
does not load, its outputs differ, vLLM proposed nothing, or the two τ differ by more than
`serve_check.max_tau_gap`; it is `skipped` when vLLM's CPU kernels cannot run the model. A failing
drafter never fails the stage; `serve_check.required` makes `promote` refuse it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from export.serving import VLLM_NAME
from pipeline.atomic import write_json_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params, ServeCheckConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import measured_artifacts
from pipeline.lineage import library_versions, read_json
from pipeline.paths import ArtifactPaths
from pipeline.progress import console, info
from pipeline.serve_env import serve_python
from serve_eval.serving_plots import write_serving_plots

RUNNER = Path(__file__).with_name("vllm_runner.py")
SERVING_JSON = "serving.json"
LOG_DIR = "serve_check"  # under artifacts/: one vLLM log per engine, for the failures
# vLLM's CPU attention rejects some head sizes (e.g. head_dim 8): a limit of the CPU build, not of the export
SKIP_MARKERS = ("Unsupported CPU attention configuration",)
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = (
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos")
TAU_DEFINITION = ("1 + accepted draft tokens per drafting step (bonus/correction token included; vLLM's "
                  "prefill step, which drafts nothing, and draftline's steps cut short by max_new_tokens are not "
                  "counted)")


# --------------------------------------------------------------------------- vLLM engines


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_engine(python: Path, job: dict, name: str, log_dir: Path, config: ServeCheckConfig) -> dict:
    """One vLLM engine in the serving environment; the runner's result, or {"error": ...}."""
    log = log_dir / f"{name}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib), "HF_HUB_OFFLINE": "1",
           # engine core in the runner's own process: its exceptions (not "engine core died") reach the result
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with tempfile.TemporaryDirectory(prefix="serve_check_") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        try:
            with log.open("w", encoding="utf-8") as handle:
                subprocess.run([str(python), "-I", str(RUNNER), str(job_path), str(result_path)], stdout=handle,
                               stderr=subprocess.STDOUT, env=env, timeout=config.engine_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"vLLM did not finish within {config.engine_timeout_s} s "
                             f"(serve_check.engine_timeout_s); log: {log}", "log": str(log)}
        if not result_path.is_file():  # killed (memory) or the interpreter itself failed
            return {"error": f"vLLM runner exited without a result: {_last_line(log)}", "log": str(log)}
        return {**json.loads(result_path.read_text(encoding="utf-8")), "log": str(log)}


def engine_job(model: str, speculative_config: dict | None, prompts: dict[str, list[list[int]]],
               params: Params) -> dict:
    config = params.serve_check
    longest = max(len(ids) for domain in prompts.values() for ids in domain)
    k = (speculative_config or {}).get("num_speculative_tokens", 0)
    return {"model": model, "speculative_config": speculative_config, "prompts": prompts,
            "max_new_tokens": config.max_new_tokens, "dtype": params.verifier.dtype, "seed": params.project.seed,
            "max_model_len": longest + config.max_new_tokens + k + 1, "enforce_eager": config.enforce_eager}


# --------------------------------------------------------------------------- draftline's side


def draftline_runs(params: Params, paths: ArtifactPaths, kinds: list[str],
                   prompts: dict[str, list[list[int]]]) -> dict[str, dict[str, list]]:
    """kind -> domain -> draftline's greedy Generation per prompt (no EOS stop, as vLLM runs with ignore_eos)."""
    from serve_eval.decoding import decode
    from serve_eval.loading import load_drafters, load_verifier_for_decoding

    verifier, tokenizer = load_verifier_for_decoding(paths, params.verifier)
    evaluate = params.evaluate.model_copy(update={"drafters": kinds, "backend": "torch"})
    drafters = load_drafters(paths, evaluate, verifier, tokenizer)
    runs: dict[str, dict[str, list]] = {}
    for kind, drafter in drafters.items():
        info(f"serve_check: draftline decoding with the {kind} drafter")
        runs[kind] = {domain: [decode(verifier, ids, params.serve_check.max_new_tokens, proposer=drafter.proposer)
                               for ids in domain_prompts]
                      for domain, domain_prompts in prompts.items()}
    return runs


def draftline_metrics(generations: list, k: int) -> dict:
    """τ over the steps that drafted the full k: near max_new_tokens draftline drafts fewer, while vLLM
    drafts k anyway and counts acceptances past the limit, so the cut steps would bias the comparison."""
    drafting = [step for g in generations for step in g.steps if step.drafted == k]
    accepted = sum(step.accepted for step in drafting)
    drafted = sum(step.drafted for step in drafting)
    forwards = sum(g.verifier_forwards for g in generations)
    return {"tau": 1 + accepted / max(1, len(drafting)),
            "tau_evaluate": sum(len(g.new_ids) for g in generations) / max(1, forwards),
            "acceptance_rate": accepted / max(1, drafted), "drafting_steps": len(drafting)}


# --------------------------------------------------------------------------- comparison


def vllm_metrics(domain: dict, baseline: dict) -> dict:
    counters = domain["counters"]
    drafts, accepted = counters.get(DRAFTS, 0), counters.get(ACCEPTED, 0)
    tokens_per_s = domain["tokens"] / max(domain["wall_s"], 1e-9)
    baseline_tokens_per_s = baseline["tokens"] / max(baseline["wall_s"], 1e-9)
    return {"tau": 1 + accepted / drafts if drafts else None,
            "acceptance_rate": accepted / max(1, counters.get(DRAFT_TOKENS, 0)),
            "num_drafts": drafts, "num_draft_tokens": counters.get(DRAFT_TOKENS, 0), "num_accepted_tokens": accepted,
            "num_accepted_tokens_per_pos": counters.get(PER_POSITION, []),
            "tokens_per_s": tokens_per_s, "baseline_tokens_per_s": baseline_tokens_per_s,
            "speedup": tokens_per_s / max(baseline_tokens_per_s, 1e-9)}


def compare_domain(result: dict, baseline: dict, generations: list | None, k: int,
                   max_gap: float) -> tuple[dict, str | None]:
    """One drafter x domain: (record, failure reason or None)."""
    ours, reference = result["outputs"], baseline["outputs"]
    mismatched = sum(a != b for a, b in zip(ours, reference)) + abs(len(ours) - len(reference))
    record = {"prompts": len(reference), "outputs_identical": mismatched == 0, "mismatched_prompts": mismatched,
              "vllm": vllm_metrics(result, baseline)}
    if generations is not None:
        record["draftline"] = draftline_metrics(generations, k)
        # equal outputs expected too, but fp32 kernels may flip a near-tie: reported, not gated
        record["draftline_same_outputs"] = sum(g.new_ids == ids for g, ids in zip(generations, ours))
    vllm_tau = record["vllm"]["tau"]
    if mismatched:
        return record, f"outputs differ from vLLM without speculation on {mismatched}/{len(reference)} prompts"
    if vllm_tau is None:
        return record, "vLLM proposed no drafts (speculation was not active)"
    if generations is not None:
        ours_tau = record["draftline"]["tau"]
        record["tau_gap"] = abs(vllm_tau - ours_tau) / ours_tau
        if record["tau_gap"] > max_gap:
            return record, (f"vLLM tau {vllm_tau:.3f} vs draftline tau {ours_tau:.3f}: gap {record['tau_gap']:.1%} "
                            f"> serve_check.max_tau_gap {max_gap:.0%}")
    return record, None


def classify_error(error: str) -> str:
    return "skipped" if any(marker in error for marker in SKIP_MARKERS) else "failed"


def check_drafter(job: dict, result: dict, baseline: dict, generations: dict | None, max_gap: float) -> dict:
    entry = {"status": "passed", "reason": None, "speculative_config": job["speculative_config"],
             "engine_start_s": result.get("engine_start_s"), "log": result.get("log"), "domains": {}}
    if result.get("error"):
        return {**entry, "status": classify_error(result["error"]), "reason": result["error"]}
    reasons = []
    for domain, base in baseline["domains"].items():
        record, reason = compare_domain(result["domains"][domain], base,
                                        generations.get(domain) if generations else None,
                                        int(job["speculative_config"]["num_speculative_tokens"]), max_gap)
        entry["domains"][domain] = record
        if reason:
            reasons.append(f"{domain}: {reason}")
    if reasons:
        entry.update(status="failed", reason="; ".join(reasons))
    return entry


# --------------------------------------------------------------------------- stage


def exported_jobs(params: Params, paths: ArtifactPaths) -> dict[str, dict]:
    jobs = {}
    for kind in params.export.kinds:
        path = paths.export(kind) / VLLM_NAME
        if not path.is_file():
            raise DraftlineError(f"no {path}; run `dvc repro export` (or `draftline export`) first")
        jobs[kind] = read_json(path)
    return jobs


def run(params: Params, args: argparse.Namespace) -> dict:
    from data_prep.verifier import verifier_identity
    from serve_eval.loading import load_test_prompts

    paths = ArtifactPaths.from_params(params)
    config = params.serve_check
    jobs = exported_jobs(params, paths)
    # hashed before anything runs: the results belong to the files as they were when read
    measured = {kind: measured_artifacts(paths.drafter(kind), paths.export(kind)) for kind in jobs}
    prompts = load_test_prompts(paths, config.prompts_per_domain)
    log_dir = paths.root / LOG_DIR
    shutil.rmtree(log_dir, ignore_errors=True)  # every log there belongs to this run (a DVC output)
    log_dir.mkdir(parents=True)
    python = serve_python()
    model = next(iter(jobs.values()))["model"]
    report: dict = {"verifier": model, "verifier_hash": verifier_identity(paths)["hash"],
                    "serve_python": str(python) if python else None,
                    "library_versions": library_versions(),
                    "serve_library_versions": library_versions(python) if python else None,
                    "tau_definition": TAU_DEFINITION, "prompts_per_domain": config.prompts_per_domain,
                    "max_new_tokens": config.max_new_tokens, "max_tau_gap": config.max_tau_gap,
                    "baseline": None, "drafters": {}}
    if python is None:
        reason = "no serving environment (.venv-serve with vLLM): run `make serve-env`"
        report["drafters"] = {kind: {"status": "skipped", "reason": reason, "domains": {}} for kind in jobs}
        return finish(report, paths, measured)

    info(f"serve_check: vLLM without speculation ({sum(map(len, prompts.values()))} prompts, {python})")
    baseline = run_engine(python, engine_job(model, None, prompts, params), "baseline", log_dir, config)
    report["baseline"] = {"engine_start_s": baseline.get("engine_start_s"), "error": baseline.get("error"),
                          "log": baseline.get("log"),
                          "tokens_per_s": {d: r["tokens"] / max(r["wall_s"], 1e-9)
                                           for d, r in baseline.get("domains", {}).items()}}
    if baseline.get("error"):
        status = classify_error(baseline["error"])
        reason = f"the verifier alone did not run in vLLM: {baseline['error']}"
        report["drafters"] = {kind: {"status": status, "reason": reason, "domains": {}} for kind in jobs}
        return finish(report, paths, measured)

    results = {}
    for kind, job in jobs.items():
        info(f"serve_check: vLLM with the {kind} drafter ({json.dumps(job['speculative_config'])})")
        results[kind] = run_engine(python, engine_job(model, job["speculative_config"], prompts, params), kind,
                                   log_dir, config)
        if results[kind].get("error"):
            info(f"serve_check: {kind}: {results[kind]['error']}")
    loaded = [kind for kind in jobs if not results[kind].get("error")]
    generations = draftline_runs(params, paths, loaded, prompts) if loaded else {}
    for kind, job in jobs.items():
        report["drafters"][kind] = check_drafter(job, results[kind], baseline, generations.get(kind),
                                                 config.max_tau_gap)
    return finish(report, paths, measured)


def finish(report: dict, paths: ArtifactPaths, measured: dict[str, dict]) -> dict:
    for kind, entry in report["drafters"].items():
        entry.update(measured[kind])
    write_serving_plots(paths.plots, report)
    write_json_atomic(paths.metrics / SERVING_JSON, report)
    print_table(report)
    return report


def print_table(report: dict) -> None:
    from rich.table import Table

    table = Table(title="serve_check: vLLM vs draftline (tau = 1 + accepted per drafting step)", title_justify="left")
    for column in ("drafter", "status", "domain", "identical", "vLLM tau", "draftline tau", "gap", "vLLM tok/s",
                   "no-spec tok/s"):
        table.add_column(column)
    colour = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for kind, entry in report["drafters"].items():
        status = f"[{colour[entry['status']]}]{entry['status']}[/]"
        if not entry["domains"]:
            table.add_row(kind, status, "-", "-", "-", "-", "-", "-", "-")
        for domain, record in entry["domains"].items():
            v, d = record["vllm"], record.get("draftline", {})
            table.add_row(kind, status, domain, "yes" if record["outputs_identical"] else "[red]no[/]",
                          "-" if v["tau"] is None else f"{v['tau']:.2f}", f"{d['tau']:.2f}" if d else "-",
                          f"{record['tau_gap']:.1%}" if "tau_gap" in record else "-",
                          f"{v['tokens_per_s']:.0f}", f"{v['baseline_tokens_per_s']:.0f}")
    console.print(table)
    for kind, entry in report["drafters"].items():
        if entry["reason"]:
            console.print(f"  {kind}: {entry['status']}: {entry['reason']}")
    baseline = report.get("baseline") or {}
    if baseline.get("engine_start_s") is not None:
        starts = [f"{kind} {e['engine_start_s']:.0f} s" for kind, e in report["drafters"].items()
                  if e.get("engine_start_s") is not None]
        info(f"vLLM engine start: no speculation {baseline['engine_start_s']:.0f} s, " + ", ".join(starts))
    info("metrics/serving.json and plots/serving_tau.* written")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline serve_check", __doc__.splitlines()[0])
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
