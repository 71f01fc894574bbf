"""`llama-server` for the flags launch.md uses, on llama.cpp's server embedded in the xllamacpp wheel.

    .venv-llamacpp/bin/python -I serve_eval/llama_server.py -m VERIFIER.gguf -md DRAFT.gguf --spec-type draft-dflash \\
        --spec-draft-n-max 3 --spec-draft-sampling probabilistic --host 127.0.0.1 --port 8080 [--parallel N] ...

PyPI has no prebuilt `llama-server` binary (building one takes about an hour on 2 cores) and the xllamacpp
wheel ships no command line, only llama.cpp's server as an in-process `Server(CommonParams)` that listens
on HTTP when given a port. This maps the same flags onto the same `common_params` fields llama.cpp's own
argument parser sets (`common/arg.cpp`) and serves until SIGTERM; an unknown flag exits with usage, as
llama-server does. Runs inside `.venv-llamacpp` (`-I`: no draftline on the path).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import xllamacpp

SAMPLING = ("greedy", "probabilistic")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llama-server", description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-md", "--spec-draft-model", "--model-draft")
    parser.add_argument("--spec-type", help="comma-separated, e.g. draft-simple, draft-eagle3, draft-dflash, draft-dspark")
    parser.add_argument("--spec-draft-n-max", type=int)
    parser.add_argument("--spec-draft-n-min", type=int)
    parser.add_argument("--spec-draft-sampling", choices=SAMPLING)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-np", "--parallel", type=int)
    parser.add_argument("-c", "--ctx-size", type=int)
    parser.add_argument("-t", "--threads", type=int)
    parser.add_argument("--metrics", action="store_true")
    return parser.parse_args(argv)


def spec_types(names: str) -> list:
    """`draft-dflash` -> COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH (llama.cpp's names, as `--spec-type` takes them)."""
    kinds = xllamacpp.common_speculative_type.__members__
    chosen = []
    for name in names.split(","):
        member = "COMMON_SPECULATIVE_TYPE_" + name.strip().upper().replace("-", "_")
        if member not in kinds:
            known = sorted(m.removeprefix("COMMON_SPECULATIVE_TYPE_").lower().replace("_", "-") for m in kinds
                           if m != "COMMON_SPECULATIVE_TYPE_COUNT")
            raise SystemExit(f"llama-server: --spec-type {name!r} is not one of {', '.join(known)}")
        chosen.append(kinds[member])
    return chosen


def params(args: argparse.Namespace):
    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.hostnames, p.port, p.endpoint_metrics = [args.host], args.port, args.metrics
    if args.parallel is not None:
        p.n_parallel = args.parallel
    if args.ctx_size is not None:
        p.n_ctx = args.ctx_size
    if args.threads is not None:
        for cpu in (p.cpuparams, p.cpuparams_batch, p.speculative.draft.cpuparams,
                    p.speculative.draft.cpuparams_batch):
            cpu.n_threads = args.threads
    draft = p.speculative.draft
    if args.spec_draft_model:
        draft.mparams.path = args.spec_draft_model
    if args.spec_type:
        p.speculative.types = spec_types(args.spec_type)
    if args.spec_draft_n_max is not None:
        draft.n_max = args.spec_draft_n_max
    if args.spec_draft_n_min is not None:
        draft.n_min = args.spec_draft_n_min
    if args.spec_draft_sampling:
        draft.probabilistic = args.spec_draft_sampling == "probabilistic"
    return p


def main(argv: list[str]) -> int:
    server_params = params(parse(argv))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    server = xllamacpp.Server(server_params)
    print(f"llama-server: listening on {server.listening_address}", flush=True)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
