"""Serving layouts: validators reject what loaders would choke on (plain transformers AutoConfig included);
launch snippets carry real numbers; learned masks are refused; manifest file table hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from export.launch_files import copy_checkpoint, vllm_job
from export.manifest import file_table, tokenizer_hash
from pipeline.drafters.ar import serving as ar_serving
from pipeline.drafters.ar.serving import serving_layout
from pipeline.drafters.block import serving as block_serving
from pipeline.drafters.block.serving import check_layout, write_served_config
from pipeline.drafters.eagle3 import serving as eagle3_serving
from pipeline.drafters.served_checks import check_plain_autoconfig
from pipeline.errors import DraftlineError
from pipeline.lineage import hash_file
from tests.support.tiny_models import tiny_qwen3, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def ar_dir(tmp_path, tokenizer) -> Path:
    directory = tmp_path / "ar"
    tiny_qwen3(len(tokenizer), num_layers=1).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _save_block_drafter(directory: Path, tokenizer, **config) -> None:
    from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel

    defaults = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    intermediate_size=64, vocab_size=len(tokenizer), block_size=4, num_target_layers=4,
                    dflash_config={"mask_token_id": tokenizer.mask_token_id, "target_layer_ids": [0, 2]})
    DFlashDraftModel(DFlashConfig(**{**defaults, **config})).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@pytest.fixture
def block_dir(tmp_path, tokenizer) -> Path:
    """A block drafter in its served layout (what the export stage writes)."""
    directory = tmp_path / "block"
    _save_block_drafter(directory, tokenizer)
    write_served_config(directory)
    return directory


def _edit_config(directory: Path, edit) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def _drop_weight(directory: Path, name: str) -> None:
    weights = load_file(str(directory / "model.safetensors"))
    del weights[name]
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


def test_valid_layouts_pass(ar_dir, block_dir):
    assert serving_layout(ar_dir)["model_type"] == "qwen3"
    config = check_layout(block_dir)  # includes loading config.json with plain AutoConfig without draftline
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 4
    assert config["model_type"] == "qwen3" and config["layer_types"] == ["full_attention"]
    assert config["use_sliding_window"] is False and "mask_mode" not in config
    assert config["dflash_config"]["target_layer_ids"] == [0, 2]


def test_draftline_model_type_is_caught(block_dir):
    """`model_type: dflash` exists only inside draftline: the validator and plain AutoConfig both reject it."""
    _edit_config(block_dir, lambda c: c.update(model_type="dflash"))
    with pytest.raises(DraftlineError, match="model_type 'qwen3'") as caught:
        check_layout(block_dir)
    assert "\n" not in str(caught.value)
    with pytest.raises(DraftlineError, match="does not load with plain transformers AutoConfig.*dflash") as caught:
        check_plain_autoconfig(block_dir, "qwen3")
    assert "\n" not in str(caught.value)


def test_served_block_drafter_still_loads_in_draftline(block_dir):
    from pipeline.drafters.block.model import load_drafter

    model = load_drafter(block_dir, "block")
    assert model.config.mask_token_id is not None and model.config.mask_mode == "token"


def test_learned_mask_is_refused_for_serving(tmp_path, tokenizer):
    directory = tmp_path / "learned"
    _save_block_drafter(directory, tokenizer, mask_mode="learned",
                        dflash_config={"mask_token_id": None, "target_layer_ids": [0, 2]})
    with pytest.raises(DraftlineError, match="learned mask embedding.*retrain with mask: auto") as caught:
        write_served_config(directory)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("key", ["num_key_value_heads", "vocab_size", "architectures"])
def test_ar_missing_config_key_is_named(ar_dir, key):
    _edit_config(ar_dir, lambda c: c.pop(key))
    with pytest.raises(DraftlineError, match=f"missing config key '{key}'"):
        serving_layout(ar_dir)


def test_ar_missing_weight_and_tokenizer_are_named(ar_dir):
    _drop_weight(ar_dir, "model.layers.0.self_attn.k_proj.weight")
    with pytest.raises(DraftlineError, match="missing weight 'model.layers.0.self_attn.k_proj.weight'"):
        serving_layout(ar_dir)


def test_missing_tokenizer_file_is_named(ar_dir):
    (ar_dir / "tokenizer.json").unlink()
    with pytest.raises(DraftlineError, match="missing tokenizer file 'tokenizer.json'"):
        serving_layout(ar_dir)


@pytest.mark.parametrize("key", ["block_size", "num_target_layers", "head_dim"])
def test_dflash_missing_config_key_is_named(block_dir, key):
    _edit_config(block_dir, lambda c: c.pop(key))
    with pytest.raises(DraftlineError, match=f"missing config key '{key}'"):
        check_layout(block_dir)


def test_dflash_missing_subkey_weight_and_stray_head(block_dir):
    _edit_config(block_dir, lambda c: c["dflash_config"].pop("target_layer_ids"))
    with pytest.raises(DraftlineError, match="dflash_config.target_layer_ids"):
        check_layout(block_dir)
    _edit_config(block_dir, lambda c: c["dflash_config"].update(target_layer_ids=[0, 9]))
    with pytest.raises(DraftlineError, match="below num_target_layers"):
        check_layout(block_dir)
    _edit_config(block_dir, lambda c: c["dflash_config"].update(target_layer_ids=[0, 2]))
    _drop_weight(block_dir, "fc.weight")
    with pytest.raises(DraftlineError, match="missing weight 'fc.weight'"):
        check_layout(block_dir)


def test_dflash_rejects_embedding_in_checkpoint(block_dir):
    weights = load_file(str(block_dir / "model.safetensors"))
    weights["embed_tokens.weight"] = torch.zeros(4, 4)
    save_file(weights, str(block_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DraftlineError, match="must not carry 'embed_tokens.weight'"):
        check_layout(block_dir)


def test_copy_checkpoint_leaves_training_record_and_needs_a_drafter(ar_dir, tmp_path):
    (ar_dir / "training.json").write_text("{}")
    copy_checkpoint(ar_dir, tmp_path / "serving")
    assert (tmp_path / "serving" / "model.safetensors").is_file()
    assert not (tmp_path / "serving" / "training.json").exists()
    with pytest.raises(DraftlineError, match="dvc repro train_nothing"):
        copy_checkpoint(tmp_path / "nothing", tmp_path / "other")


def test_launch_snippets_carry_paths_and_numbers(ar_dir, block_dir):
    (ar_dir / "training.json").write_text(json.dumps({"draft_tokens": 5}))
    ar = ar_serving.launch(serving_layout(ar_dir), "/models/verifier", Path("/exp/ar/serving"), ar_dir)
    spec = json.loads(ar.markdown.split("--speculative-config '")[1].split("'")[0])
    assert spec == ar.speculative_config == {"method": "draft_model", "model": "/exp/ar/serving",
                                             "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"}
    assert "--speculative-algorithm STANDALONE" in ar.markdown and "--speculative-num-draft-tokens 6" in ar.markdown
    assert "decoding_type: Draft_Target" in ar.markdown and "max_draft_len: 5" in ar.markdown

    config = json.loads((block_dir / "config.json").read_text())
    block = block_serving.launch(config, "/models/verifier", Path("/exp/block/serving"), block_dir)
    text = block.markdown
    spec = json.loads(text.split("--speculative-config '")[1].split("'")[0])
    assert spec == {"method": "dflash", "model": "/exp/block/serving", "num_speculative_tokens": 3,
                    "draft_sample_method": "probabilistic"}
    assert "--speculative-algorithm DFLASH" in text and "--speculative-num-draft-tokens 4" in text
    assert "decoding_type: DFlash" in text and "target_layer_ids: [0, 2]" in text
    assert f"mask_token_id: {config['dflash_config']['mask_token_id']}" in text
    assert vllm_job("/models/verifier", block) == {"model": "/models/verifier", "speculative_config": spec}


@pytest.fixture
def dspark_dir(tmp_path, tokenizer) -> Path:
    """A block drafter with a Markov head (rank 8) and a confidence head, in its served (DSpark) layout."""
    directory = tmp_path / "dspark"
    _save_block_drafter(directory, tokenizer, markov_rank=8, enable_confidence_head=True)
    write_served_config(directory)
    return directory


def test_dspark_variant_is_served_in_vllms_qwen3_dspark_layout(dspark_dir, block_dir, tokenizer):
    """The keys and weight names vLLM's qwen3_dspark.py reads; a plain DFlash export carries none of them."""
    config = check_layout(dspark_dir)
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["model_type"] == "qwen3"
    assert config["markov_rank"] == 8 and config["markov_head_type"] == "vanilla"
    assert config["enable_confidence_head"] is True and config["confidence_head_with_markov"] is True
    assert config["sample_from_anchor"] is False and config["draft_vocab_size"] == len(tokenizer)
    weights = load_file(str(dspark_dir / "model.safetensors"))
    assert weights["markov_head.markov_w1.weight"].shape == (len(tokenizer), 8)
    assert weights["markov_head.markov_w2.weight"].shape == (len(tokenizer), 8)  # vLLM: ParallelLMHead(V, r)
    assert weights["confidence_head.proj.weight"].shape == (1, 32 + 8) and weights["confidence_head.proj.bias"].shape == (1,)
    plain = json.loads((block_dir / "config.json").read_text())
    assert not {"markov_rank", "enable_confidence_head", "sample_from_anchor"} & set(plain)

    launch = block_serving.launch(config, "/models/verifier", Path("/exp/block/serving"), dspark_dir)
    spec = json.loads(launch.markdown.split("--speculative-config '")[1].split("'")[0])
    assert spec == launch.speculative_config == {"method": "dspark", "model": "/exp/block/serving",
                                                 "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    assert "(rank 8), with a confidence head" in launch.markdown
    assert "--speculative-algorithm" not in launch.markdown  # no unchecked SGLang snippet for the DSpark layout


def test_dspark_layout_without_its_heads_or_with_the_wrong_block_layout_is_refused(dspark_dir):
    from pipeline.drafters.block.model import load_drafter

    assert load_drafter(dspark_dir, "dspark").markov_head is not None  # the ONNX backend runs the served heads
    _edit_config(dspark_dir, lambda c: c.update(sample_from_anchor=True))
    with pytest.raises(DraftlineError, match="sample_from_anchor false"):
        check_layout(dspark_dir)
    _edit_config(dspark_dir, lambda c: c.update(sample_from_anchor=False, architectures=["DFlashDraftModel"]))
    with pytest.raises(DraftlineError, match="expected \\['Qwen3DSparkModel'\\]"):
        check_layout(dspark_dir)
    _edit_config(dspark_dir, lambda c: c.update(architectures=["Qwen3DSparkModel"]))
    _drop_weight(dspark_dir, "confidence_head.proj.bias")
    with pytest.raises(DraftlineError, match="weight 'confidence_head.proj.bias'"):
        check_layout(dspark_dir)
    _drop_weight(dspark_dir, "markov_head.markov_w2.weight")
    with pytest.raises(DraftlineError, match="weight 'markov_head.markov_w2.weight'"):
        check_layout(dspark_dir)


def test_ar_launch_needs_the_trained_k(ar_dir):
    with pytest.raises(DraftlineError, match="records no draft_tokens.*dvc repro train_ar"):
        ar_serving.launch(serving_layout(ar_dir), "/v", Path("/d"), ar_dir)


def test_tensorrt_yaml_is_valid_yaml_with_null():
    served = {"block_size": 4, "dflash_config": {"mask_token_id": None, "target_layer_ids": [0, 2]}}
    text = block_serving.launch(served, "/v", Path("/d"), Path("/d")).markdown
    snippet = text.split("`spec.yaml`:\n\n```yaml\n")[1].split("```")[0]
    config = yaml.safe_load(snippet)["speculative_config"]
    assert config["mask_token_id"] is None and config["target_layer_ids"] == [0, 2] and config["max_draft_len"] == 3


def test_manifest_file_table_and_tokenizer_hash(ar_dir):
    (ar_dir / "sub").mkdir()
    (ar_dir / "sub" / "x.bin").write_bytes(b"abc")
    (ar_dir / "manifest.json").write_text("{}")
    table = file_table(ar_dir)
    assert "manifest.json" not in table and "sub/x.bin" in table
    assert table["sub/x.bin"] == {"sha256": hash_file(ar_dir / "sub" / "x.bin"), "bytes": 3}
    before = tokenizer_hash(ar_dir)
    (ar_dir / "tokenizer_config.json").write_text("{}")
    assert tokenizer_hash(ar_dir) != before


def test_stage_without_drafters_fails_cleanly(tmp_path, capsys):
    from export.export import main

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"project": {"artifacts_dir": str(tmp_path / "artifacts")},
                                      "export": {"tensorrt": "off"}}))
    assert main(["--params", str(params)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "no ar drafter" in error and "dvc repro train_ar" in error
    assert not (tmp_path / "artifacts" / "export").exists()


@pytest.mark.parametrize(("layer_ids", "norm_before_residual", "sglang", "trtllm"), [
    ([1, 3, 5], False, True, True),
    ([1, 5], False, False, True),  # SGLang's fc takes exactly three tapped layers
    ([1, 3, 5], True, False, False),  # neither takes the residual after hidden_norm
])
def test_eagle3_launch_gives_snippets_only_where_the_stack_can_serve_the_head(tmp_path, layer_ids,
                                                                              norm_before_residual, sglang, trtllm):
    (tmp_path / "training.json").write_text(json.dumps({"draft_tokens": 3}))
    config = {"eagle_aux_hidden_state_layer_ids": layer_ids, "norm_before_residual": norm_before_residual,
              "model_type": "draftline_eagle3", "draft_vocab_size": 64, "vocab_size": 64}
    served = eagle3_serving.served_config(config)
    # vLLM reads the top-level ids (input of layer L); SGLang only eagle_config (output of layer L)
    assert served["eagle_aux_hidden_state_layer_ids"] == layer_ids
    assert served["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in layer_ids]
    text = eagle3_serving.launch(served, "/v", Path("/d"), tmp_path).markdown
    assert ("--speculative-algorithm EAGLE3" in text) == sglang
    assert ("decoding_type: Eagle3" in text) == trtllm
    assert (f"eagle3_layers_to_capture: {[i - 1 for i in layer_ids]}" in text) == trtllm
    assert '"method": "eagle3"' in text  # vLLM serves every variant (serve_check runs it)
