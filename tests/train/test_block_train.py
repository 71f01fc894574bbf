"""Stage train_block end to end on a tiny verifier + corpus: the loss falls, agreement is reported for the
trained and an untrained drafter, and the saved dir is the DFlash layout the serving code loads."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors import safe_open

from pipeline.config.schema import load_all, parse_all
from pipeline.drafters.block.anchors import sample_anchors
from pipeline.drafters.block.lightning import anchor_generator
from pipeline.drafters.block.model import DFlashDraftModel
from tests.support.features import FEATURES_PARAMS
from tests.support.workspace import make_artifacts

BLOCK = 4


def write_block_params(root, **trainer) -> object:
    data = {
        "project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(root / "metrics"),
                    "plots_dir": str(root / "plots")},
        "train": {"block": {"block_size": BLOCK, "num_layers": 1, "anchors_per_sequence": 6,
                            "trainer": {"batch_size": 4, "learning_rate": 0.01, "warmup_steps": 2,
                                        "val_every_n_steps": 1000, **trainer}}},
        "features": FEATURES_PARAMS,
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
    }
    parse_all(data)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_all(path)


def test_anchors_are_response_positions_and_resampled():
    prompt_lens, lengths = torch.tensor([3, 5]), torch.tensor([12, 7])
    first, first_valid = sample_anchors(prompt_lens, lengths, 4, anchor_generator(0, 0))
    again, _ = sample_anchors(prompt_lens, lengths, 4, anchor_generator(0, 0))
    other, _ = sample_anchors(prompt_lens, lengths, 4, anchor_generator(0, 1))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first_valid[0].all() and first_valid[1].tolist() == [True, False, False, False]  # only anchor 5 fits
    assert ((first[0] >= 3) & (first[0] <= 10)).all() and first[1, 0] == 5
    assert len(set(first[0].tolist())) == 4


def test_all_anchors_cover_every_response_position_with_a_label():
    prompt_lens, lengths = torch.tensor([3, 5, 4]), torch.tensor([12, 7, 5])
    anchors, valid = sample_anchors(prompt_lens, lengths, "all", anchor_generator(0, 0))
    assert anchors.shape == (3, 8)
    assert anchors[0][valid[0]].tolist() == list(range(3, 11))  # up to length - 2: one label after it
    assert anchors[1][valid[1]].tolist() == [5]
    assert not valid[2].any()  # a one-token response has nothing to predict after its anchor


@pytest.mark.slow
def test_train_block_stage_lowers_loss(tmp_path):
    from train.dispatch import train

    make_artifacts(tmp_path, rows_per_split=(12, 4, 2), new_tokens=12)
    params = write_block_params(tmp_path, max_steps=30, checkpoint_every_n_steps=10, val_every_n_steps=15,
                                muon_precision="float32")
    info = train(params, "block")
    assert info["steps"] == 30
    # trained offline (the default): greedy decoding needs the whole verifier, so stage evaluate measures it
    assert info["features"] == "offline" and "stage evaluate" in info["decode_tau_note"]
    assert info["decode_tau"] is None and info["decode_acceptance"] is None
    curve = (tmp_path / "plots" / "train_block_tau.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in curve[1:]] == ["15", "30"]  # one point per validation
    assert all(line.endswith(",,") for line in curve[1:])  # the proxy only
    assert (tmp_path / "plots" / "train_block_tau.png").stat().st_size > 0
    assert info["val_loss"] < info["untrained_val_loss"], info
    assert len(info["top1_agreement"]) == BLOCK - 1 and len(info["untrained_top1_agreement"]) == BLOCK - 1
    assert info["simulated_acceptance_length"] >= 0
    assert info["lineage"]["verifier_id"].startswith("tiny-test-")

    drafter_dir = tmp_path / "artifacts" / "drafters" / "block"
    saved = json.loads((drafter_dir / "training.json").read_text())
    assert saved["simulated_acceptance_length"] == info["simulated_acceptance_length"]
    config = json.loads((drafter_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == BLOCK
    assert config["num_target_layers"] == 2  # make_artifacts builds a 2-layer verifier
    assert config["dflash_config"]["mask_token_id"] is not None
    with safe_open(drafter_dir / "model.safetensors", "pt") as handle:
        assert not any("embed" in name or "lm_head" in name for name in handle.keys())
    assert (drafter_dir / "tokenizer.json").is_file()
    DFlashDraftModel.from_pretrained(drafter_dir)
    metrics = json.loads((tmp_path / "metrics" / "train_block.json").read_text())
    assert metrics["steps"] == 30
    assert metrics["muon_precision"] == saved["muon_precision"] == "float32"  # the Newton-Schulz dtype it ran in


def test_greedy_share_answers_a_stable_fraction_of_prompts_greedily():
    from data_prep.build_corpus import WorkItem, item_sampling
    from pipeline.config.corpus_config import CorpusConfig

    items = [WorkItem(id=f"code-{i:04d}", domain="code", source="s", split="train", prompt="p", prompt_ids=(1,), seed=i)
             for i in range(400)]
    sampled = {"temperature": 0.8, "top_k": 50}

    def greedy(share: float) -> set[str]:
        config = CorpusConfig(sampling=sampled, greedy_share=share)
        return {item.id for item in items if item_sampling(config, item).temperature == 0.0}

    assert greedy(0.0) == set() and len(greedy(1.0)) == 400
    half = greedy(0.5)
    assert 160 < len(half) < 240 and half == greedy(0.5)  # chosen by id: the same prompts every run
    assert half <= greedy(0.7)  # raising the share only adds prompts
    config = CorpusConfig(sampling=sampled, greedy_share=0.5)
    assert all(item_sampling(config, item).temperature == 0.8 for item in items if item.id not in half)
