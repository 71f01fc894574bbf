"""Offline training (`train.<kind>.features: offline`): every kind trained from stored fp32 features equals the
one trained online, with the verifier's decoder never loaded, and a feature set that disagrees with what
training needs stops it with one line before any step."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from pipeline.config.schema import load_all, parse_all
from pipeline.errors import DraftlineError
from pipeline.features.store import FeatureStore
from pipeline.training.feature_batches import SplitFeatures, feature_key
from pipeline.verifier_record import write_record
from tests.support.features import FEATURES_PARAMS, overwrite_tail, write_features
from tests.support.workspace import make_artifacts

STEPS = 8
KINDS = {
    "ar": {"num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "loss": {"fkl": 1.0, "ce": 0.1}},
    # fkl and the DSpark heads read the verifier's logits as well as its argmax
    "block": {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 6, "loss": {"ce": 1.0, "fkl": 0.5},
              "decode_prompts": 2},
    "dspark": {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 6, "markov_rank": 8, "confidence_head": True,
               "loss": {"ce": 1.0, "fkl": 0.5}, "decode_prompts": 2},
    "eagle3": {"ttt_steps": 2, "draft_tokens": 2, "draft_vocab_size": 120, "loss": {"ce": 0.5, "fkl": 1.0},
               "decode_prompts": 2},
}


def write_params(root, kind: str, features: str, **extra) -> object:
    data = {
        "project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(root / "metrics"),
                    "plots_dir": str(root / "plots")},
        "features": {**FEATURES_PARAMS, **extra},
        "train": {kind: {**KINDS[kind], "features": features,
                         # AdamW for every kind: Muon (block's default) orthogonalizes in bfloat16, where the
                         # features' 1e-6 float32 differences flip roundings; this compares the features, not it
                         "trainer": {"batch_size": 4, "learning_rate": 0.01, "warmup_steps": 2, "max_steps": STEPS,
                                     "val_every_n_steps": 4, "checkpoint_every_n_steps": 100,
                                     "optimizer": "adamw"}}},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
    }
    parse_all(data)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_all(path)


def train_weights(root, kind: str, features: str) -> tuple[dict, dict[str, torch.Tensor]]:
    from train.dispatch import train

    info = train(write_params(root, kind, features), kind)
    shutil.rmtree(root / "artifacts" / "checkpoints" / kind)  # the other mode must start fresh, not resume
    return info, load_file(root / "artifacts" / "drafters" / kind / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_offline_training_equals_online(tmp_path, kind):
    make_artifacts(tmp_path)
    online_info, online = train_weights(tmp_path, kind, "online")
    offline_info, offline = train_weights(tmp_path, kind, "offline")
    assert online.keys() == offline.keys()
    worst = max((online[name].double() - offline[name].double()).abs().max().item() for name in online)
    assert worst < 1e-4, f"{kind}: offline weights differ from online by up to {worst:.2e}"
    assert offline_info["val_loss"] == pytest.approx(online_info["val_loss"], rel=1e-4)
    assert offline_info["top1_agreement"] == pytest.approx(online_info["top1_agreement"], abs=1e-6)
    assert (online_info["features"], offline_info["features"]) == ("online", "offline")
    if "decode_tau" in online_info:  # greedy decoding needs the whole verifier: offline, `evaluate` measures it
        assert online_info["decode_tau"] >= 1.0 and offline_info["decode_tau"] is None
        assert "stage evaluate" in offline_info["decode_tau_note"] and "decode_tau_note" not in online_info


def rebind_features(artifacts) -> None:
    """Bind the features extracted from the full verifier to the head-only copy now recorded in its place."""
    index = json.loads((artifacts / "features" / "index.json").read_text())
    index["verifier_hash"] = json.loads((artifacts / "verifier" / "verifier.json").read_text())["hash"]
    (artifacts / "features" / "index.json").write_text(json.dumps(index))


def strip_decoder(verifier_dir) -> set[str]:
    """Leave only the embeddings, final norm and LM head in the verifier's weights (and re-record it, as
    bootstrapping a head-only copy would); returns the names kept."""
    weights = load_file(verifier_dir / "model.safetensors")
    kept = {name: tensor for name, tensor in weights.items() if ".layers." not in name}
    assert set(kept) == {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    save_file(kept, verifier_dir / "model.safetensors", metadata={"format": "pt"})
    write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix="tiny-test")
    return set(kept)


@pytest.mark.slow
def test_offline_training_never_loads_the_decoder(tmp_path, monkeypatch):
    from train.dispatch import train

    artifacts = make_artifacts(tmp_path)
    strip_decoder(artifacts / "verifier")
    rebind_features(artifacts)
    monkeypatch.setattr("train.distill.load_verifier", lambda *_, **__: pytest.fail("the full verifier was loaded"))
    info = train(write_params(tmp_path, "block", "offline"), "block")
    assert info["steps"] == STEPS and info["val_loss"] < info["untrained_val_loss"]
    assert info["features"] == "offline" and info["decode_tau"] is None


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return make_artifacts(tmp_path_factory.mktemp("offline")).parent


def edit_index(root, change) -> None:
    path = root / "artifacts" / "features" / "index.json"
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


def four_train_rows_fewer(index: dict) -> None:
    split = index["splits"]["train"]
    split["rows"] -= 4
    split["shards"][-1]["end"] -= 4


@pytest.mark.parametrize(("what", "edit", "extra", "message"), [
    ("layers", lambda index: index.update(layers=[index["num_layers"]]), {}, "hold layers [2], train.eagle3 reads [1, 2]"),
    ("width", lambda index: index.update(hidden_size=64), {}, "are 2 layers x 64 wide, the verifier 2 x 32"),
    ("rows", four_train_rows_fewer, {}, "hold 8 rows of split 'train', the corpus 12"),
    ("dtype", lambda index: None, {"dtype": "bfloat16"}, "are float32, params say features.dtype bfloat16"),
    ("verifier", lambda index: index.update(verifier_hash="0" * 64), {}, "were extracted from another verifier"),
])
def test_disagreeing_features_stop_training_with_one_line(workspace, tmp_path, capsys, what, edit, extra, message):
    from train.dispatch import main

    shutil.copytree(workspace / "artifacts", tmp_path / "artifacts")
    edit_index(tmp_path, edit)
    write_params(tmp_path, "eagle3", "offline", **extra)
    assert main(["--params", str(tmp_path / "params.yaml"), "--drafter", "eagle3"]) == 1
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert err.startswith("draftline: error: verifier features at ") and message in err, what
    assert "Traceback" not in err and not (tmp_path / "artifacts" / "drafters" / "eagle3").exists()


def test_shards_changed_after_extraction_stop_training_with_one_line(workspace, tmp_path, capsys):
    """Every shard's bytes overwritten after extraction (their sha256 now disagree): training refuses before
    its first step, instead of saving a drafter trained on NaNs."""
    from train.dispatch import main

    shutil.copytree(workspace / "artifacts", tmp_path / "artifacts")
    for shard in (tmp_path / "artifacts" / "features").glob("*.safetensors"):
        overwrite_tail(shard)
    write_params(tmp_path, "eagle3", "offline")
    assert main(["--params", str(tmp_path / "params.yaml"), "--drafter", "eagle3"]) == 1
    err = capsys.readouterr().err
    last = " ".join(err.strip().splitlines()[-1].split()) if err.strip() else ""
    assert last.startswith("draftline: error: feature shard ") and "Traceback" not in err
    assert "train-00000.safetensors does not match the sha256 index.json records for it" in last
    assert "rerun the extract_features stage" in last
    assert not (tmp_path / "artifacts" / "drafters" / "eagle3").exists()


@pytest.mark.slow
def test_training_from_float8_features_runs(workspace, tmp_path):
    """fp8 features train a drafter as float32 ones do; extracted again in another dtype, the features are another
    feature set: training starts anew instead of resuming the checkpoints of the old one."""
    from train.dispatch import train

    shutil.copytree(workspace / "artifacts", tmp_path / "artifacts")
    drafter = tmp_path / "artifacts" / "drafters" / "eagle3" / "model.safetensors"
    float32_info = train(write_params(tmp_path, "eagle3", "offline"), "eagle3")
    float32 = load_file(drafter)
    assert write_features(tmp_path / "artifacts", dtype="float8_e4m3").dtype == "float8_e4m3"
    info = train(write_params(tmp_path, "eagle3", "offline", dtype="float8_e4m3"), "eagle3")
    float8 = load_file(drafter)
    assert info["steps"] == STEPS and math.isfinite(info["val_loss"]) and info["val_loss"] < info["untrained_val_loss"]
    assert any(not torch.equal(float32[name], float8[name]) for name in float32)  # trained, not resumed
    assert info["val_loss"] == pytest.approx(float32_info["val_loss"], rel=0.01)  # 4e-5 apart when written


def test_a_batch_whose_stored_tokens_differ_is_refused(workspace):
    store = FeatureStore(workspace / "artifacts" / "features")
    split = SplitFeatures(store, "validation", frozenset({2}), store.rows("validation"))
    (row,) = store.read_rows("validation", [1])
    batch = split.batch([1], [row.input_ids.tolist()], width=40)
    assert batch[feature_key(2)].shape == (1, 40, 32) and not batch[feature_key(2)][0, len(row.input_ids):].any()
    with pytest.raises(DraftlineError, match="row 1 of split 'validation' holds other tokens than the corpus row"):
        split.batch([1], [[*row.input_ids.tolist()[:-1], 7]], width=40)
