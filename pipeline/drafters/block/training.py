"""How the block family trains (stages `train_block` and `train_dspark`): its recipe for the training stage
(train/distill.py) and its τ-vs-steps plot.

Stage `train_<kind>` writes `artifacts/drafters/<kind>/` (DFlash layout: config.json + safetensors with
`layers.*`, `fc`, `hidden_norm`, `norm`, plus `markov_head.*` / `confidence_head.*` for DSpark; tokenizer
files; training.json), `metrics/train_<kind>.json` and the τ-vs-steps plot `plots/train_<kind>_tau.{png,csv}`;
Lightning checkpoints live in `artifacts/checkpoints/<kind>/` so a killed run resumes where it stopped.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.atomic import save_figure_atomic, write_text_atomic
from pipeline.drafters.block.config import BlockFamilyConfig, learned_mask_warning
from pipeline.drafters.block.lightning import BlockDistillModule, evaluate_blocks
from pipeline.drafters.block.mask import resolve_mask
from pipeline.drafters.block.model import DFlashConfig, build_drafter
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, warn
from pipeline.training.budget import resolve_budget
from pipeline.training.feature_batches import TrainingFeatures
from pipeline.training.frozen import VerifierSource
from pipeline.training.params import TrainParams
from pipeline.training.prompt_response_data import PromptResponseDataModule
from pipeline.training.recipe import DrafterRecipe


def recipe(params: TrainParams, verifier: VerifierSource, tokenizer, corpus,
           features: TrainingFeatures | None) -> DrafterRecipe:
    """The plain block drafter's recipe (`train.block`)."""
    return family_recipe(params.train.block, params, verifier, tokenizer, corpus, features)


def family_recipe(cfg: BlockFamilyConfig, params: TrainParams, verifier: VerifierSource, tokenizer, corpus,
                  features: TrainingFeatures | None) -> DrafterRecipe:
    """The recipe of the block-family kind whose section `cfg` is; after saving, the τ-vs-steps plot from the
    validation history of the Lightning module it made (also when a short budget ended before the first validation)."""
    modules: list[BlockDistillModule] = []
    seed = params.project.seed
    tcfg = resolve_budget(cfg.trainer, len(corpus["train"]))
    mask = resolve_mask(cfg.mask, verifier.head, tokenizer, corpus["train"], cfg.kind)
    if mask is None:
        warn(learned_mask_warning(cfg.kind))
    else:
        info(f"{cfg.kind} drafter mask token id {mask.describe(tokenizer)}")
    drafter = build_drafter(verifier.head, cfg, mask and mask.token_id, mask and mask.rule, seed)
    info(layer_line(cfg, drafter.config))
    data = PromptResponseDataModule(
        corpus, pad_id=tokenizer.pad_token_id, max_len=tcfg.max_seq_len, batch_size=tcfg.batch_size,
        seed=seed, num_workers=tcfg.num_workers, features=features,
    )

    def make_module() -> BlockDistillModule:
        module = BlockDistillModule(drafter, verifier, cfg, tcfg, seed, val_rows=data.val_set.rows)
        modules.append(module)
        return module

    def after_save(paths: ArtifactPaths) -> None:
        write_tau_plot(modules[-1].history, paths.plots, cfg.kind)

    return DrafterRecipe(
        kind=cfg.kind, config=cfg, trainer_config=tcfg, drafter=drafter, data=data,
        make_module=make_module,
        evaluate=lambda model, teacher: evaluate_blocks(model, teacher, data.val_set, cfg, seed),
        agreement_keys=("top1_agreement", "position_top1_agreement", "simulated_acceptance_length",
                        "decode_tau", "decode_tau_no_prefill", "decode_acceptance"),
        per_position_key="position_top1_agreement",
        extra_info={
            "block_size": drafter.block_size,
            "target_layer_ids": drafter.config.target_layer_ids,
            "mask_mode": drafter.config.mask_mode,
            "mask_token_id": drafter.config.mask_token_id,
            "mask_rule": drafter.config.mask_rule,
            "markov_rank": drafter.config.markov_rank,
            "confidence_head": drafter.config.enable_confidence_head,
        },
        after_save=after_save,
    )


def layer_line(cfg: BlockFamilyConfig, config: DFlashConfig) -> str:
    """Which verifier layers feed the drafter, and whether a shallow verifier left fewer than asked for."""
    layer_ids, depth = config.target_layer_ids, config.num_target_layers
    line = f"verifier layers feeding the {cfg.kind} drafter: {layer_ids} of {depth}"
    if cfg.target_layer_ids is None and len(layer_ids) < cfg.num_feature_layers:
        line += (f" (num_feature_layers {cfg.num_feature_layers} collapsed to {len(layer_ids)} distinct layers "
                 f"on a {depth}-layer verifier)")
    return line


def write_tau_plot(history: list[dict], directory: Path, kind: str) -> None:
    """`train_<kind>_tau.csv` + `.png` (the plots its spec lists: pipeline/drafters/block/spec.py): simulated
    (teacher-forced) and decoded τ at every validation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    keys = ("simulated_acceptance_length", "decode_tau", "decode_tau_no_prefill")
    lines = ["step," + ",".join(keys)]
    lines += [f"{point['step']}," + ",".join(str(point.get(key, "")) for key in keys) for point in history]
    write_text_atomic(directory / f"train_{kind}_tau.csv", "\n".join(lines) + "\n")
    figure, axis = plt.subplots(figsize=(6, 4))
    labels = {"simulated_acceptance_length": "teacher-forced proxy (no bonus token)",
              "decode_tau": "greedy decode τ (prefill included)", "decode_tau_no_prefill": "greedy decode τ (no prefill)"}
    for key in keys:
        points = [(point["step"], point[key]) for point in history if key in point]
        if points:
            axis.plot(*zip(*points), marker="o", label=labels[key])
    axis.set(xlabel="training step", ylabel="tokens per verifier forward", title=f"{kind} drafter τ during training")
    if history:
        axis.legend(fontsize=7)
    save_figure_atomic(figure, directory / f"train_{kind}_tau.png")
    plt.close(figure)
