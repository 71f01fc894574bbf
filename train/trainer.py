"""The training stage's machinery: Trainer construction (strategy, precision), checkpoints and resume, the
MLflow logger, gathering the full state dict under ZeRO-3, and the atomic HF save with `training.json`.

Everything here is drafter-agnostic: each kind's Lightning module (`pipeline/drafters/<kind>/lightning.py`,
on `pipeline/training/module.py`) plugs into it through its recipe and `train/distill.py`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from filelock import FileLock, Timeout
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn

from pipeline.atomic import atomic_dir, write_json_atomic
from pipeline.config.trainer_config import TrainerConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import non_finite, refused_global
from pipeline.lineage import model_identity, read_json, version_tags
from pipeline.progress import info
from pipeline.tracking import TAG_MODEL_IDENTITY, TAG_STAGE, sqlite_artifact_root, tracking_uri
from pipeline.training.params import TrainParams
from train.strategies import CHECKPOINT_GLOBAL_NAMES, make_strategy, uses_gpu

TRAINING_INFO = "training.json"
LAST_CHECKPOINT = "last.ckpt"
FINGERPRINT_FILE = "fingerprint.json"


# --------------------------------------------------------------------------- ranks


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, from the launcher's variables (torchrun, SLURM, deepspeed,
    MPI), readable before the process group exists."""
    for name in ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if name in os.environ:
            return int(os.environ[name]) == 0
    # Lightning's subprocess launcher sets only LOCAL_RANK/NODE_RANK for the processes it starts: rank 0
    # is local rank 0 on node 0 (their sum is not a rank).
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


# --------------------------------------------------------------------------- trainer


class NonFiniteTraining(DraftlineError):
    """A loss, gradient or weight that is NaN or Inf: training stops there, and nothing holding it is saved."""


class FiniteTraining(Callback):
    """Stops the run at the first non-finite gradient (before the optimizer applies it) or loss, on every rank
    at once (the decision is reduced, so no rank waits for a peer that stopped), and refuses to write a
    checkpoint holding a non-finite weight. Checkpoint callbacks run after this one, so the step that went
    wrong is never checkpointed. Under DeepSpeed the optimizer holds the gradients (not visible here): the loss
    check and the check of the final gathered weights (train/distill.py) hold there."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def _stop(self, trainer: Trainer, found: str | None, where: str) -> None:
        if not trainer.strategy.reduce_boolean_decision(found is not None, all=False):
            return
        raise NonFiniteTraining(
            f"{self.stage}: {found or 'a non-finite loss or gradient on another rank'} {where}; training stopped "
            "and no checkpoint or drafter holds it: lower trainer.learning_rate, or check the inputs it read "
            "(features, corpus)")

    def on_before_optimizer_step(self, trainer: Trainer, pl_module, optimizer) -> None:
        bad = non_finite((name, parameter.grad) for name, parameter in pl_module.named_parameters()
                         if parameter.grad is not None)
        self._stop(trainer, f"the gradient of {bad[0]} is NaN/Inf" if bad else None,
                   f"at optimizer step {trainer.global_step + 1}, before it was applied")

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = loss is not None and not bool(torch.isfinite(loss.detach()).all())
        self._stop(trainer, f"the training loss is {float(loss.detach().float().sum()):g}" if bad else None,
                   f"at batch {batch_idx} of epoch {trainer.current_epoch} (after {trainer.global_step} "
                   "optimizer steps)")

    def on_save_checkpoint(self, trainer: Trainer, pl_module, checkpoint: dict) -> None:
        # under ZeRO-3 these are the empty placeholders of partitioned weights: the final gathered check holds there
        refuse_non_finite(checkpoint.get("state_dict", {}), self.stage,
                          f"at step {trainer.global_step}", "the checkpoint was not written")


def refuse_non_finite(state: dict[str, torch.Tensor], stage: str, when: str, outcome: str) -> None:
    bad = non_finite(state.items())
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise NonFiniteTraining(f"{stage}: the weights {when} hold NaN/Inf ({shown}), so {outcome}: lower "
                                "trainer.learning_rate, or check the inputs it read (features, corpus)")


def build_trainer(
    cfg: TrainerConfig,
    *,
    checkpoint_dir: Path,
    logger: MLFlowLogger | None = None,
    callbacks: Sequence[Callback] = (),
    enable_progress_bar: bool = True,
    limit_val_batches: int | float = 1.0,
    stage: str = "training",
) -> Trainer:
    """A Trainer from params; checkpoints every `checkpoint_every_n_steps` into `checkpoint_dir` (+ `last.ckpt`).
    A non-finite loss, gradient or checkpoint stops it with one line naming `stage` (FiniteTraining)."""
    checkpointing = ModelCheckpoint(
        dirpath=checkpoint_dir,
        filename="step{step:06d}",
        auto_insert_metric_name=False,
        every_n_train_steps=cfg.checkpoint_every_n_steps,
        save_top_k=1,  # monitor=None: keep only the newest, plus last.ckpt
        save_last=True,
        enable_version_counter=False,
    )
    accelerator = "gpu" if uses_gpu(cfg) else "cpu"
    if cfg.strategy == "deepspeed_stage_3" and accelerator == "cpu" and is_rank_zero():
        info("deepspeed_stage_3 on CPU gathers the partitioned weights on every step: measured 44 vs 10 ms/step for "
             "strategy auto on a tiny drafter (2 cores, docs/scaling.md); it saves memory, not time")
    enable_progress_bar = enable_progress_bar and is_rank_zero()  # one bar per run, not one per process
    if enable_progress_bar and not sys.stderr.isatty():
        # a log file gets one bar line per ~5% of training, not one per step
        callbacks = [*callbacks, TQDMProgressBar(refresh_rate=max(1, cfg.max_steps // 20))]
    return Trainer(
        accelerator=accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=make_strategy(cfg),
        precision=resolve_precision(cfg),
        max_steps=cfg.max_steps,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        # DeepSpeed clips inside its engine; Lightning forwards this value to it.
        gradient_clip_val=cfg.grad_clip,
        gradient_clip_algorithm="norm",
        val_check_interval=cfg.val_every_n_steps * cfg.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        limit_val_batches=limit_val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=max(1, min(10, cfg.val_every_n_steps)),
        logger=logger or False,
        callbacks=[FiniteTraining(stage), checkpointing, *callbacks],
        enable_progress_bar=enable_progress_bar,  # Lightning refuses a bar callback on a rank without a bar
        enable_model_summary=False,
        default_root_dir=str(checkpoint_dir),
        use_distributed_sampler=True,
    )


def resolve_precision(cfg: TrainerConfig) -> str:
    """bf16 autocast where the hardware has it; fall back to fp32 (with no silent fp16 on CPU)."""
    if cfg.precision.startswith("bf16") and uses_gpu(cfg) and not torch.cuda.is_bf16_supported():
        return "32-true"
    if cfg.precision == "16-mixed" and not uses_gpu(cfg):
        return "32-true"
    return cfg.precision


class UntrustedCheckpoint(DraftlineError):
    """A checkpoint whose pickle holds objects beyond tensors and training state: not one we wrote."""


def untrusted_checkpoint(path: Path, checkpoint_dir: Path, objects: str) -> UntrustedCheckpoint:
    return UntrustedCheckpoint(
        f"checkpoint {path} holds pickled objects that are not tensors or training state ({objects}), which could "
        f"run code when loaded; draftline never writes these, so it is not resumed: delete {checkpoint_dir} "
        "to train from the start")


def _readable_checkpoint(path: Path, checkpoint_dir: Path) -> bool:
    """Whether `path` (a Lightning checkpoint file, or a DeepSpeed checkpoint directory of `*.pt` shards) is
    intact. The checkpoint dir is an input this run may not have written, so its pickles are inspected
    statically first (no code runs) and then loaded only with `weights_only=True`, as `fit` will: foreign
    objects raise `UntrustedCheckpoint` (deleting it is the user's call); a truncated or garbled file is
    damaged and the caller falls back to an older one."""
    files = [path] if path.is_file() else sorted(path.rglob("*.pt"))
    if not files:
        return False  # a DeepSpeed directory whose shards were never written
    for file in files:
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(str(file))
        except Exception:  # not a complete torch.save zip: a kill or a full disk during the write
            return False
        foreign = sorted(set(found) - CHECKPOINT_GLOBAL_NAMES)
        if foreign:
            raise untrusted_checkpoint(file, checkpoint_dir, ", ".join(foreign))
    if path.is_dir():
        return True  # DeepSpeed reads the shards itself during fit, weights-only (train/strategies.py)
    try:
        # mmap keeps this cheap for big files; the static scan above misses objects built on the fly
        return "global_step" in torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise untrusted_checkpoint(path, checkpoint_dir, refused_global(error)) from None
    except Exception:  # any other failure to read means the same thing here: not usable
        return False


def resume_checkpoint(checkpoint_dir: Path, fingerprint: dict) -> str | None:
    """The checkpoint to resume from, or None to start fresh.

    Checkpoints from a run with a different fingerprint (model shape, loss, data) are discarded
    rather than loaded into an incompatible model. A damaged `last.ckpt` (a kill during its write,
    a full disk) falls back to the newest intact step checkpoint. Only rank 0 deletes; others only read.
    """
    checkpoint_dir = Path(checkpoint_dir)
    record = checkpoint_dir / FINGERPRINT_FILE
    try:
        matches = record.is_file() and read_json(record) == fingerprint
    except (OSError, ValueError):  # a damaged record cannot vouch for the checkpoints: they are discarded
        matches = False
        if is_rank_zero():
            info(f"{record} is unreadable; discarding the checkpoints next to it")
    if matches:
        newest_first = [checkpoint_dir / LAST_CHECKPOINT, *sorted(checkpoint_dir.glob("step*.ckpt"), reverse=True)]
        for candidate in (path for path in newest_first if path.exists()):
            if _readable_checkpoint(candidate, checkpoint_dir):
                return str(candidate)
            if is_rank_zero():
                info(f"checkpoint {candidate} is damaged; trying an older one")
        if is_rank_zero() and any(path.exists() for path in newest_first):
            info(f"no intact checkpoint in {checkpoint_dir}; training from the start")
    if is_rank_zero():
        if checkpoint_dir.exists() and not matches:
            shutil.rmtree(checkpoint_dir)
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(record, fingerprint)
    return None


@contextlib.contextmanager
def single_writer(checkpoint_dir: Path) -> Iterator[None]:
    """One training per checkpoint dir: a second one would interleave its checkpoints with the first's and
    mark the first's live MLflow run KILLED. Rank 0 holds `<dir>.lock` next to the dir (resume_checkpoint
    may delete the dir itself); the OS drops it when the process dies."""
    if not is_rank_zero():
        yield
        return
    checkpoint_dir = Path(checkpoint_dir)
    lock_path = checkpoint_dir.with_name(f"{checkpoint_dir.name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise DraftlineError(f"another training is running on {checkpoint_dir} (it holds {lock_path}); "
                             "wait for it to finish") from None
    except OSError as error:
        raise DraftlineError(f"cannot take the training lock {lock_path} ({error.strerror or error}); it must be a "
                             "plain file: remove what is there if no training is running") from None
    try:
        yield
    finally:
        lock.release()


# --------------------------------------------------------------------------- MLflow


TAG_CHECKPOINTS = "draftline.checkpoint_dir"


def make_mlflow_logger(params: TrainParams, kind: str, checkpoint_dir: Path) -> MLFlowLogger | None:
    """The run is tagged with its checkpoint dir: runs left RUNNING there by a killed process are
    marked KILLED when training starts again (the dir is single-writer, so none can still be alive).

    None on every rank but global rank 0: only rank 0 touches the tracking store. Two nodes' processes
    opening a store that does not exist yet both create its tables, and one dies ("table ... already exists")."""
    if not is_rank_zero():
        return None
    checkpoints = str(Path(checkpoint_dir).resolve())
    uri = tracking_uri(params.tracking)
    logger = MLFlowLogger(
        experiment_name=params.tracking.experiment,
        run_name=f"train_{kind}",
        tracking_uri=uri,
        # where promotion expects it when training creates the experiment first: next to the sqlite file
        artifact_location=sqlite_artifact_root(uri),
        tags={"draftline.kind": kind, TAG_STAGE: "train", TAG_CHECKPOINTS: checkpoints, **version_tags()},
        log_model=False,
    )
    client, experiment_id = logger.experiment, logger.experiment_id
    abandoned = client.search_runs(
        [experiment_id], filter_string=f"attributes.status = 'RUNNING' and tags.`{TAG_CHECKPOINTS}` = '{checkpoints}'"
    )
    # `logger.experiment` has just created this process's own run, RUNNING too: never count it.
    abandoned = [run for run in abandoned if run.info.run_id != logger.run_id]
    for run in abandoned:
        client.set_terminated(run.info.run_id, status="KILLED")
    if abandoned:
        info(f"marked {len(abandoned)} MLflow run(s) left RUNNING by an interrupted training as KILLED")
    return logger


def flatten(prefix: str, obj: object) -> dict[str, object]:
    """Nested params -> {"a.b.c": value} for MLflow's flat parameter namespace."""
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for key, value in obj.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return {prefix: obj}


# --------------------------------------------------------------------------- saving


def full_state_dict(module: nn.Module, trainer: Trainer) -> dict[str, torch.Tensor]:
    """The module's full CPU state dict; under ZeRO-3 the partitions are gathered (collective: call on all ranks)."""
    if is_deepspeed_stage_3(trainer):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}
    return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}


def is_deepspeed_stage_3(trainer: Trainer) -> bool:
    return bool(getattr(trainer.strategy, "zero_stage_3", False))


def save_drafter_atomic(
    target: Path,
    write_model: Callable[[Path], None],
    training_info: dict,
    logger: MLFlowLogger | None = None,
) -> None:
    """Write the drafter dir atomically: `write_model(tmp)`, then `training.json`, then log it to MLflow.

    The run is tagged with the checkpoint's identity, which is how promotion finds it: a run id in
    `training.json` would make two trainings of the same weights different DVC outputs. The whole dir is
    logged as the run's `drafter` artifact before the rename, so a failure anywhere leaves the previous
    drafter (or nothing) in place.
    """
    with atomic_dir(target) as tmp:
        write_model(tmp)
        write_json_atomic(tmp / TRAINING_INFO, training_info)
        if logger is not None:
            logger.experiment.set_tag(logger.run_id, TAG_MODEL_IDENTITY, model_identity(tmp))
            logger.experiment.log_artifacts(logger.run_id, str(tmp), artifact_path="drafter")
