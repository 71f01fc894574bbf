"""Verifier-generation throughput: the batched KV-cache path vs a naive one-prompt-at-a-time loop.

`python -m data_prep.bench [--params params.yaml] [--batch 16] [--prompts 32] [--max-new-tokens 48]`
Same prompts, same process, greedy. Uses the demo verifier in `artifacts/verifier` when it exists,
otherwise a freshly initialised model of the default bootstrap size (throughput does not depend on
the weights, only on the shapes).

`--engine vllm` compares the HF batched path with the `corpus.engine: vllm` path instead: the
stage's `vllm serve` (from `.venv-serve`, started before timing) gets every prompt in flight at once.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from data_prep.bootstrap_verifier import build_model
from data_prep.build_corpus import CorpusParams
from data_prep.continuation import generate_batch
from data_prep.engines import Request
from data_prep.engines.openai_client import OpenAIEngine
from data_prep.engines.vllm_server import vllm_server
from data_prep.sources import Prompt, stable_order, stdlib_code_prompts, stdlib_text_prompts
from data_prep.tokenizer import train_bpe_tokenizer
from data_prep.verifier import load_verifier
from pipeline.cli import run_bench, stage_parser
from pipeline.config.sampling_config import SamplingConfig
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from pipeline.verifier_record import model_location, read_record


def bench_model(params: CorpusParams):
    paths = ArtifactPaths.from_params(params)
    if (paths.verifier / "verifier.json").is_file():
        model, tokenizer = load_verifier(paths, params.verifier.dtype, params.verifier.trust_remote_code,
                                         params.verifier.allow_pickle_weights)
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


def vllm_tokens(engine: OpenAIEngine, prompts: list[list[int]], max_new_tokens: int) -> int:
    requests = [Request(tuple(prompt), SamplingConfig(), max_new_tokens, seed=0) for prompt in prompts]
    return sum(len(result.response_ids) for result in engine.generate(requests, lambda n: None))


def run_vllm(params: CorpusParams, args: argparse.Namespace, model, tokenizer, what: str,
             prompts: list[list[int]]) -> None:
    """HF batched vs `vllm serve` on the same prompts, greedy, after a warm-up of each.

    The two alternate `--repeats` times and each keeps its best round: on a shared machine, load
    that comes and goes then hits both sides alike instead of whichever ran during a spike.
    """
    paths = ArtifactPaths.from_params(params)
    hf_runs, vllm_runs = [], []
    with tempfile.TemporaryDirectory() as scratch:
        if (paths.verifier / "verifier.json").is_file():
            location = model_location(paths, read_record(paths))
        else:  # the freshly initialised model must be on disk for the server
            location = str(Path(scratch) / "model")
            model.save_pretrained(location)
            tokenizer.save_pretrained(location)
        config = params.corpus.model_copy(update={"concurrency": len(prompts)})
        with vllm_server(location, config.vllm, dtype=config.vllm.dtype or params.verifier.dtype,
                         log_path=Path(scratch) / "vllm-serve.log") as server:
            engine = OpenAIEngine([server.url], tokenizer, config, name="vllm")
            batched(model, tokenizer, prompts[: args.batch], 4, args.batch)  # warm-ups
            vllm_tokens(engine, prompts[: args.batch], 4)
            for _ in range(args.repeats):
                hf_runs.append(timed(batched, model, tokenizer, prompts, args.max_new_tokens, args.batch))
                vllm_runs.append(timed(vllm_tokens, engine, prompts, args.max_new_tokens))
    hf_rate = max(tokens / seconds for tokens, seconds in hf_runs)
    vllm_rate = max(tokens / seconds for tokens, seconds in vllm_runs)
    print_summary(f"verifier generation throughput: {what}", {
        f"HF batched (batch {args.batch}) tokens/s": round(hf_rate, 1),
        f"vLLM {engine.describe()['version']} ({len(prompts)} in flight) tokens/s": round(vllm_rate, 1),
        "ratio vLLM / HF batched": f"{vllm_rate / hf_rate:.2f}x",
        "tokens HF / vLLM": f"{hf_runs[0][0]} / {vllm_runs[0][0]}",
        "rounds HF tokens/s": ", ".join(f"{t / s:.1f}" for t, s in hf_runs),
        "rounds vLLM tokens/s": ", ".join(f"{t / s:.1f}" for t, s in vllm_runs),
    })
    print(f"HF batched {hf_rate:.1f} tok/s, vLLM {vllm_rate:.1f} tok/s, ratio {vllm_rate / hf_rate:.2f}x")


def run(params: CorpusParams, args: argparse.Namespace) -> None:
    model, tokenizer, what = bench_model(params)
    prompts = bench_prompts(tokenizer, args.prompts, params.corpus.prompt_max_tokens)
    info(f"benchmark model: {what}; {len(prompts)} prompts, {args.max_new_tokens} new tokens, "
         f"batch {args.batch}, {torch.get_num_threads()} threads")
    if args.engine == "vllm":
        run_vllm(params, args, model, tokenizer, what, prompts)
        return
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
    parser.add_argument("--repeats", type=int, default=2, help="--engine vllm: alternating rounds, best kept")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="hf: batched vs naive HF loop; vllm: HF batched vs vllm serve (needs make serve-env)")
    return run_bench(parser, CorpusParams, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
