"""serve_check's launch-command mode: each drafter served by the command launch.md shows, driven as users drive it.

launch.md's line for this machine's vLLM build (`pipeline/vllm_launch.py`: `vllm serve` on GPU builds,
the server module on the CPU build) is rebuilt from `vllm.json` and must appear in launch.md verbatim;
it is started from the serving environment with `--host 127.0.0.1 --port <free>` and the engine
settings of the in-process run (`ENGINE_ARGS`), and the same prompts go to it as OpenAI completions
requests (token-id prompts, `ignore_eos`, `return_token_ids`) at each run's concurrency. vLLM's
spec-decode counters are read from the server's `/metrics` before and after every run. The result has
the in-process runner's shape (`vllm_runner.py`), so serve_check applies its pass rule unchanged and
compares the two runs of each drafter.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from export.launch_files import LAUNCH_NAME
from pipeline.errors import DraftlineError
from pipeline.progress import warn
from pipeline.server_process import EngineKilled, check_not_killed, free_port, running_server
from pipeline.vllm_launch import command, command_line

# Prometheus names of the counters vllm_runner.py reads through `LLM.get_metrics()`
COUNTER_SERIES = {"vllm:spec_decode_num_drafts_total": "vllm:spec_decode_num_drafts",
                  "vllm:spec_decode_num_draft_tokens_total": "vllm:spec_decode_num_draft_tokens",
                  "vllm:spec_decode_num_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens"}
PER_POSITION_SERIES = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SAMPLE = re.compile(r'^(?P<name>[\w:]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
ERROR_LINE = re.compile(r"\b\w*(?:Error|Exception)\b: ")
NOT_ERRORS = re.compile(r"\b(?:DEBUG|INFO|WARNING)\b")


# stand-ins for the verifier and draft paths when launch.md's line is matched: it shows the absolute paths
# of where the project was exported (for pasting), while vllm.json's resolve to where it is now
_VERIFIER, _DRAFT = "DRAFTLINEVERIFIERPATH", "DRAFTLINEDRAFTPATH"  # nothing re.escape changes


def launch_argv(export_dir: Path, job: dict, cpu: bool) -> list[str]:
    """launch.md's command for this build, as rebuilt from vllm.json (its paths resolved for this export dir);
    raises when launch.md does not show that command, up to where the paths point."""
    argv = command(job["model"], job["speculative_config"], cpu)
    template = command_line(command(_VERIFIER, {**job["speculative_config"], "model": _DRAFT}, cpu))
    pattern = re.escape(template).replace(_VERIFIER, r"(?P<verifier>'[^']*'|\S+)").replace(_DRAFT, r'(?P<draft>[^"]+)')
    launch = export_dir / LAUNCH_NAME
    shown = re.search(pattern, launch.read_text(encoding="utf-8")) if launch.is_file() else None
    if shown is None:
        raise DraftlineError(f"{launch} does not show the command serve_check runs ({command_line(argv)}); "
                             "re-run `dvc repro export`")
    if (shlex.split(shown["verifier"])[0], shown["draft"]) != (job["model"], job["speculative_config"]["model"]):
        warn(f"{launch} names the files where the project was exported ({shown['draft']}); serve_check serves "
             f"this project's ({job['speculative_config']['model']}): run `dvc repro -f export` to refresh launch.md")
    return argv


def engine_args(engine: dict) -> list[str]:
    """The in-process run's engine settings, which launch.md leaves to the user."""
    return ["--dtype", engine["dtype"], "--max-model-len", str(engine["max_model_len"]), "--seed", str(engine["seed"]),
            *(["--enforce-eager"] if engine["enforce_eager"] else []),
            "--generation-config", "vllm"]  # sampling exactly as each request says, as `LLM.generate` does


def server_argv(argv: list[str], python: Path, port: int, engine: dict) -> list[str]:
    """launch.md's argv with its program taken from the serving environment (`python` or its `vllm` script)."""
    program = str(python if argv[0] == "python" else python.parent / argv[0])
    return [program, *argv[1:], "--host", "127.0.0.1", "--port", str(port), *engine_args(engine)]


def first_error_line(log: Path) -> str:
    """vLLM's first `...Error: ...` line (its reason, before the tracebacks that follow; warnings, which log
    handled exceptions too, are skipped), else the last line."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    for line in lines:
        match = ERROR_LINE.search(line)
        if match and not NOT_ERRORS.search(line):
            return line[match.start():]
    return lines[-1] if lines else "no output"


def read_counters(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        return parse_counters(response.read().decode())


def parse_counters(text: str, series: dict[str, str] = COUNTER_SERIES,
                   per_position_series: str = PER_POSITION_SERIES) -> dict:
    """The spec-decode counters of a Prometheus exposition, summed over label sets (engines), per position
    for the accepted-per-position counter; `series` maps another server's names (llama.cpp's) onto vLLM's."""
    totals: dict = {PER_POSITION: []}
    for line in text.splitlines():
        sample = SAMPLE.match(line)
        if not sample or line.startswith("#"):
            continue
        name, value = sample["name"], int(float(sample["value"]))
        if name in series:
            totals[series[name]] = totals.get(series[name], 0) + value
        elif name == per_position_series:
            position = int(re.search(r'position="(\d+)"', sample["labels"] or "")[1])
            per_position = totals[PER_POSITION]
            per_position += [0] * (position + 1 - len(per_position))
            per_position[position] += value
    return totals


def counter_delta(after: dict, before: dict) -> dict:
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in COUNTER_SERIES.values()}
    then = before[PER_POSITION]
    delta[PER_POSITION] = [v - (then[i] if i < len(then) else 0) for i, v in enumerate(after[PER_POSITION])]
    return delta


def complete(base: str, model: str, ids: list[int], run: dict, max_tokens: int, seed: int, timeout_s: float) -> list:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": run["temperature"],
            "ignore_eos": True, "return_token_ids": True}
    if run["temperature"] > 0:  # as vllm_runner.py: greedy requests leave the sampling knobs alone
        body.update(top_k=run["top_k"], top_p=run["top_p"], seed=seed)
    request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return list(json.loads(response.read())["choices"][0]["token_ids"])


def run_domain(base: str, prompts: list, run: dict, job: dict, timeout_s: float, request=complete,
               counters=read_counters) -> dict:
    """At most `concurrency` requests in flight; request i seeded job seed + i, as in vllm_runner.py. `request`
    and `counters` speak another server's API (llama.cpp's)."""
    before = counters(base)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=run["concurrency"]) as pool:
        outputs = list(pool.map(lambda i: request(base, job["model"], prompts[i], run, job["max_new_tokens"],
                                                  job["seed"] + i, timeout_s), range(len(prompts))))
    wall_s = time.perf_counter() - t0
    return {"outputs": outputs, "wall_s": wall_s, "tokens": sum(map(len, outputs)),
            "counters": counter_delta(counters(base), before)}


def serve_launch_command(python: Path, argv: list[str], job: dict, log: Path, timeout_s: float,
                         env: dict[str, str]) -> dict:
    """launch.md's server with `job`'s prompts and runs; the in-process runner's result shape, or {"error": ...}."""
    port = free_port()
    full = server_argv(argv, python, port, job)
    base = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    try:
        with running_server(full, port, log, timeout_s, "serve_check.engine_timeout_s", env) as server:
            engine_start_s = time.perf_counter() - started
            try:
                runs = {spec["name"]: {domain: run_domain(base, prompts, spec, job, timeout_s)
                                       for domain, prompts in job["prompts"].items()} for spec in job["runs"]}
            except (urllib.error.URLError, OSError):
                check_not_killed(server.poll(), "launch.md's vLLM server", log)  # before it is stopped on the way out
                raise
    except EngineKilled:
        raise
    except (DraftlineError, urllib.error.URLError, OSError) as error:  # no start, a crash, a refused request
        detail = first_error_line(log) if log.is_file() else str(error)
        return {"error": detail, "log": str(log)}
    return {"error": None, "engine_start_s": engine_start_s, "runs": runs, "log": str(log)}
