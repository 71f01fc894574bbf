"""llama.cpp-only reproduction: at T > 0 a perfect drafter loses acceptance in llama.cpp.

The verifier drafts for itself (`-md` = `-m`, `--spec-type draft-simple`), so the draft distribution q is the
target distribution p. Speculative sampling over the full draft distribution (accept a drafted token x with
probability min(1, p(x)/q(x))) then accepts every drafted token, at any temperature; greedy too. With xllamacpp
2026.10.11549 (llama.cpp build 11549, CPU) and `--spec-draft-sampling probabilistic` as launch.md sets it, greedy
requests accept all drafts, but at T=0.8 about half of them are rejected. llama.cpp draws drafts from the
drafter's 10 most likely tokens only (`common/speculative.cpp`, `spec_retune`): on the demo verifier those hold
0.74 of the mass at T=0.8, and a per-token acceptance near 0.74 over 4-token drafts gives the measured ~0.5. So
llama.cpp's sampled τ is not the τ of draftline's (and vLLM's) algorithm, for any drafter: serve_check records it
below draftline's for every kind, and runs this self-test to say so (`sampled_self_test` in serving.json).

Usage, on an export with its GGUF files (`dvc repro export`), in the llama.cpp environment:

    .venv-llamacpp/bin/python -I serve_eval/repro/llamacpp_sampled_acceptance.py artifacts/export/ar

It starts launch.md's `llama-server` line (through serve_eval/llama_server.py) with the verifier GGUF as its
own draft model, on 127.0.0.1 and a free port, and sends 8 prompts of 12 token ids at T=0 and at T=0.8
(top_k 0, top_p 1, min_p 0). Exit code 1 when the sampled acceptance is below 0.9, 0 otherwise.
"""

import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROMPTS = [[(7 * i + 3 * j) % 200 + 10 for j in range(12)] for i in range(8)]
NEW_TOKENS, TEMPERATURES = 48, (0.0, 0.8)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(base: str, ids: list[int], temperature: float, seed: int) -> tuple[int, int]:
    body = {"prompt": ids, "n_predict": NEW_TOKENS, "temperature": temperature, "top_k": 0, "top_p": 1.0,
            "min_p": 0.0, "seed": seed, "ignore_eos": True, "cache_prompt": False}
    call = urllib.request.Request(f"{base}/completion", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=120) as response:
        timings = json.loads(response.read())["timings"]
    return timings["draft_n"], timings["draft_n_accepted"]


def self_drafting(arguments: list[str]) -> list[str]:
    """launch.md's line with the verifier as its own draft model (a plain draft model: draft-simple)."""
    arguments = list(arguments)
    arguments[arguments.index("-md") + 1] = arguments[arguments.index("-m") + 1]
    arguments[arguments.index("--spec-type") + 1] = "draft-simple"
    return arguments


def main(export_dir: str) -> int:
    launch = (Path(export_dir) / "launch.md").read_text(encoding="utf-8")
    arguments = self_drafting(shlex.split(next(line for line in launch.splitlines()
                                               if line.startswith("llama-server ")))[1:])
    port = free_port()
    arguments[arguments.index("--port") + 1] = str(port)
    launcher = Path(__file__).resolve().parents[1] / "llama_server.py"
    server = subprocess.Popen([sys.executable, "-I", str(launcher), *arguments],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, rates = f"http://127.0.0.1:{port}", {}
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        for temperature in TEMPERATURES:
            counts = [request(base, ids, temperature, seed) for seed, ids in enumerate(PROMPTS)]
            drafted, accepted = sum(c[0] for c in counts), sum(c[1] for c in counts)
            rates[temperature] = accepted / max(drafted, 1)
            print(f"T={temperature}: {accepted} of {drafted} self-drafted tokens accepted ({rates[temperature]:.3f}; "
                  "rejection sampling accepts all)")
    finally:
        server.terminate()
        server.wait(timeout=30)
    sampled = rates[max(TEMPERATURES)]
    print("present: sampled speculation rejects the target's own drafts" if sampled < 0.9 else "not present")
    return 1 if sampled < 0.9 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
