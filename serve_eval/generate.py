"""`draftline generate`: one speculative generation with the accepted draft tokens highlighted."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch
from rich.text import Text

from pipeline.cli import positive_int_arg, run_stage, stage_parser, temperature_arg
from pipeline.config.base import DRAFTER_NAMES
from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.speculative_loop import decode
from pipeline.errors import DraftlineError
from pipeline.integrity import stop_token_ids
from pipeline.paths import ArtifactPaths
from pipeline.progress import console, print_data, print_summary
from serve_eval.evaluate import EvaluateParams
from serve_eval.loading import load_drafters, load_verifier_for_decoding


def render(tokenizer, generation) -> Text:
    """Accepted draft tokens in green, verifier-chosen (correction/bonus) tokens plain."""
    text = Text(tokenizer.decode(generation.prompt_ids), style="dim")
    position = 0
    for step in generation.steps:
        ids = generation.new_ids[position: position + step.committed]
        drafted = min(step.accepted, len(ids))
        text.append(tokenizer.decode(ids[:drafted]), style="bold green")
        text.append(tokenizer.decode(ids[drafted:]), style="")
        position += step.committed
    return text


def run(params: EvaluateParams, args: argparse.Namespace) -> None:
    paths = ArtifactPaths.from_params(params)
    config = params.evaluate.model_copy(update={"drafters": [args.drafter], "backend": "torch"})
    verifier, tokenizer = load_verifier_for_decoding(paths, params.verifier)
    proposer = load_drafters(paths, config, verifier, tokenizer)[args.drafter].proposer
    prompt_ids = tokenizer(args.prompt)["input_ids"]
    if not prompt_ids:
        prompt_ids = [tokenizer.eos_token_id]
    context = verifier.config.max_position_embeddings
    if len(prompt_ids) + args.max_new_tokens > context:
        raise DraftlineError(
            f"prompt ({len(prompt_ids)} tokens) + --max-new-tokens {args.max_new_tokens} exceeds the verifier's "
            f"context of {context} positions; shorten the prompt or lower --max-new-tokens"
        )
    generation = decode(verifier, prompt_ids, args.max_new_tokens, proposer=proposer,
                        sampling=SamplingConfig(temperature=args.temperature, top_k=params.evaluate.top_k,
                                                top_p=params.evaluate.top_p),
                        eos_token_id=stop_token_ids(verifier.generation_config, tokenizer),
                        generator=torch.Generator().manual_seed(args.seed))
    print_data(render(tokenizer, generation), soft_wrap=True)  # the text is the data: stdout; the rest is stderr
    console.print("[bold green]green[/] = accepted draft tokens; plain = verifier's correction/bonus token")
    for index, step in enumerate(generation.steps):
        console.print(f"step {index:3d}: drafted {step.drafted} accepted {step.accepted} committed {step.committed}"
                      f"  draft {step.draft_s * 1e3:.1f} ms  verify {step.verify_s * 1e3:.1f} ms", highlight=False)
    print_summary(f"generate ({args.drafter} drafter)", {
        "new tokens": len(generation.new_ids),
        "verifier forwards": generation.verifier_forwards,
        "tau (tokens per verifier forward, bonus included)": generation.tau,
        "acceptance rate": generation.accepted / max(1, generation.drafted),
        "tokens/s": len(generation.new_ids) / max(generation.wall_s, 1e-9),
        "finish": generation.finish_reason,
    })


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline generate", __doc__.splitlines()[0])
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--drafter", choices=DRAFTER_NAMES, default=DRAFTER_NAMES[0])
    parser.add_argument("--temperature", type=temperature_arg, default=0.0, help="0 = greedy; at most 5")
    parser.add_argument("--max-new-tokens", type=positive_int_arg, default=64)
    parser.add_argument("--seed", type=int, default=0)
    return run_stage(parser, EvaluateParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
