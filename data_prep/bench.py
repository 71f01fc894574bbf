"""Verifier-generation throughput: the batched KV-cache path vs a naive one-prompt-at-a-time loop.

`python -m data_prep.bench [--params params.yaml] [--batch 16] [--prompts 32] [--max-new-tokens 48]`
Same prompts, same process, greedy. Uses the demo verifier in `artifacts/verifier` when it exists,
otherwise a freshly initialised model of the default bootstrap size (throughput does not depend on
the weights, only on the shapes).
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import torch

from data_prep.bootstrap_verifier import build_model
from data_prep.generate import generate_batch
from data_prep.sources import Prompt, stable_order, stdlib_code_prompts, stdlib_text_prompts
from data_prep.tokenizer import train_bpe_tokenizer
from data_prep.verifier import load_verifier
from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary


def bench_model(params: Params):
    paths = ArtifactPaths.from_params(params)
    if (paths.verifier / "verifier.json").is_file():
        model, tokenizer = load_verifier(paths, params.verifier.dtype, params.verifier.trust_remote_code)
        return model, tokenizer, f"demo verifier ({paths.verifier})"
    texts = [prompt for _, prompt in zip(range(2000), stdlib_code_prompts())]
    tokenizer = train_bpe_tokenizer(texts, params.verifier.bootstrap.vocab_size)
    model = build_model(params.verifier.bootstrap, tokenizer, params.project.seed).eval()
    return model, tokenizer, "freshly initialised model of the default bootstrap size"


def bench_prompts(tokenizer, count: int, max_tokens: int) -> list[list[int]]:
    code = [Prompt(t, "code", "stdlib_code") for _, t in zip(range(4000), stdlib_code_prompts())]
    text = [Prompt(t, "text", "stdlib_text") for _, t in zip(range(4000), stdlib_text_prompts())]
    chosen = stable_order(code, "bench")[: count // 2] + stable_order(text, "bench")[: count - count // 2]
    return [tokenizer(p.prompt, add_special_tokens=False)["input_ids"][-max_tokens:] for p in chosen]


@torch.inference_mode()
def naive_loop(model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> int:
    """HF `generate`, one prompt at a time (the baseline a first script would write)."""
    tokens = 0
    for prompt in prompts:
        output = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        tokens += output.shape[1] - len(prompt)
    return tokens


def batched(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch: int) -> int:
    """The corpus path: prompts grouped by length (as build_corpus orders them), then batched."""
    prompts = sorted(prompts, key=len)
    tokens = 0
    for start in range(0, len(prompts), batch):
        continuations = generate_batch(model, prompts[start : start + batch], max_new_tokens=max_new_tokens,
                                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        tokens += sum(len(c.response_ids) for c in continuations)
    return tokens


@torch.inference_mode()
def decode_forward_ms(model, context: int = 64, repeats: int = 40) -> float:
    """Median latency of one batch-1 decode forward (one new token) over a `context`-token KV cache."""
    ids = torch.randint(0, model.config.vocab_size, (1, context))
    cache = model(input_ids=ids, use_cache=True).cache
    token = ids[:, -1:]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(input_ids=token, cache=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        cache.crop(-1)  # transformers 5: a negative value removes that many tokens
    return sorted(times)[len(times) // 2] * 1000


def same_width(model, layers: int):
    settings = {**model.config.to_dict(), "num_hidden_layers": layers}
    settings.pop("layer_types", None)  # per-layer list sized for the verifier's depth
    return type(model)(type(model.config)(**settings)).eval()


def timed(function, *args) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = function(*args)
    return tokens, time.perf_counter() - start


def run(params: Params, args: argparse.Namespace) -> None:
    model, tokenizer, what = bench_model(params)
    prompts = bench_prompts(tokenizer, args.prompts, params.corpus.prompt_max_tokens)
    info(f"benchmark model: {what}; {len(prompts)} prompts, {args.max_new_tokens} new tokens, "
         f"batch {args.batch}, {torch.get_num_threads()} threads")
    batched(model, tokenizer, prompts[: args.batch], 4, args.batch)  # warm-up (allocator, kernels)
    naive_tokens, naive_seconds = timed(naive_loop, model, tokenizer, prompts, args.max_new_tokens)
    batched_tokens, batched_seconds = timed(batched, model, tokenizer, prompts, args.max_new_tokens, args.batch)
    naive_rate, batched_rate = naive_tokens / naive_seconds, batched_tokens / batched_seconds
    print_summary("verifier generation throughput", {
        "naive (one prompt at a time) tokens/s": round(naive_rate, 1),
        f"batched (batch {args.batch}) tokens/s": round(batched_rate, 1),
        "speedup": f"{batched_rate / naive_rate:.2f}x",
        "tokens naive / batched": f"{naive_tokens} / {batched_tokens}",
    })
    verifier_ms = decode_forward_ms(model)
    layers = model.config.num_hidden_layers
    print_summary("batch-1 decode forward latency (64-token context, median)", {
        f"verifier ({layers} layers) ms": round(verifier_ms, 3),
        **{f"{n}-layer model of the same width ms": round(decode_forward_ms(same_width(model, n)), 3) for n in (1, 2)},
    })
    print(f"batched {batched_rate:.1f} tok/s, naive {naive_rate:.1f} tok/s, ratio {batched_rate / naive_rate:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m data_prep.bench", __doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
