"""The part of the verifier offline training needs: embeddings, final norm and LM head, nothing else.

Offline training (`train.<kind>.features: offline`) reads the verifier's hidden states from
`artifacts/features/`, so of the verifier it needs only what turns a stored last-layer state into HF's
outputs (`norm`, `lm_head`) and what the drafters share with it (the embedding table, the final norm
and LM head some of them start from). A 70B verifier's decoder is ~140 GB; these are ~2 GB. The three
modules are found on the architecture built on the `meta` device (no memory, no weights: the decoder
layers there are empty shells, dropped at once) and filled tensor by tensor from the checkpoint's
safetensors (`safe_open`), so the decoder's weights are never read and need not even be on disk.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from pipeline.errors import DraftlineError
from pipeline.integrity import check_loadable_dir, load_pretrained, safetensors_shapes
from pipeline.paths import ArtifactPaths
from pipeline.verifier_record import model_location, read_record

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FIX = "restore the verifier's files (or re-run `dvc repro bootstrap_verifier`)"


class _HeadBase(nn.Module):
    """Where HF decoder LMs keep the embeddings and final norm (`model.embed_tokens`, `model.norm`)."""

    def __init__(self, embed_tokens: nn.Module, norm: nn.Module):
        super().__init__()
        self.embed_tokens, self.norm = embed_tokens, norm


class VerifierHead(nn.Module):
    """The verifier's embeddings, final norm and LM head with the accessors the drafters' builders use on a
    full HF model (`config`, `generation_config`, `get_input_embeddings`, `get_output_embeddings`,
    `get_decoder().norm`), frozen. It has no decoder: it cannot run the verifier."""

    def __init__(self, config, generation_config: GenerationConfig, embed_tokens: nn.Module, norm: nn.Module,
                 lm_head: nn.Module):
        super().__init__()
        self.config, self.generation_config = config, generation_config
        self.model = _HeadBase(embed_tokens, norm)
        self.lm_head = lm_head
        self.eval()
        self.requires_grad_(False)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def get_decoder(self) -> nn.Module:
        return self.model

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device


def _tensor_files(directory: Path, names: set[str]) -> dict[str, Path]:
    """Which safetensors file holds each of `names` (headers only)."""
    found: dict[str, Path] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            found.update({name: path for name in handle.keys() if name in names})
    return found


def _head_modules(config, trust_remote_code: bool) -> dict[str, tuple[str, nn.Module]]:
    """{part: (checkpoint prefix, module)} for the embeddings, LM head and final norm, found on the architecture
    built on `meta`, so that each is the architecture's own class (its norm's exact formula) and named as in
    the checkpoint."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    parts = {"embeddings": model.get_input_embeddings(), "LM head": model.get_output_embeddings(),
             "final norm": getattr(model.get_decoder(), "norm", None)}
    names = {id(module): name for name, module in model.named_modules()}
    missing = [part for part, module in parts.items() if module is None or id(module) not in names]
    if missing:
        raise DraftlineError(f"cannot find the verifier's {', '.join(missing)} on {type(model).__name__}; "
                             "train this kind with features: online")
    return {part: (names[id(module)], module) for part, module in parts.items()}


def _fill(parts: dict[str, tuple[str, nn.Module]], directory: Path, config, dtype: torch.dtype) -> None:
    """Materialize the head's modules on CPU from the checkpoint, tensor by tensor; a missing LM head is the
    embedding table when the config ties them."""
    wanted = {f"{prefix}.{name}": (module, name) for prefix, module in parts.values()
              for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]}
    files = _tensor_files(directory, set(wanted))
    for _, module in parts.values():
        module.to_empty(device="cpu")
    for full_name, path in files.items():
        module, name = wanted[full_name]
        with safe_open(str(path), framework="pt") as handle:
            tensor = handle.get_tensor(full_name)
        if tensor.shape != getattr(module, name).shape:
            raise DraftlineError(f"the verifier's {full_name} is {list(tensor.shape)}, its config.json says "
                                 f"{list(getattr(module, name).shape)}; {_FIX}")
        getattr(module, name).data = tensor.to(dtype if tensor.is_floating_point() else tensor.dtype)
    (embed_prefix, embed), (head_prefix, head) = parts["embeddings"], parts["LM head"]
    tied = getattr(config.get_text_config(), "tie_word_embeddings", False)
    if f"{head_prefix}.weight" not in files and tied and f"{embed_prefix}.weight" in files:
        head.weight = embed.weight
        files[f"{head_prefix}.weight"] = files[f"{embed_prefix}.weight"]
    absent = sorted(set(wanted) - set(files))
    if absent:
        raise DraftlineError(f"the verifier at {directory} has no tensor {', '.join(absent)}; {_FIX}")


def load_verifier_tokenizer(directory: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """Padded on the left, pad = eos when it has none: as `data_prep.verifier` loads it with the model."""
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, directory, "verifier tokenizer", _FIX, trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_verifier_head(paths: ArtifactPaths, dtype: str = "float32", trust_remote_code: bool = False,
                       ) -> tuple[VerifierHead, PreTrainedTokenizerBase]:
    """The recorded verifier's head (safetensors only: offline training never unpickles) and tokenizer."""
    directory = Path(model_location(paths, read_record(paths)))
    check_loadable_dir(directory, _FIX, trust_remote_code)
    safetensors_shapes(directory, _FIX)  # a truncated file is one line here, not a reader traceback
    config = load_pretrained(AutoConfig.from_pretrained, directory, "verifier config", _FIX, trust_remote_code)
    parts = _head_modules(config, trust_remote_code)
    _fill(parts, directory, config, _DTYPES[dtype])
    if (directory / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    else:
        generation_config = GenerationConfig.from_model_config(config)
    head = VerifierHead(config, generation_config, *(parts[part][1] for part in ("embeddings", "final norm", "LM head")))
    return head, load_verifier_tokenizer(directory, trust_remote_code)
