"""Demo-verifier training throughput: tokens/s and model-FLOPs utilisation, baseline vs configured.

`python -m data_prep.bench_verifier [--params params.yaml] [--steps 20] [--warmup 3]`
Runs the stage's own training step (`bootstrap_verifier.train_step`) on random tokens (throughput
depends on shapes, not on the data) for two configs in the same process:

- baseline: the demo verifier's earlier settings, before its retune for quality and speed (vocab
  4096, batches of 8 x 128 tokens, torch's default of one thread per core); both use fused AdamW
  (the unfused one measured within noise of it);
- configured: `verifier.bootstrap` from params.yaml.

MFU is achieved model FLOP/s over the machine's dense fp32 matmul peak: one core's large-matmul FLOPs
per CPU-second (measured here, so it holds on a shared box too) times the cores. Per CPU-second
figures are printed too: on a loaded machine they estimate the unloaded single-thread rate.
Last, the cost ratio speculation depends on: one decode step (batch 1, KV cache) of the configured
verifier over the same step of a 1-layer model of its width (the AR drafter's shape).
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import torch
from transformers import DynamicCache

from data_prep.bootstrap_verifier import VerifierParams, build_model, make_optimizer, torch_threads, train_step
from pipeline.cli import run_bench, stage_parser
from pipeline.config.verifier_config import BootstrapConfig
from pipeline.progress import info, print_summary

BASELINE_OVERRIDES = {"vocab_size": 4096, "seq_len": 128, "batch_size": 8}


class _Vocab:
    """Just enough of a tokenizer for `build_model`: a vocabulary size and special ids."""

    def __init__(self, size: int):
        self.size, self.eos_token_id, self.pad_token_id = size, 0, 2

    def __len__(self) -> int:
        return self.size


def training_flops_per_token(config: BootstrapConfig) -> float:
    """6 x matmul parameters (forward 2, backward 4) + causal attention scores and values."""
    attention = config.hidden_size * config.head_dim * (2 * config.num_heads + 2 * config.num_kv_heads)
    mlp = 3 * config.hidden_size * config.intermediate_size
    matmul_params = config.num_layers * (attention + mlp) + config.hidden_size * config.vocab_size
    # QK^T and AV: 2 x 2 x seq x head_dim x heads per layer forward, half of it masked (causal), x3 with backward
    attention_flops = 6 * config.num_layers * config.seq_len * config.num_heads * config.head_dim
    return 6 * matmul_params + attention_flops


def core_peak_flops(size: int = 1024, repeats: int = 20) -> float:
    """One core's fp32 matmul FLOPs per CPU-second (CPU time: other processes do not dilute it)."""
    with torch_threads(1):
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        start = time.process_time()
        for _ in range(repeats):
            a @ b
        return repeats * 2 * size**3 / (time.process_time() - start)


def measure(config: BootstrapConfig, threads: int, steps: int, warmup: int, seed: int) -> dict:
    with torch_threads(threads):
        model = build_model(config, _Vocab(config.vocab_size), seed)
        model.train()
        optimizer = make_optimizer(model, config)
        generator = torch.Generator().manual_seed(seed)
        batches = [torch.randint(3, config.vocab_size, (config.batch_size, config.seq_len), generator=generator)
                   for _ in range(warmup + steps)]
        for batch in batches[:warmup]:
            train_step(model, optimizer, batch, config)
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in batches[warmup:]:
            train_step(model, optimizer, batch, config)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = steps * config.batch_size * config.seq_len
    flops = tokens * training_flops_per_token(config)
    return {"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu,
            "flops_per_s": flops / wall, "flops_per_cpu_s": flops / cpu}


@torch.inference_mode()
def decode_seconds(config: BootstrapConfig, threads: int, seed: int, context: int = 128, steps: int = 64) -> float:
    """Mean seconds of one cached single-token forward after a `context`-token prompt."""
    with torch_threads(threads):
        model = build_model(config, _Vocab(config.vocab_size), seed).eval()
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.randint(3, config.vocab_size, (1, context)), cache=cache, use_cache=True)
        token = torch.tensor([[5]])
        start = time.perf_counter()
        for _ in range(steps):
            model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        return (time.perf_counter() - start) / steps


def run(params: VerifierParams, args: argparse.Namespace) -> None:
    configured = params.verifier.bootstrap
    baseline = configured.model_copy(update=BASELINE_OVERRIDES)
    cores = torch.get_num_threads()
    core_peak = core_peak_flops()
    info(f"dense fp32 matmul peak: {core_peak / 1e9:.1f} GFLOP/s per core x {cores} cores")
    rows, results = {}, {}
    for name, config, threads in (("baseline", baseline, cores), ("configured", configured, configured.threads)):
        result = results[name] = measure(config, threads, args.steps, args.warmup, params.project.seed)
        rows[name] = (f"{result['tokens_per_s']:,.0f} tokens/s, MFU {result['flops_per_s'] / (core_peak * cores):.1%}; "
                      f"per CPU-second {result['tokens_per_cpu_s']:,.0f} tokens, "
                      f"{result['flops_per_cpu_s'] / core_peak:.0%} of a core's peak; vocab {config.vocab_size}, "
                      f"{config.batch_size} x {config.seq_len}, {threads} thread(s)")
    rows["speedup (tokens/s)"] = f"{results['configured']['tokens_per_s'] / results['baseline']['tokens_per_s']:.2f}x"
    drafter = configured.model_copy(update={"num_layers": 1})
    verifier_step = decode_seconds(configured, configured.threads, params.project.seed)
    drafter_step = decode_seconds(drafter, configured.threads, params.project.seed)
    rows["decode step: verifier / 1-layer drafter"] = (
        f"{verifier_step * 1e3:.2f} ms / {drafter_step * 1e3:.2f} ms = {verifier_step / drafter_step:.1f}x")
    print_summary("verifier training throughput", rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m data_prep.bench_verifier", __doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per config")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (allocator, caches)")
    return run_bench(parser, VerifierParams, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
