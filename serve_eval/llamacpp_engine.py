"""serve_check on llama.cpp: each drafter's GGUF served by the `llama-server` line of its launch.md.

The line runs as written, from `.venv-llamacpp` through `serve_eval/llama_server.py` (xllamacpp's embedded
llama.cpp server under llama-server's flags: no prebuilt `llama-server` binary exists on PyPI), with a
free port in place of launch.md's and `--parallel serve_check.concurrency --ctx-size ... --metrics` added.
The same prompts as vLLM's go to its `/completion` endpoint as token ids, greedy and at every evaluate
T > 0, one at a time and `concurrency` at once; τ comes from the server's `/metrics` spec-decode counters
(`llamacpp:spec_decode_num_drafts_total`, ..._per_pos_total: vLLM's counters under llama.cpp's prefix),
read before and after every run. One server without speculation gives the greedy reference outputs,
and the Q8_0 drafter runs greedy for its τ. The results take vLLM's runner shape, so serve_check's
comparison and pass rule (`pipeline/serving_rule.py`) apply unchanged.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.error
import urllib.request
from pathlib import Path

from export import gguf_files
from export.launch_files import LAUNCH_NAME
from pipeline.errors import DraftlineError
from pipeline.lineage import read_json
from pipeline.llamacpp_launch import SERVER
from pipeline.progress import info, warn
from pipeline.server_process import free_port, running_server
from pipeline.serving_rule import sampled_verification_defect
from pipeline.serving_venv import llamacpp_python
from serve_eval.launch_check import first_error_line, parse_counters, run_domain
from serve_eval.serve_check import check_drafter, draftline_runs, engine_job

LAUNCHER = Path(__file__).with_name("llama_server.py")
COUNTERS = {"llamacpp:spec_decode_num_drafts_total": "vllm:spec_decode_num_drafts",
            "llamacpp:spec_decode_num_draft_tokens_total": "vllm:spec_decode_num_draft_tokens",
            "llamacpp:spec_decode_num_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens"}
PER_POSITION_COUNTER = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
DRAFT_TOKENS = COUNTERS["llamacpp:spec_decode_num_draft_tokens_total"]  # the name a run's counters carry
ACCEPTED_TOKENS = COUNTERS["llamacpp:spec_decode_num_accepted_tokens_total"]
SPECULATIVE_FLAGS = ("-md", "--spec-type", "--spec-draft-n-max", "--spec-draft-sampling")  # each takes a value
# llama.cpp's fatal line (GGML_ABORT / GGML_ASSERT: "<source file>:<line>: <what>"); the gdb backtrace it prints
# next ends with "[Inferior 1 (process N) detached]", which names nothing
FATAL_LINE = re.compile(r"[\w./-]+\.(?:c|cc|cpp|h):\d+: \S.*")


def engine_error_line(log: Path) -> str:
    """Why llama-server stopped: its fatal line when it aborted, else the first error line of the log."""
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        fatal = FATAL_LINE.search(line)
        if fatal:
            return f"llama-server aborted: {fatal.group(0).strip()}"
    return first_error_line(log)


def launch_arguments(export_dir: Path) -> list[str]:
    """The arguments of launch.md's `llama-server` line; raises when it has none or its files are gone."""
    launch = export_dir / LAUNCH_NAME
    text = launch.read_text(encoding="utf-8") if launch.is_file() else ""
    line = next((line for line in text.splitlines() if line.startswith(f"{SERVER} ")), None)
    if line is None:
        raise DraftlineError(f"{launch} shows no `{SERVER}` command; re-run `dvc repro export`")
    arguments = shlex.split(line)[1:]
    for flag in ("-m", "-md"):
        path = Path(arguments[arguments.index(flag) + 1])
        if not path.is_file():
            raise DraftlineError(f"{launch}: {flag} {path} does not exist (moved project?); run `dvc repro -f export`")
    return arguments


def without_speculation(arguments: list[str]) -> list[str]:
    """The same server with no drafter: the speculative flags and their values dropped."""
    kept, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument in SPECULATIVE_FLAGS:
            skip = True
        else:
            kept.append(argument)
    return kept


def with_drafter(arguments: list[str], drafter: Path) -> list[str]:
    return [str(drafter) if i and arguments[i - 1] == "-md" else a for i, a in enumerate(arguments)]


def self_drafting(arguments: list[str]) -> list[str]:
    """The same server with the verifier as its own draft model (a plain draft model: draft-simple)."""
    drafted = with_drafter(arguments, Path(arguments[arguments.index("-m") + 1]))
    return ["draft-simple" if i and drafted[i - 1] == "--spec-type" else a for i, a in enumerate(drafted)]


def draft_max(arguments: list[str]) -> int:
    return int(arguments[arguments.index("--spec-draft-n-max") + 1])


def server_argv(python: Path, arguments: list[str], port: int, job: dict, concurrency: int) -> list[str]:
    """launch.md's arguments with `port` for its port, plus the slots and context the runs need and /metrics."""
    replaced = [str(port) if i and arguments[i - 1] == "--port" else a for i, a in enumerate(arguments)]
    return [str(python), "-I", str(LAUNCHER), *replaced, "--parallel", str(concurrency),
            "--ctx-size", str(job["max_model_len"] * concurrency), "--metrics"]


def read_counters(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        return parse_counters(response.read().decode(), COUNTERS, PER_POSITION_COUNTER)


def complete(base: str, model: str, ids: list[int], run: dict, max_tokens: int, seed: int, timeout_s: float) -> list:
    """One `/completion` request; llama.cpp's default samplers (top_k 40, top_p 0.95, min_p 0.05) are set to
    the run's, so T > 0 samples what draftline samples."""
    body = {"prompt": ids, "n_predict": max_tokens, "temperature": run["temperature"], "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "top_k": run["top_k"], "top_p": run["top_p"],
            "min_p": 0.0, "seed": seed}
    request = urllib.request.Request(f"{base}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return list(json.loads(response.read())["tokens"])


def serve(python: Path, argv: list[str], port: int, job: dict, log: Path, timeout_s: float) -> dict:
    """`argv` serving `job`'s runs; vLLM's runner result shape, or {"error": ...}."""
    base = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    try:
        with running_server(argv, port, log, timeout_s, "serve_check.engine_timeout_s"):
            engine_start_s = time.perf_counter() - started
            runs = {spec["name"]: {domain: run_domain(base, prompts, spec, job, timeout_s, complete, read_counters)
                                   for domain, prompts in job["prompts"].items()} for spec in job["runs"]}
    except (DraftlineError, urllib.error.URLError, OSError, KeyError) as error:
        return {"error": engine_error_line(log) if log.is_file() else str(error), "log": str(log)}
    return {"error": None, "engine_start_s": engine_start_s, "runs": runs, "log": str(log)}


def gguf_skip(export_dir: Path) -> str | None:
    """Why the export has no GGUF files (its manifest's reason), or None."""
    manifest = export_dir / "manifest.json"
    skipped = (read_json(manifest).get("skipped") or {}) if manifest.is_file() else {}
    return skipped.get("gguf")


def check(params, paths, prompts: dict, log_dir: Path) -> tuple[dict, dict]:
    """Every exported kind on llama.cpp: ({"baseline", "drafters": {kind: serve_check entry + "command", "q8_0"}},
    draftline's runs of the kinds served, which serve_check reuses for vLLM)."""
    python = llamacpp_python()
    config = params.serve_check
    report: dict = {"python": str(python) if python else None, "runtime": gguf_files.runtime_pin(), "drafters": {}}
    kinds = list(params.export.kinds)
    if python is None:
        reason = f"{gguf_files.skip_reason()}: llama.cpp not checked"
        report["drafters"] = {kind: {"status": "skipped", "reason": reason, "domains": {}} for kind in kinds}
        return report, {}
    started = time.perf_counter()
    arguments, reasons = {}, {}
    for kind in kinds:
        try:
            reasons[kind] = gguf_skip(paths.export(kind))
            if reasons[kind] is None:
                arguments[kind] = launch_arguments(paths.export(kind))
        except DraftlineError as error:
            reasons[kind] = str(error)
    if not arguments:
        report["drafters"] = {kind: {"status": "skipped", "reason": reasons[kind], "domains": {}} for kind in kinds}
        return report, {}
    reference = without_speculation(next(iter(arguments.values())))
    model = reference[reference.index("-m") + 1]
    baseline_job = engine_job(model, None, prompts, params)
    port = free_port()
    baseline = serve(python, server_argv(python, reference, port, baseline_job, config.concurrency), port,
                     baseline_job, log_dir / "llamacpp-baseline.log", config.engine_timeout_s)
    report["baseline"] = {"command": shlex.join([SERVER, *reference]), "error": baseline.get("error"),
                          "log": baseline.get("log")}
    report["sampled_self_test"] = sampled_self_test(python, next(iter(arguments.values())), prompts, params,
                                                    log_dir / "llamacpp-self-draft.log")
    defect = sampled_verification_defect(report["sampled_self_test"])
    if defect:
        # the engine's own way of sampling drafts, shown with a perfect drafter: its sampled τ is recorded and warned
        # about, not held against the drafters (promote rederives this from the same recorded counts)
        warn(f"serve_check: llama.cpp's sampled speculation is not draftline's: {defect}; its sampled tau is "
             "recorded, not gated")
        params = params.model_copy(update={"serve_check": config.model_copy(update={"gate_sampled": False})})
    generations = draftline_runs(params, paths, list(arguments), prompts)
    for kind in kinds:
        if kind not in arguments:
            report["drafters"][kind] = {"status": "skipped", "reason": reasons[kind], "domains": {}}
            continue
        report["drafters"][kind] = check_kind(python, kind, arguments[kind], baseline, generations.get(kind),
                                              params, prompts, log_dir, paths)
        info(f"serve_check: llama.cpp, {kind} drafter: {summary(report['drafters'][kind])}")
    report["wall_s"] = time.perf_counter() - started
    return report, generations


def sampled_self_test(python: Path, arguments: list[str], prompts: dict, params, log: Path) -> dict:
    """{run name: {"drafted", "accepted"}} of the verifier drafting for itself at every evaluate T > 0 (the sampled
    runs serve_check makes), or {"error": ...}: what the engine's sampled verification does with no drafter of ours."""
    config = params.serve_check
    own = self_drafting(arguments)
    job = engine_job(own[own.index("-m") + 1], {"num_speculative_tokens": draft_max(own)}, prompts, params)
    job["runs"] = [run for run in job["runs"] if run["temperature"] > 0]
    if not job["runs"]:
        return {}
    port = free_port()
    result = serve(python, server_argv(python, own, port, job, config.concurrency), port, job, log,
                   config.engine_timeout_s)
    if result["error"]:
        return {"error": result["error"]}
    return {name: {"drafted": sum(run["counters"][DRAFT_TOKENS] for run in domains.values()),
                   "accepted": sum(run["counters"][ACCEPTED_TOKENS] for run in domains.values())}
            for name, domains in result["runs"].items()}


def check_kind(python: Path, kind: str, arguments: list[str], baseline: dict, generations: dict | None, params,
               prompts: dict, log_dir: Path, paths) -> dict:
    config = params.serve_check
    if baseline.get("error"):
        return {"status": "failed", "reason": f"the verifier alone did not run in llama.cpp: {baseline['error']}",
                "domains": {}}
    job = engine_job(arguments[arguments.index("-m") + 1], {"num_speculative_tokens": draft_max(arguments)},
                     prompts, params)
    port = free_port()
    result = serve(python, server_argv(python, arguments, port, job, config.concurrency), port, job,
                   log_dir / f"{kind}.llamacpp.log", config.engine_timeout_s)
    entry = {**check_drafter(job, result, baseline, generations, config), "command": shlex.join([SERVER, *arguments])}
    # the Q8_0 drafter, greedy: its τ beside the f32 one's (what quantizing the drafter costs)
    q8_job = {**job, "runs": [run for run in job["runs"] if run["temperature"] == 0.0]}
    q8_args = with_drafter(arguments, paths.export(kind) / gguf_files.drafter_gguf(kind, "q8_0"))
    port = free_port()
    q8 = serve(python, server_argv(python, q8_args, port, q8_job, config.concurrency), port, q8_job,
               log_dir / f"{kind}.q8_0.llamacpp.log", config.engine_timeout_s)
    checked = check_drafter(q8_job, q8, baseline, None, config)
    entry["q8_0"] = {"status": checked["status"], "reason": checked["reason"],
                     "domains": {domain: {name: record[name] for name in ("single", "batched")}
                                 for domain, record in checked["domains"].items()}}
    return entry


def summary(entry: dict) -> str:
    """One line per drafter for the stage's output: status, then τ single / parallel / draftline per domain."""
    if entry["status"] != "passed":
        return f"{entry['status']}: {entry['reason']}"
    taus = [f"{domain} tau {record['single']['vllm']['tau']:.2f} / {record['batched']['vllm']['tau']:.2f} parallel / "
            f"{(record.get('draftline') or {}).get('tau') or float('nan'):.2f} draftline"
            for domain, record in entry["domains"].items()]
    return "passed, " + "; ".join(taus)
