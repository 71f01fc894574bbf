"""Model identities: what a checkpoint computes, not which library version saved it; and the
library versions every stage records."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.lineage import LIBRARIES, library_versions, model_identity, version_tags
from pipeline.promote.model_registry import registered_model_name
from pipeline.verifier_record import write_record
from tests.support.tiny_models import save_tiny_verifier


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("checkpoint")
    save_tiny_verifier(directory)
    return directory


def restamp(directory: Path, version: str) -> None:
    """What another transformers version's save_pretrained changes: the version stamp, a load path,
    key order and indentation."""
    for name in ("config.json", "generation_config.json"):
        path = directory / name
        data = json.loads(path.read_text())
        data.update(transformers_version=version, _name_or_path=f"/elsewhere/{version}")
        path.write_text(json.dumps(dict(reversed(list(data.items()))), indent=4))


def test_saves_differing_only_in_library_version_have_one_identity_and_registered_name(saved, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(saved, other)
    restamp(other, "5.99.0")
    (other / "training.json").write_text(json.dumps({"library_versions": {"transformers": "5.99.0"}}))
    assert (saved / "config.json").read_bytes() != (other / "config.json").read_bytes()
    assert model_identity(saved) == model_identity(other)

    first = write_record(tmp_path / "a", source="hf", name_or_path=str(saved), id_prefix="v", model_dir=saved)
    second = write_record(tmp_path / "b", source="hf", name_or_path=str(other), id_prefix="v", model_dir=other)
    assert first["id"] == second["id"]
    assert registered_model_name("draftline", first["id"], "ar") == registered_model_name("draftline", second["id"], "ar")
    assert first["library_versions"]["transformers"]  # the record says what saved it, the id does not


def test_identity_ignores_how_the_weights_are_laid_out(saved, tmp_path):
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(saved).save_pretrained(sharded, max_shard_size="40KB")
    AutoTokenizer.from_pretrained(saved).save_pretrained(sharded)
    assert len(list(sharded.glob("*.safetensors"))) > 1
    assert model_identity(sharded) == model_identity(saved)


def _edit_tensor(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = edit(tensors[name])
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("change", [
    "weight",
    "shape",
    "dtype",
    "config value",
    "vocabulary",
])
def test_a_change_to_what_the_model_computes_changes_the_identity(saved, tmp_path, change):
    changed = tmp_path / "changed"
    shutil.copytree(saved, changed)
    if change == "weight":
        def nudge(tensor):
            tensor = tensor.clone()
            tensor.view(-1)[0] += 1e-6
            return tensor
        _edit_tensor(changed, nudge)
    elif change == "shape":
        _edit_tensor(changed, lambda tensor: torch.cat([tensor, tensor[:1]]))
    elif change == "dtype":
        _edit_tensor(changed, lambda tensor: tensor.to(torch.float16))
    elif change == "config value":
        config = json.loads((changed / "config.json").read_text())
        config["rms_norm_eps"] = 1e-5
        (changed / "config.json").write_text(json.dumps(config))
    else:
        tokenizer = json.loads((changed / "tokenizer.json").read_text())
        vocab = tokenizer["model"]["vocab"]
        first, second = sorted(vocab, key=vocab.get)[-2:]
        vocab[first], vocab[second] = vocab[second], vocab[first]
        (changed / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert model_identity(changed) != model_identity(saved)


def test_library_versions_of_this_and_another_interpreter():
    own = library_versions()
    assert own["python"] and own["torch"].startswith(torch.__version__.split("+")[0]) and own["transformers"]
    assert set(own) <= {"python", *LIBRARIES}
    # another interpreter runs lineage.py as a script, with nothing but the standard library
    assert library_versions(sys.executable) == own
    assert library_versions("/nonexistent/python") == {}
    assert version_tags({"torch": "2.13.0"}) == {"library.torch": "2.13.0"}
