"""The corpus's train split in speculators 0.9.0's offline training format, with draftline's verifier states.

`python -m serve_eval.peer_dflash.write_data OUT_DIR`

OUT_DIR: a `datasets` dataset (`input_ids`, `loss_mask` 1 on response tokens, `seq_len`; torch format) and
`hidden_states/hs_<row>.safetensors` ({"token_ids": [L], "hidden_states": [L, layers, hidden]}). The layers
are what vLLM's `extract_hidden_states` hands the peer, and what draftline's own features hold: the block
drafter's layers (HF `hidden_states` numbers = vLLM aux ids) and then the last layer before the final norm,
appended as the peer's vLLM launcher (scripts/launch_vllm.py in speculators) does. States come from the same
HF engine as `extract_features`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

from data_prep.corpus import load_corpus
from data_prep.feature_engines.hf_engine import HFFeatureEngine
from data_prep.verifier import load_verifier
from pipeline.cli import run_stage, stage_parser
from pipeline.drafters.block.config import feature_layers
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, progress
from pipeline.training.params import TrainParams


def run(params: TrainParams, args: argparse.Namespace) -> None:
    from datasets import Dataset
    from safetensors.torch import save_file

    paths = ArtifactPaths.from_params(params)
    verifier, _ = load_verifier(paths, "float32", params.verifier.trust_remote_code, params.verifier.allow_pickle_weights)
    engine = HFFeatureEngine(verifier, batch_size=1)
    layers = sorted(feature_layers(params.train.block, engine.depth)) + [engine.depth]
    (args.out / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    train = load_corpus(paths)["train"]
    for index, row in enumerate(progress(train, desc="verifier states", total=len(train))):
        prompt, response = list(row["prompt_ids"]), list(row["response_ids"])
        states = engine.extract([prompt + response], layers)[0]
        save_file({"token_ids": torch.tensor(prompt + response, dtype=torch.long),
                   "hidden_states": torch.stack([states[layer] for layer in layers], dim=1).contiguous()},
                  str(args.out / "hidden_states" / f"hs_{index}.safetensors"))
        rows["input_ids"].append(prompt + response)
        rows["loss_mask"].append([0] * len(prompt) + [1] * len(response))
        rows["seq_len"].append(len(prompt) + len(response))
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(args.out))
    info(f"{len(dataset)} rows, {sum(rows['seq_len'])} tokens; layers {layers}: "
         f"speculators train --target-layer-ids {' '.join(map(str, layers[:-1]))}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m serve_eval.peer_dflash.write_data", "the corpus in speculators' offline format")
    parser.add_argument("out", type=Path, help="output directory (speculators train --data-path)")
    return run_stage(parser, TrainParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
