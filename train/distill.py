"""The training flow every drafter kind shares: load, measure untrained, fit (resuming), gather, save.

Each kind's `training.recipe` supplies a `DrafterRecipe` (its model, data, Lightning module and agreement
evaluation: pipeline/training/recipe.py); this module owns the rest so the kinds' training stages cannot
drift apart. Every process of a multi-process launch runs it; only rank 0 evaluates and writes outputs.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import torch
from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from data_prep.corpus import corpus_hash, load_corpus
from data_prep.verifier import load_verifier
from pipeline.atomic import write_json_atomic
from pipeline.drafters.registry import KIND_SPECS
from pipeline.features.store import FeatureStore
from pipeline.integrity import refused_global
from pipeline.lineage import git_commit, library_versions
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from pipeline.tracking import checked_tracking_uri
from pipeline.training.feature_batches import TrainingFeatures, open_training_features
from pipeline.training.feature_verifier import DECODED_OFFLINE_NOTE, FeatureVerifier
from pipeline.training.frozen import FrozenVerifier, VerifierSource
from pipeline.training.muon import MuonAdamW
from pipeline.training.params import TrainParams
from pipeline.training.verifier_head import load_verifier_head
from pipeline.verifier_record import verifier_identity
from train.launch import join_launch
from train.trainer import (
    build_trainer,
    flatten,
    full_state_dict,
    is_rank_zero,
    make_mlflow_logger,
    refuse_non_finite,
    resume_checkpoint,
    save_drafter_atomic,
    single_writer,
    untrusted_checkpoint,
)


def _scalars(results: dict, keys: tuple[str, ...]) -> dict:
    return {key: results[key] for key in keys if isinstance(results[key], (int, float))}


def checkpoint_fingerprint(kind: str, config: BaseModel, verifier_hash: str, corpus_hash: str, seed: int,
                           features_hash: str | None) -> dict:
    """What checkpoints in artifacts/checkpoints/<kind>/ must have been trained with to be resumed; offline, the
    feature set too (features.dtype is not in `train.<kind>`, and a resumed run would keep the old set's training)."""
    return {f"train.{kind}": config.model_dump(mode="json"), "verifier": verifier_hash, "corpus": corpus_hash,
            "seed": seed, "features": features_hash}


def load_teacher(params: TrainParams, kind: str, paths: ArtifactPaths, identity: dict, data_hash: str,
                 ) -> tuple[VerifierSource, PreTrainedTokenizerBase, TrainingFeatures | None]:
    """Online: the whole verifier. Offline: its head and the feature set, checked against `train.<kind>` before
    any row is read; the decoder layers are never loaded."""
    cfg, verifier_params = getattr(params.train, kind), params.verifier
    if cfg.features == "online":
        verifier, tokenizer = load_verifier(paths, verifier_params.dtype, verifier_params.trust_remote_code,
                                           verifier_params.allow_pickle_weights)
        return FrozenVerifier(verifier), tokenizer, None
    head, tokenizer = load_verifier_head(paths, verifier_params.dtype, verifier_params.trust_remote_code)
    depth = int(head.config.get_text_config().num_hidden_layers)
    features = open_training_features(
        FeatureStore(paths.features), kind=kind, layers=KIND_SPECS[kind].module("config").feature_layers(cfg, depth),
        dtype=params.features.dtype, verifier_config=head.config, verifier_hash=identity["hash"],
        corpus_hash=data_hash, max_seq_len=cfg.trainer.max_seq_len, dequantize_to=head.dtype)
    return FeatureVerifier(head), tokenizer, features


def distill(params: TrainParams, kind: str) -> dict | None:
    """Train and save drafter `kind`; returns training.json's content on rank 0 (None elsewhere)."""
    started = time.perf_counter()
    join_launch(getattr(params.train, kind).trainer, f"train.{kind}")  # a launch that cannot be right: one line, now
    checked_tracking_uri(params.tracking)  # before minutes of loading and training, not after
    paths = ArtifactPaths.from_params(params)
    identity, data_hash = verifier_identity(paths), corpus_hash(paths)
    teacher, tokenizer, features = load_teacher(params, kind, paths, identity, data_hash)
    corpus = load_corpus(paths, teacher.config.vocab_size)
    recipe = KIND_SPECS[kind].module("training").recipe(params, teacher, tokenizer, corpus, features)
    cfg = recipe.config
    with single_writer(paths.checkpoints(kind)):
        untrained = recipe.evaluate(recipe.drafter, teacher) if is_rank_zero() else None

        fingerprint = checkpoint_fingerprint(kind, cfg, identity["hash"], data_hash, params.project.seed,
                                             features.store.index.content_hash() if features else None)
        resume = resume_checkpoint(paths.checkpoints(kind), fingerprint)
        if resume and is_rank_zero():
            info(f"resuming from {resume}")
        logger = make_mlflow_logger(params, kind, paths.checkpoints(kind))
        module = recipe.make_module()
        trainer = build_trainer(recipe.trainer_config, checkpoint_dir=paths.checkpoints(kind), logger=logger,
                                stage=f"train.{kind}")
        fit_started = time.perf_counter()
        try:
            # The checkpoint dir may hold files this run did not write: unpickle them weights-only.
            trainer.fit(module, datamodule=recipe.data, ckpt_path=resume, weights_only=True)
        except pickle.UnpicklingError as error:  # what resume_checkpoint's static scan cannot see
            raise untrusted_checkpoint(Path(resume or paths.checkpoints(kind)), paths.checkpoints(kind),
                                       refused_global(error)) from None
        except SystemExit:
            # Lightning turns Ctrl-C into a graceful shutdown and exit(1); every other stage exits 130.
            if trainer.interrupted:
                raise KeyboardInterrupt from None
            raise
        fit_time = time.perf_counter() - fit_started
        optimizer = trainer.optimizers[0]
        # which dtype Muon's Newton-Schulz ran in: `auto` decides per machine (pipeline/machine.py)
        muon = ({"muon_precision": str(optimizer.precision).removeprefix("torch.")}
                if isinstance(optimizer, MuonAdamW) else {})

        state = full_state_dict(module.drafter, trainer)  # collective under ZeRO-3: every rank gathers
        tokens = int(trainer.strategy.reduce(torch.tensor(float(module.tokens_seen)), reduce_op="sum").item())
        if not is_rank_zero():
            return None
        refuse_non_finite(state, f"train.{kind}", "after training", "the drafter was not saved")

        # A fresh copy from the gathered weights: under ZeRO the trained module's tensors are partitioned.
        final = type(recipe.drafter)(recipe.drafter.config)
        final.load_state_dict(state)
        final.to(module.device if module.device.type == "cuda" else "cpu").eval()
        trained = recipe.evaluate(final, teacher)
        train_loss = trainer.callback_metrics.get("train/loss")
        training_info = {
            "kind": kind,
            "steps": trainer.global_step,
            "tokens": tokens,
            "train_loss": float(train_loss) if train_loss is not None else None,
            "val_loss": trained["loss"],
            "untrained_val_loss": untrained["loss"],
            **{key: trained[key] for key in recipe.agreement_keys},
            **{f"untrained_{key}": untrained[key] for key in recipe.agreement_keys},
            **recipe.extra_info,
            "features": cfg.features,
            "strategy": recipe.trainer_config.strategy,
            **muon,
            "world_size": trainer.world_size,
            "lineage": {
                "verifier_id": identity["id"],
                "verifier_hash": identity["hash"],
                "corpus_hash": data_hash,
                "params_hash": params.section_hash("train"),
                "git_commit": git_commit(),
                "library_versions": library_versions(),
            },
        }
        decoded_later = [key for key in recipe.agreement_keys if trained[key] is None]
        if decoded_later:
            training_info["decode_tau_note"] = DECODED_OFFLINE_NOTE
        scalars = _scalars(trained, recipe.agreement_keys)
        untrained_scalars = {f"untrained_{key}": value for key, value in _scalars(untrained, recipe.agreement_keys).items()}
        logger.log_hyperparams(flatten(f"train.{kind}", cfg.model_dump(mode="json")))
        logger.log_metrics({f"final/{key}": value for key, value in
                            {"val_loss": trained["loss"], **scalars, **untrained_scalars}.items()},
                           step=trainer.global_step)

        def write_model(directory):
            final.to("cpu").save_pretrained(directory)
            tokenizer.save_pretrained(directory)

        save_drafter_atomic(paths.drafter(kind), write_model, training_info, logger)
        metrics = {key: training_info[key] for key in ("steps", "tokens", "train_loss", "val_loss", "untrained_val_loss")}
        metrics.update(scalars, **untrained_scalars, wall_time_s=round(time.perf_counter() - started, 1),
                       fit_time_s=round(fit_time, 2), **muon)  # fit: this run's only, a resumed run's share of the steps
        write_json_atomic(paths.metrics / f"train_{kind}.json", metrics)
        print_summary(f"train_{kind}", {
            **metrics, "drafter": str(paths.drafter(kind)), "verifier features": cfg.features,
            **({"decoded tau": DECODED_OFFLINE_NOTE} if decoded_later else {}),
            "top1 per position": ", ".join(f"{r:.3f}" for r in training_info[recipe.per_position_key]),
            "untrained top1 per position": ", ".join(
                f"{r:.3f}" for r in training_info[f"untrained_{recipe.per_position_key}"]),
        })
        if recipe.after_save is not None:
            recipe.after_save(paths)
        return training_info
