"""`serve_check`: the exported drafters run in vLLM against no speculation."""

from __future__ import annotations

from pydantic import Field, StrictBool

from pipeline.config.section import Section, cross_check


class ServeCheckConfig(Section):
    """Stage `serve_check`: the exported drafters run in vLLM (the `make serve-env` environment)."""

    required: StrictBool = Field(True, description="promote refuses a drafter whose serve_check did not pass")
    prompts_per_domain: int = Field(8, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    max_tau_gap: float = Field(0.15, ge=0, description="largest relative gap served tau (vLLM, llama.cpp) vs draftline "
                               "tau that passes")
    concurrency: int = Field(8, ge=1, description="requests sharing vLLM's batches in the batched runs")
    max_batch_tau_gap: float = Field(0.05, ge=0, description="largest relative gap batched vs single-request served tau")
    sampled_z: float = Field(3.0, gt=0, description="T > 0: standard errors of the tau difference that pass")
    gate_sampled: StrictBool = Field(True, description="a T > 0 tau gap past sampled_z fails the drafter; "
                                     "false: it is recorded and warned about only")
    launch_command: StrictBool = Field(True, description="also serve each drafter with launch.md's command and "
                                       "OpenAI requests; it fails the drafter unless it passes and agrees with "
                                       "the in-process run")
    max_launch_tau_gap: float = Field(0.05, ge=0, description="largest relative greedy tau gap launch command vs "
                                      "in-process run (sampled: sampled_z standard errors)")
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU")
    enforce_eager: StrictBool = Field(True, description="skip vLLM's torch.compile warm-up (minutes on a small CPU)")
    engine_timeout_s: int = Field(1200, ge=30, description="wall-clock limit for one vLLM engine run")


@cross_check("serve_check", "train", "export")
def _room_for_a_draft(params) -> None:
    """With fewer than k+1 new tokens a request ends inside its first draft: vLLM's τ then reads ~1 and every
    drafter fails serve_check on a gap the drafter did not cause."""
    for kind in params.export.kinds:
        k = getattr(params.train, kind).draft_tokens  # as export serves it: num_speculative_tokens
        if params.serve_check.max_new_tokens < k + 1:
            raise ValueError(f"serve_check.max_new_tokens {params.serve_check.max_new_tokens} is less than one draft "
                             f"of the {kind} drafter plus its bonus token ({k} + 1); raise it (a few drafts: "
                             f"{4 * (k + 1)} or more)")
