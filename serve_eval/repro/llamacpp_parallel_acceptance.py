"""llama.cpp-only reproduction: a drafter accepts less when requests draft side by side (outputs stay correct).

With xllamacpp 2026.10.11549 (llama.cpp build 11549, CPU), the same greedy requests served one at a time and
then all at once (`--parallel`) give identical outputs, but a request's drafted and accepted token counts
(`timings.draft_n`, `draft_n_accepted`) differ once it shares the server's batches: seen for EAGLE-3 on most
runs and for DSpark on some, never for a request served alone. serve_check therefore records parallel τ
below single-request τ for those drafters (`serve_check.max_batch_tau_gap`).

Usage, on an export with its GGUF files (`dvc repro export`), in the llama.cpp environment:

    .venv-llamacpp/bin/python -I serve_eval/repro/llamacpp_parallel_acceptance.py artifacts/export/eagle3

It starts launch.md's `llama-server` line (through serve_eval/llama_server.py) on 127.0.0.1 and a free
port with `--parallel 4`, sends 4 greedy prompts of 12 token ids sequentially, then concurrently, 3 times.
Exit code 1 when some request's draft counts differ between the two ways, 0 otherwise.
"""

import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPTS = [[(7 * i + 3 * j) % 200 + 10 for j in range(12)] for i in range(4)]
NEW_TOKENS, ROUNDS = 32, 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(base: str, ids: list[int]) -> tuple[list[int], int, int]:
    body = {"prompt": ids, "n_predict": NEW_TOKENS, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True}
    call = urllib.request.Request(f"{base}/completion", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=120) as response:
        result = json.loads(response.read())
    return result["tokens"], result["timings"]["draft_n"], result["timings"]["draft_n_accepted"]


def main(export_dir: str) -> int:
    launch = (Path(export_dir) / "launch.md").read_text(encoding="utf-8")
    arguments = shlex.split(next(line for line in launch.splitlines() if line.startswith("llama-server ")))[1:]
    port = free_port()
    arguments[arguments.index("--port") + 1] = str(port)
    launcher = Path(__file__).resolve().parents[1] / "llama_server.py"
    server = subprocess.Popen([sys.executable, "-I", str(launcher), *arguments, "--parallel", "4"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, differs = f"http://127.0.0.1:{port}", False
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        for round_index in range(ROUNDS):
            alone = [request(base, ids) for ids in PROMPTS]
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                together = list(pool.map(lambda ids: request(base, ids), PROMPTS))
            same_outputs = all(a[0] == b[0] for a, b in zip(alone, together))
            counts = [(a[1:], b[1:]) for a, b in zip(alone, together)]
            differs |= any(a != b for a, b in counts)
            print(f"round {round_index}: outputs identical {same_outputs}; (drafted, accepted) alone -> together: "
                  + ", ".join(f"{a} -> {b}" for a, b in counts))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print("defect present: draft counts change when requests share batches" if differs else "no difference")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
