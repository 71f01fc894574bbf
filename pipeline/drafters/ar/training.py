"""How the AR drafter trains (stage `train_ar`): its recipe for the training stage (train/distill.py).

The stage writes `artifacts/drafters/ar/` (HF causal LM + tokenizer + training.json) and `metrics/train_ar.json`;
Lightning checkpoints live in `artifacts/checkpoints/ar/` so a killed run resumes where it stopped.
"""

from __future__ import annotations

from pipeline.drafters.ar.lightning import ARDistillModule, evaluate_agreement
from pipeline.drafters.ar.model import build_drafter, check_same_vocabulary
from pipeline.training.budget import resolve_budget
from pipeline.training.corpus_data import NextTokenDataModule
from pipeline.training.feature_batches import TrainingFeatures
from pipeline.training.frozen import VerifierSource
from pipeline.training.params import TrainParams
from pipeline.training.recipe import DrafterRecipe


def recipe(params: TrainParams, verifier: VerifierSource, tokenizer, corpus,
           features: TrainingFeatures | None) -> DrafterRecipe:
    cfg = params.train.ar
    tcfg = resolve_budget(cfg.trainer, len(corpus["train"]))
    draft_tokens = cfg.draft_tokens
    drafter = build_drafter(verifier.head, cfg, tokenizer, seed=params.project.seed)
    check_same_vocabulary(drafter, verifier.head, "AR drafter")
    data = NextTokenDataModule(
        corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size,
        seed=params.project.seed, num_workers=tcfg.num_workers, features=features,
    )
    return DrafterRecipe(
        kind="ar", config=cfg, trainer_config=tcfg, drafter=drafter, data=data,
        make_module=lambda: ARDistillModule(drafter, verifier, cfg.loss, tcfg, draft_tokens),
        evaluate=lambda model, teacher: evaluate_agreement(model, teacher, data.val_set, cfg.loss, draft_tokens),
        agreement_keys=("top1_agreement", "simulated_acceptance_length", "token_top1_agreement"),
        per_position_key="top1_agreement",
        extra_info={"draft_tokens": draft_tokens},
    )
