"""How the EAGLE-3 head trains (stage `train_eagle3`): its recipe for the training stage (train/distill.py).

The stage writes `artifacts/drafters/eagle3/` (config.json + safetensors with `fc`, `midlayer.*`, `norm`,
`lm_head` and, with a reduced draft vocabulary, `d2t`/`t2d`; tokenizer files; training.json) and
`metrics/train_eagle3.json`; Lightning checkpoints live in `artifacts/checkpoints/eagle3/` so a killed
run resumes where it stopped.
"""

from __future__ import annotations

from pipeline.drafters.eagle3.lightning import Eagle3DistillModule, evaluate_head
from pipeline.drafters.eagle3.model import build_drafter
from pipeline.training.feature_batches import TrainingFeatures
from pipeline.training.frozen import VerifierSource
from pipeline.training.params import TrainParams
from pipeline.training.prompt_response_data import PromptResponseDataModule
from pipeline.training.recipe import DrafterRecipe


def recipe(params: TrainParams, verifier: VerifierSource, tokenizer, corpus,
           features: TrainingFeatures | None) -> DrafterRecipe:
    cfg, tcfg, seed = params.train.eagle3, params.train.eagle3.trainer, params.project.seed
    train_rows = corpus["train"]
    # the draft vocabulary (when reduced) is the training split's most frequent tokens
    sequences = (prompt + response for prompt, response in zip(train_rows["prompt_ids"], train_rows["response_ids"]))
    drafter = build_drafter(verifier.head, cfg, sequences, seed)
    data = PromptResponseDataModule(corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len,
                                    batch_size=tcfg.batch_size, seed=seed, num_workers=tcfg.num_workers,
                                    features=features)
    return DrafterRecipe(
        kind="eagle3", config=cfg, trainer_config=tcfg, drafter=drafter, data=data,
        make_module=lambda: Eagle3DistillModule(drafter, verifier, cfg, tcfg, val_rows=data.val_set.rows),
        evaluate=lambda model, teacher: evaluate_head(model, teacher, data.val_set, cfg),
        agreement_keys=("top1_agreement", "position_top1_agreement", "simulated_acceptance_length",
                        "decode_tau", "decode_tau_no_prefill", "decode_acceptance"),
        per_position_key="position_top1_agreement",
        extra_info={
            "draft_tokens": cfg.draft_tokens,
            "ttt_steps": cfg.ttt_steps,
            "aux_layer_ids": drafter.config.eagle_aux_hidden_state_layer_ids,
            "draft_vocab_size": drafter.config.draft_vocab_size,
        },
    )
