"""A drafter tensor whose shape its config.json does not give (a damaged or hand-edited checkpoint) stops
the loader that export, evaluate and serve_check use with one line naming the drafter, not a traceback."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.drafters.ar.model import load_drafter as load_ar
from pipeline.drafters.eagle3.model import load_drafter as load_eagle3
from pipeline.errors import DraftlineError
from tests.support.tiny_models import save_tiny_eagle3, tiny_qwen3, tiny_tokenizer


def _grow_first_matrix(directory: Path) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    name = next(key for key, tensor in tensors.items() if tensor.dim() == 2)
    tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("kind", ["ar", "eagle3"])
def test_a_tensor_shape_the_config_does_not_give_is_one_line(tmp_path, kind):
    tokenizer = tiny_tokenizer()
    if kind == "ar":
        tiny_qwen3(len(tokenizer), num_layers=1).save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)
        load = load_ar
    else:
        save_tiny_eagle3(tiny_qwen3(len(tokenizer), num_layers=2), tokenizer, tmp_path)
        load = load_eagle3
    _grow_first_matrix(tmp_path)
    with pytest.raises(DraftlineError, match=rf"(?i){kind}.*drafter at .*shape its config\.json does not give.*dvc repro "
                                             rf"train_{kind}") as caught:
        load(tmp_path)
    assert "\n" not in str(caught.value)
