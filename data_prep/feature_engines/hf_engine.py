"""Feature engine `hf`: the verifier in this process, rows batched by length, right-padded under an
attention mask (a causal model's real positions never see the padding after them).

`output_hidden_states` gives layers 0..N-1 as HF numbers them; layer N is taken from the input of the final
norm by a forward pre-hook, since HF's `hidden_states[N]` is after that norm. The base model runs without
its LM head: no (tokens x vocab) logits are ever made.
"""

from __future__ import annotations

import importlib.util

import torch
import transformers
from torch import Tensor

from data_prep.verifier import load_model_and_tokenizer
from pipeline.config.features_config import FeaturesConfig
from pipeline.config.verifier_config import VerifierConfig
from pipeline.errors import DraftlineError

# What HF architectures call the norm after their last decoder layer (Llama/Qwen/Mistral/Gemma, Phi, GPT-2, OPT)
FINAL_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_layer_norm")


def final_norm(base: torch.nn.Module) -> torch.nn.Module:
    for name in FINAL_NORM_NAMES:
        module = getattr(base, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise DraftlineError(f"features.engine hf: the verifier's {type(base).__name__} has no final norm named "
                         f"{' / '.join(FINAL_NORM_NAMES)}, so its last layer cannot be taken before it; "
                         "use features.engine: vllm")


class HFFeatureEngine:
    def __init__(self, model, batch_size: int, device_map: str | None = None):
        self.model, self.batch_size, self.device_map = model, batch_size, device_map
        self.base = model.base_model
        self.norm = final_norm(self.base)
        self.depth = model.config.get_text_config().num_hidden_layers
        self.device = model.get_input_embeddings().weight.device  # where the first layer (and so the ids) live

    @classmethod
    def load(cls, location: str, config: FeaturesConfig, verifier: VerifierConfig) -> "HFFeatureEngine":
        """The verifier on one device (a GPU when there is one), or spread by `features.device_map`."""
        if config.device_map and importlib.util.find_spec("accelerate") is None:
            raise DraftlineError(f"features.device_map {config.device_map!r} needs the accelerate package "
                                 "(pip install accelerate), or set features.device_map: null")
        model, _ = load_model_and_tokenizer(location, verifier.dtype, verifier.trust_remote_code,
                                            verifier.allow_pickle_weights, device_map=config.device_map)
        if not config.device_map and torch.cuda.is_available():
            model.to("cuda")
        return cls(model, config.batch_size, config.device_map)

    def describe(self) -> dict:
        return {"name": "hf", "version": f"transformers {transformers.__version__}", "batch_size": self.batch_size,
                "device": str(self.device) if self.device_map is None else f"device_map {self.device_map}"}

    def extract(self, rows: list[list[int]], layers: list[int]) -> list[dict[int, Tensor]]:
        # batches of similar length pad little; the order depends on the rows only, so a shard redone gives the
        # same batches and so the same bytes
        order = sorted(range(len(rows)), key=lambda index: len(rows[index]))
        states: list[dict[int, Tensor]] = [{} for _ in rows]
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            for index, row_states in zip(batch, self._forward([rows[index] for index in batch], layers)):
                states[index] = row_states
        return states

    @torch.no_grad()
    def _forward(self, rows: list[list[int]], layers: list[int]) -> list[dict[int, Tensor]]:
        width = max(len(row) for row in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, : len(row)] = torch.tensor(row)
            attention_mask[index, : len(row)] = 1
        captured: dict[str, Tensor] = {}
        hook = self.norm.register_forward_pre_hook(lambda module, args: captured.__setitem__("last", args[0]))
        try:
            output = self.base(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                               output_hidden_states=True, use_cache=False)
        finally:
            hook.remove()
        by_layer = {layer: captured["last"] if layer == self.depth else output.hidden_states[layer] for layer in layers}
        return [{layer: states[index, : len(row)].float().cpu() for layer, states in by_layer.items()}
                for index, row in enumerate(rows)]

    def close(self) -> None:
        self.model = self.base = self.norm = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
