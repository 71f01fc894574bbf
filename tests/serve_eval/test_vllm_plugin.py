"""draftline's vLLM plugin (serve_eval/vllm_plugin/): the dtype-preserving expand and its self-test, and the
reproduction of the CPU build's sampled-speculation defect run without and with the plugin."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import torch

from pipeline.serving_venv import serve_python

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "serve_eval" / "vllm_plugin"
REPRO = REPO / "serve_eval" / "repro" / "sampled_draft_eq_target.py"


def load_expand():
    """The plugin's torch module, from its file: the plugin is installed into the serving env, not here."""
    spec = importlib.util.spec_from_file_location("plugin_expand", PLUGIN / "draftline_vllm_plugin" / "expand.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


expand = load_expand()


def int64_copy_fallback(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """What vLLM 0.32's CPU fallback does: writes an int64 copy of a non-int64 output, never the output."""
    target = output if output.dtype == torch.int64 else output.to(torch.int64)
    expand.expand_kernel_impl(target, input_val.to(torch.int64), cu_num_tokens, replace_from, replace_to)


@pytest.mark.parametrize("dtype, values, expected", [
    (torch.float32, [0.8, 0.0, 1.3], [0.8, 0.8, 1.0, 1.3, 1.3, 1.3]),  # temperature: 0 (greedy) becomes 1
    (torch.int32, [50, 0, 7], [50, 50, 1, 7, 7, 7]),  # top_k
    (torch.int64, [5, 0, 9], [5, 5, 1, 9, 9, 9]),  # the dtype vLLM's C++ op handles
])
def test_expand_repeats_each_request_value_over_its_drafts_in_the_outputs_dtype(dtype, values, expected):
    cu = torch.tensor([2, 3, 6], dtype=torch.int32)
    output = torch.full((8,), -7, dtype=dtype)  # room past the last draft token stays untouched
    expand.expand_kernel_impl(output, torch.tensor(values, dtype=dtype), cu, 0, 1)
    assert output.tolist() == pytest.approx(expected + [-7, -7])


def test_expand_handles_requests_without_drafts_and_an_empty_batch():
    output = torch.full((3,), -1.0)
    expand.expand_kernel_impl(output, torch.tensor([0.5, 0.7, 0.9]), torch.tensor([0, 2, 2], dtype=torch.int32), 0, 1)
    assert output.tolist() == pytest.approx([0.7, 0.7, -1.0])
    empty = torch.full((2,), -1.0)
    expand.expand_kernel_impl(empty, torch.zeros(0), torch.zeros(0, dtype=torch.int32), 0, 1)
    assert empty.tolist() == [-1.0, -1.0]


def test_self_test_flags_a_fallback_that_drops_float_outputs_or_raises_and_passes_the_torch_one():
    assert expand.self_test(expand.expand_kernel_impl) is None
    assert "torch.float32 [0.8, 0.0] expanded to [-7.0, -7.0, -7.0]" in expand.self_test(int64_copy_fallback)

    def missing_op(*args, **kwargs):
        raise RuntimeError("No such operator _C::expand_kernel_impl")

    assert expand.self_test(missing_op) == "torch.float32 raised RuntimeError: No such operator _C::expand_kernel_impl"


def run_repro(python: Path, plugins: str | None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VLLM_PLUGINS")}
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins  # vLLM's own plugin filter: "" loads no general plugin
    return subprocess.run([str(python), "-I", str(REPRO)], env=env, capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.mark.slow
@pytest.mark.skipif(serve_python() is None, reason="no serving environment: run `make serve-env`")
def test_the_repro_finds_the_defect_without_the_plugin_and_every_draft_accepted_with_it():
    python = serve_python()
    installed = subprocess.run([str(python), "-I", "-c", "import draftline_vllm_plugin"], capture_output=True,
                               check=False)
    assert installed.returncode == 0, "the plugin is not installed in the serving env: run `make serve-env`"
    without = run_repro(python, "")
    assert without.returncode == 1, without.stdout + without.stderr[-3000:]
    assert "DEFECT" in without.stdout and "tau greedy 4.000" in without.stdout
    assert "draftline plugin" not in without.stdout + without.stderr
    with_plugin = run_repro(python, None)
    assert with_plugin.returncode == 0, with_plugin.stdout + with_plugin.stderr[-3000:]
    assert "tau greedy 4.000, T=0.8 4.000" in with_plugin.stdout
    # announced once per launch, although the main, engine-core and worker processes each load the plugin
    assert (with_plugin.stdout + with_plugin.stderr).count("draftline plugin: vLLM's CPU fallback") == 1
