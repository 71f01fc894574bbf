"""Memory and speed of training from extracted features (offline) against running the verifier (online).

`python -m train.bench_features [--kind block] [--layers 24] [--width 512] [--rows 96] [--steps 20]`

On a verifier made deliberately large for one machine (random weights: only sizes matter here) and rows of
the demo corpus (`dvc repro build_corpus` first: its tokenizer and rows are reused), every measurement runs
the real stages as their own processes in a scratch workspace:
- extraction with `features.engine` hf and, when .venv-serve exists, vllm: tokens/s;
- `train_<kind>` online, offline, and offline on a corpus 4x larger: peak RSS (the process's own, from
  `wait4`) and training steps/s (fit time only, `metrics/train_<kind>.json: fit_time_s`).
It prints the ratios (offline / online, 4x / 1x, vllm / hf) and writes them to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import yaml
from datasets import DatasetDict

from pipeline.atomic import write_json_atomic
from pipeline.cli import run_bench, stage_parser
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import VerifierConfig
from pipeline.drafters.registry import KIND_SPECS
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from pipeline.serving_venv import serve_python
from pipeline.verifier_record import write_record

REPO = Path(__file__).resolve().parents[1]


class BenchParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()


def build_verifier(directory: Path, tokenizer_dir: Path, layers: int, width: int, seed: int) -> int:
    """A random Qwen3 verifier of `layers` x `width` with the demo tokenizer; returns its decoder's bytes."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    heads = max(1, width // 64)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64, max_position_embeddings=512,
        tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    ))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    write_record(directory, source="bootstrap", name_or_path=str(directory), id_prefix="bench")
    decoder = model.model.layers
    return sum(p.numel() * p.element_size() for p in decoder.parameters())


def write_corpus(source: DatasetDict, directory: Path, rows: int) -> None:
    """The first `rows` training rows (repeated when the corpus has fewer) and a few held-out rows."""
    train = source["train"]
    picked = train.select([i % len(train) for i in range(rows)])
    held_out = source["validation"].select(range(min(8, len(source["validation"]))))
    DatasetDict(train=picked, validation=held_out, test=held_out).save_to_disk(str(directory))


def workspace_params(kind: str, features: str, engine: str, steps: int) -> dict:
    trainer = {"max_steps": steps, "batch_size": 8, "val_every_n_steps": 10 * steps,
               "checkpoint_every_n_steps": 10 * steps}
    train = {name: {"features": "offline" if name == kind else "online", "trainer": dict(trainer)}
             for name in KIND_SPECS}
    train[kind]["features"] = features
    if "decode_prompts" in KIND_SPECS[kind].config.model_fields:
        train[kind]["decode_prompts"] = 0  # decoding needs the whole verifier: not what this measures
    return {"verifier": {"dtype": "float32"}, "features": {"engine": engine, "dtype": "bfloat16"}, "train": train}


def run_measured(command: list[str], cwd: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes of that process) — `wait4` reports the child's own peak, not the bench's."""
    # vLLM's CPU build sizes its KV cache from this (GiB); extraction rows need little, the machine's RAM is shared
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr_lines = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        last = [line for line in stderr_lines.splitlines() if line.strip()][-3:]
        raise DraftlineError(f"`{' '.join(command[2:])}` failed in {cwd}: {' | '.join(last)}")
    return time.perf_counter() - started, usage.ru_maxrss * 1024


class Workspace:
    """A scratch project: its own params.yaml, the bench verifier and a corpus of `rows` rows."""

    def __init__(self, root: Path, verifier: Path, corpus: DatasetDict, rows: int):
        self.root = root
        (root / "artifacts").mkdir(parents=True)
        os.symlink(verifier, root / "artifacts" / "verifier")
        write_corpus(corpus, root / "artifacts" / "corpus", rows)

    def run(self, module: str, params: dict, *args: str) -> tuple[float, int]:
        (self.root / "params.yaml").write_text(yaml.safe_dump(params))
        return run_measured([sys.executable, "-m", module, *args], self.root)

    def metrics(self, name: str) -> dict:
        return json.loads((self.root / "metrics" / f"{name}.json").read_text())


def bench(params: BenchParams, args: argparse.Namespace) -> dict:
    paths = ArtifactPaths.from_params(params)
    if not (paths.corpus.is_dir() and (paths.verifier / "tokenizer.json").is_file()):
        raise DraftlineError(f"no demo corpus/tokenizer under {paths.root}; run `dvc repro build_corpus` first")
    corpus = DatasetDict.load_from_disk(str(paths.corpus))
    kind, steps = args.kind, args.steps
    results: dict = {"kind": kind, "verifier": f"{args.layers} layers x {args.width}", "steps": steps, "rows": args.rows}
    with tempfile.TemporaryDirectory(prefix="draftline-bench-features-") as scratch:
        scratch = Path(scratch)
        decoder_bytes = build_verifier(scratch / "verifier", paths.verifier, args.layers, args.width, params.project.seed)
        results["decoder_bytes"] = decoder_bytes
        one_x = Workspace(scratch / "1x", scratch / "verifier", corpus, args.rows)
        four_x = Workspace(scratch / "4x", scratch / "verifier", corpus, 4 * args.rows)

        engines = ["hf"] + (["vllm"] if serve_python() is not None and not args.no_vllm else [])
        for engine in engines:
            info(f"extracting features with engine {engine}")
            # finished shards are reused whichever engine made them: each engine starts from none
            shutil.rmtree(one_x.root / "artifacts" / "features", ignore_errors=True)
            one_x.run("data_prep.extract_features", workspace_params(kind, "offline", engine, steps))
            results[f"extract_{engine}_tokens_per_s"] = one_x.metrics("features")["tokens_per_s"]
        results["feature_bytes_per_token"] = one_x.metrics("features")["bytes_per_token"]
        four_x.run("data_prep.extract_features", workspace_params(kind, "offline", "hf", steps))

        for name, space, features in (("online", one_x, "online"), ("offline", one_x, "offline"),
                                      ("offline_4x", four_x, "offline")):
            info(f"training {kind} {name}")
            shutil.rmtree(space.root / "artifacts" / "checkpoints", ignore_errors=True)
            _, rss = space.run("train.dispatch", workspace_params(kind, features, "hf", steps), "--drafter", kind)
            metrics = space.metrics(f"train_{kind}")
            results[f"{name}_peak_rss_bytes"] = rss
            results[f"{name}_steps_per_s"] = metrics["steps"] / metrics["fit_time_s"]
    results.update(ratios(results))
    return results


def ratios(results: dict) -> dict:
    out = {
        "offline_over_online_rss": results["offline_peak_rss_bytes"] / results["online_peak_rss_bytes"],
        "online_minus_offline_rss_over_decoder": (results["online_peak_rss_bytes"] - results["offline_peak_rss_bytes"])
        / results["decoder_bytes"],
        "offline_4x_over_1x_rss": results["offline_4x_peak_rss_bytes"] / results["offline_peak_rss_bytes"],
        "offline_over_online_steps_per_s": results["offline_steps_per_s"] / results["online_steps_per_s"],
    }
    if "extract_vllm_tokens_per_s" in results:
        out["extract_vllm_over_hf_tokens_per_s"] = results["extract_vllm_tokens_per_s"] / results["extract_hf_tokens_per_s"]
    return out


def run(params: BenchParams, args: argparse.Namespace) -> dict:
    results = bench(params, args)
    mib = 1 << 20
    print_summary(f"{args.kind} training from features vs the verifier ({results['verifier']}, {args.steps} steps)", {
        "verifier decoder MiB": results["decoder_bytes"] / mib,
        "peak RSS MiB online / offline / offline 4x corpus": " / ".join(
            f"{results[f'{name}_peak_rss_bytes'] / mib:.0f}" for name in ("online", "offline", "offline_4x")),
        "(online - offline) RSS / decoder bytes": results["online_minus_offline_rss_over_decoder"],
        "offline 4x / 1x RSS": results["offline_4x_over_1x_rss"],
        "steps/s online / offline": f"{results['online_steps_per_s']:.2f} / {results['offline_steps_per_s']:.2f}",
        "offline / online steps/s": results["offline_over_online_steps_per_s"],
        "feature bytes per token": results["feature_bytes_per_token"],
        **{f"extraction tokens/s {engine}": results[f"extract_{engine}_tokens_per_s"]
           for engine in ("hf", "vllm") if f"extract_{engine}_tokens_per_s" in results},
        **({"vllm / hf extraction tokens/s": results["extract_vllm_over_hf_tokens_per_s"]}
           if "extract_vllm_over_hf_tokens_per_s" in results else {}),
    })
    if args.out:
        write_json_atomic(Path(args.out), results)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m train.bench_features",
                          "peak RSS and steps/s of training offline vs online; extraction tokens/s hf vs vllm")
    parser.add_argument("--kind", choices=sorted(KIND_SPECS), default="block")
    parser.add_argument("--layers", type=int, default=24, help="bench verifier depth (default 24)")
    parser.add_argument("--width", type=int, default=512, help="bench verifier width (default 512)")
    parser.add_argument("--rows", type=int, default=96, help="training rows; the 4x run uses 4 times as many")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vllm extraction")
    parser.add_argument("--out", default=None, help="also write the results here (JSON)")
    return run_bench(parser, BenchParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
