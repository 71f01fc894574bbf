"""Stage train_eagle3 end to end on a tiny verifier + corpus, online (the verifier run in training, its outputs
cached): the loss falls, agreement and real decoded acceptance are reported, and the saved head has the weight
names vLLM's EAGLE-3 loader reads."""

from __future__ import annotations

import json

import pytest
import yaml
from safetensors import safe_open

from pipeline.config.schema import load_all, parse_all
from pipeline.drafters.eagle3.model import load_drafter
from tests.support.features import FEATURES_PARAMS
from tests.support.workspace import make_artifacts

STEPS = 3


@pytest.mark.slow
def test_train_eagle3_stage_lowers_loss(tmp_path):
    from train.dispatch import train

    make_artifacts(tmp_path, rows_per_split=(12, 4, 2), new_tokens=12)
    data = {
        "project": {"artifacts_dir": str(tmp_path / "artifacts"), "metrics_dir": str(tmp_path / "metrics"),
                    "plots_dir": str(tmp_path / "plots")},
        "train": {"eagle3": {"ttt_steps": STEPS, "draft_tokens": 3, "draft_vocab_size": 120,
                             "cache_verifier_outputs": True, "features": "online",  # decoded tau, the cache
                             "trainer": {"batch_size": 4, "learning_rate": 0.01, "warmup_steps": 2,
                                         "max_steps": 30, "val_every_n_steps": 15, "checkpoint_every_n_steps": 10}}},
        "features": FEATURES_PARAMS,
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    }
    parse_all(data)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    info = train(load_all(tmp_path / "params.yaml"), "eagle3")
    assert info["steps"] == 30
    assert info["val_loss"] < info["untrained_val_loss"], info
    assert len(info["top1_agreement"]) == STEPS and len(info["decode_acceptance"]) == 3
    assert info["decode_tau"] >= 1.0 and info["aux_layer_ids"] == [1]  # make_artifacts: a 2-layer verifier

    drafter_dir = tmp_path / "artifacts" / "drafters" / "eagle3"
    config = json.loads((drafter_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == 120 and config["eagle_aux_hidden_state_layer_ids"] == [1]
    with safe_open(drafter_dir / "model.safetensors", "pt") as handle:
        names = set(handle.keys())
        assert list(handle.get_slice("lm_head.weight").get_shape()) == [120, config["hidden_size"]]
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight",
            "midlayer.hidden_norm.weight"} <= names
    assert not any("embed_tokens" in name for name in names)
    head = load_drafter(drafter_dir)
    assert head.t2d.sum() == 120
    assert json.loads((tmp_path / "metrics" / "train_eagle3.json").read_text())["steps"] == 30
