"""One vLLM engine on token-id prompts: outputs, vLLM's spec-decode counters and timings per run.

Runs under the serving environment's interpreter (`make serve-env`: vLLM *without* draftline) and
imports nothing from draftline, so what loads here is what a user's `vllm serve` loads. Usage:

    .venv-serve/bin/python -I serve_eval/vllm_runner.py JOB.json RESULT.json
    .venv-serve/bin/python -I serve_eval/vllm_runner.py --fork-server

`--fork-server` imports vLLM once, then reads one JSON line [JOB, RESULT, LOG] per job from stdin and runs
each job in a process forked from itself (its own engine, output to LOG), answering `started PID` and then
`exited CODE` (a signal's as −N): serve_check's engines then share one import (~9 s on 2 CPU cores) instead
of paying it each, and still start from the same state, one engine never seeing another's.

JOB: {"model", "speculative_config" (null: no speculation), "prompts": {domain: [[ids]]},
"max_new_tokens", "dtype", "seed", "max_model_len", "enforce_eager", "runs": [{"name", "concurrency",
"temperature", "top_k", "top_p"}]}. A run submits each domain's prompts in groups of `concurrency`
(one `generate` call per group, so at most that many requests share the engine's batches); sampled
runs seed every request by its prompt index, so a prompt draws the same way whatever it is batched
with. RESULT: {"error": null or the first line of vLLM's error, "engine_start_s", "runs": {name:
{domain: {"outputs", "wall_s", "tokens", "counters"}}}}. A failure is written to RESULT (exit code 0);
only a broken JOB file exits non-zero.
"""

import ctypes
import json
import os
import signal
import sys
import time
import traceback
from typing import NoReturn

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_counters(llm) -> dict:
    """vLLM's spec-decode counters, summed over label sets (engines)."""
    totals: dict = {}
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            totals[metric.name] = totals.get(metric.name, 0) + int(metric.value)
        elif metric.name == PER_POSITION:
            previous = totals.get(PER_POSITION, [])
            values = [int(v) for v in metric.values]
            width = max(len(previous), len(values))
            totals[PER_POSITION] = [(previous[i] if i < len(previous) else 0) + (values[i] if i < len(values) else 0)
                                    for i in range(width)]
    return totals


def counter_delta(after: dict, before: dict) -> dict:
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in COUNTERS}
    now, then = after.get(PER_POSITION, []), before.get(PER_POSITION, [])
    delta[PER_POSITION] = [v - (then[i] if i < len(then) else 0) for i, v in enumerate(now)]
    return delta


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and "validation error" in lines[0]:
        lines = lines[1:]  # pydantic's header ("1 validation error for VllmConfig") says nothing; the reason follows
    return f"{type(error).__name__}: {lines[0] if lines else ''}".strip()


def sampling_params(run: dict, max_tokens: int, seed: int | None):
    from vllm import SamplingParams

    if run["temperature"] == 0:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return SamplingParams(temperature=run["temperature"], top_k=run["top_k"], top_p=run["top_p"], seed=seed,
                          max_tokens=max_tokens, ignore_eos=True)


def run_domain(llm, prompts: list, run: dict, job: dict) -> dict:
    before = read_counters(llm)
    outputs: list = []
    size = run["concurrency"]
    t0 = time.perf_counter()
    for start in range(0, len(prompts), size):
        group = prompts[start:start + size]
        params = [sampling_params(run, job["max_new_tokens"], job["seed"] + start + i) for i in range(len(group))]
        outputs += llm.generate([{"prompt_token_ids": ids} for ids in group], params, use_tqdm=False)
    wall_s = time.perf_counter() - t0
    token_ids = [list(output.outputs[0].token_ids) for output in outputs]
    return {"outputs": token_ids, "wall_s": wall_s, "tokens": sum(len(ids) for ids in token_ids),
            "counters": counter_delta(read_counters(llm), before)}


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job["dtype"], seed=job["seed"], max_model_len=job["max_model_len"],
              speculative_config=job["speculative_config"], enforce_eager=job["enforce_eager"],
              disable_log_stats=False)  # stats on: the spec-decode counters come from the stat loggers
    engine_start_s = time.perf_counter() - started
    # warm-up: first-call allocations must not land in the timings (counters are read as deltas)
    first = next(iter(job["prompts"].values()))[0]
    llm.generate([{"prompt_token_ids": first}], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    runs = {spec["name"]: {domain: run_domain(llm, prompts, spec, job) for domain, prompts in job["prompts"].items()}
            for spec in job["runs"]}
    return {"error": None, "engine_start_s": engine_start_s, "runs": runs}


def main(argv: list) -> int:
    if len(argv) != 3:
        print("usage: vllm_runner.py JOB.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as handle:
        job = json.load(handle)
    try:
        result = run(job)
    except Exception as error:  # any vLLM failure is a result to record, not a crash of the stage
        result = {"error": first_line(error), "engine_start_s": None, "domains": {}}
    tmp = argv[2] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(tmp, argv[2])
    return 0


PR_SET_PDEATHSIG = 1


def run_forked(job_path: str, result_path: str, log_path: str) -> NoReturn:
    """A forked job: output to its log, dies with the fork server, never returns to the server's loop."""
    code = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        code = main([sys.argv[0], job_path, result_path])
    except BaseException:  # a broken JOB file: its traceback goes to the log, as a lone runner's would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def fork_server() -> int:
    try:
        from vllm import LLM, SamplingParams  # noqa: F401  once for every job; a failure reaches each job's result
    except Exception:
        pass
    for line in sys.stdin:
        job_path, result_path, log_path = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_forked(job_path, result_path, log_path)
        print(f"started {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exited {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


if __name__ == "__main__":  # vLLM may spawn worker processes that re-import this file
    sys.exit(fork_server() if sys.argv[1:] == ["--fork-server"] else main(sys.argv))
