"""GGUF for llama.cpp: every kind's tiny export (and the DSpark variant) converted by the pinned converter, read
back with the pinned gguf-py: the verifier layers each drafter reads are the ones it was trained on (DFlash
numbers them +1 in GGUF, EAGLE-3 as given), Q8_0 is quantized, launch.md's llama-server line names the files,
and a tokenizer the converter does not know fails with one line naming the key to set."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from export import gguf_files
from export.export import export_serving
from export.launch_files import LAUNCH_NAME
from pipeline.config.export_config import GgufConfig
from pipeline.drafters.kinds import KINDS
from pipeline.errors import DraftlineError
from pipeline.serving_venv import llamacpp_python
from tests.support.workspace import tiny_workspace

pytestmark = pytest.mark.skipif(llamacpp_python() is None,
                                reason="no .venv-llamacpp with llama.cpp's converter: `make serve-env` builds it")

# The verifier `output_hidden_states` indices a trained checkpoint's config says the drafter reads (the code
# that reads them: block `fuse_target_hidden` takes hidden_states[id + 1], eagle3 `aux_hidden` hidden_states[id]);
# None: a plain causal LM, which reads no verifier layer.
TRAINED_HIDDEN_STATES = {
    "ar": lambda config: None,
    "block": lambda config: [i + 1 for i in config["dflash_config"]["target_layer_ids"]],
    "dspark": lambda config: [i + 1 for i in config["dflash_config"]["target_layer_ids"]],
    "eagle3": lambda config: list(config["eagle_aux_hidden_state_layer_ids"]),
}
ARCHITECTURE = {"ar": "qwen3", "block": "dflash", "dspark": "dflash", "eagle3": "eagle3"}
SPEC_TYPE = {"ar": "draft-simple", "block": "draft-dflash", "dspark": "draft-dspark", "eagle3": "draft-eagle3"}
READ_FIELDS = """
import json, sys
import gguf
reader = gguf.GGUFReader(sys.argv[1])
fields = {}
for name, field in reader.fields.items():
    if not name.startswith("tokenizer.ggml.") or name == "tokenizer.ggml.pre":
        value = field.contents()
        fields[name] = value if isinstance(value, (int, float, str, list)) else str(value)
fields["tensors"] = {t.name: t.tensor_type.name for t in reader.tensors}
print(json.dumps(fields))
"""


def gguf_fields(path: Path) -> dict:
    """The GGUF's metadata (tokenizer arrays left out) and {tensor: type}, read by the pinned gguf-py."""
    result = subprocess.run([str(llamacpp_python()), "-I", "-c", READ_FIELDS, str(path)], capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """{kind: its export dir}, GGUF files written; the verifier GGUF beside them."""
    root = tiny_workspace(tmp_path_factory.mktemp("gguf"))
    artifacts = root / "artifacts"
    verifier_dir = artifacts / "verifier"
    tokenizer = AutoTokenizer.from_pretrained(verifier_dir)
    config = GgufConfig()
    gguf_files.convert_verifier(verifier_dir, artifacts / "export", config)
    dirs = {}
    for name, kind in KINDS.items():
        out = artifacts / "export" / name
        out.mkdir(parents=True)
        export_serving(kind, artifacts / "drafters" / name, out, out, str(verifier_dir), tokenizer, artifacts)
        gguf_files.convert_drafter(name, out / "serving", out, verifier_dir, config)
        dirs[name] = out
    return dirs


def test_every_kind_converts_in_f32_and_q8_0(exports):
    assert set(exports) == set(KINDS)
    for name, out in exports.items():
        f32 = gguf_fields(out / gguf_files.drafter_gguf(name, "f32"))
        q8 = gguf_fields(out / gguf_files.drafter_gguf(name, "q8_0"))
        assert f32["general.architecture"] == q8["general.architecture"] == ARCHITECTURE[name], name
        assert set(f32["tensors"].values()) <= {"F32", "I64"}, name  # I64: eagle3's d2t index map
        assert "Q8_0" in q8["tensors"].values(), name
        assert f32["tokenizer.ggml.pre"] == "gpt-2", name  # the demo-style tokenizer, recognised without a knob
    dspark = gguf_fields(exports["dspark"] / gguf_files.drafter_gguf("dspark"))
    assert any("markov" in tensor for tensor in dspark["tensors"]), "the DSpark Markov head was dropped"


def test_gguf_layer_ids_are_the_trained_ones(exports):
    """DFlash's target_layer_ids are stored +1, EAGLE-3's aux ids as given: both as hidden-state indices."""
    assert set(TRAINED_HIDDEN_STATES) == set(KINDS), "a registered kind has no expectation here"
    for name, out in exports.items():
        trained = json.loads((out.parents[1] / "drafters" / name / "config.json").read_text())
        fields = gguf_fields(out / gguf_files.drafter_gguf(name))
        expected = TRAINED_HIDDEN_STATES[name](trained)
        assert fields.get(f"{fields['general.architecture']}.target_layers") == expected, name
    block = json.loads((exports["block"].parents[1] / "drafters" / "block" / "config.json").read_text())
    assert block["dflash_config"]["target_layer_ids"] == [0, 3]  # so the +1 above is not vacuous


def test_manifest_ready_verifier_gguf_and_launch_line(exports):
    verifier_gguf = next(iter(exports.values())).parent / gguf_files.VERIFIER_GGUF
    assert gguf_fields(verifier_gguf)["general.architecture"] == "qwen3"
    for name, out in exports.items():
        launch = (out / LAUNCH_NAME).read_text()
        line = next(line for line in launch.splitlines() if line.startswith("llama-server "))
        argv = shlex.split(line)
        assert argv[argv.index("-m") + 1] == str(verifier_gguf.resolve())
        assert Path(argv[argv.index("-md") + 1]) == (out / gguf_files.drafter_gguf(name)).resolve()
        assert Path(argv[argv.index("-md") + 1]).is_file()
        assert argv[argv.index("--spec-type") + 1] == SPEC_TYPE[name]
        k = json.loads((out / "vllm.json").read_text())["speculative_config"]["num_speculative_tokens"]
        assert argv[argv.index("--spec-draft-n-max") + 1] == str(k)


def _unknown_tokenizer_verifier(exports, tmp_path) -> Path:
    """The tiny verifier with a pre-tokenizer that is not GPT-2's regex (a prefix space added)."""
    verifier = tmp_path / "verifier"
    shutil.copytree(next(iter(exports.values())).parents[1] / "verifier", verifier)
    path = verifier / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["pre_tokenizer"]["add_prefix_space"] = True
    path.write_text(json.dumps(tokenizer))
    return verifier


def test_unknown_tokenizer_fails_naming_the_key_and_the_key_fixes_it(exports, tmp_path):
    verifier = _unknown_tokenizer_verifier(exports, tmp_path)
    with pytest.raises(DraftlineError, match=r"set export\.gguf\.pre_tokenizer in params\.yaml") as error:
        gguf_files.convert_verifier(verifier, tmp_path / "export", GgufConfig())
    assert "\n" not in str(error.value)
    assert not (tmp_path / "export" / gguf_files.VERIFIER_GGUF).exists()
    with pytest.raises(DraftlineError, match=r"export\.gguf\.pre_tokenizer: 'gpt2' is not a pre-tokenizer"):
        gguf_files.convert_verifier(verifier, tmp_path / "export", GgufConfig(pre_tokenizer="gpt2"))
    record = gguf_files.convert_verifier(verifier, tmp_path / "export", GgufConfig(pre_tokenizer="llama-bpe"))
    assert gguf_fields(tmp_path / "export" / gguf_files.VERIFIER_GGUF)["tokenizer.ggml.pre"] == "llama-bpe"
    assert len(record["sha256"]) == 64


def test_a_conversion_failing_beside_the_onnx_export_fails_the_stage_and_writes_no_export(tmp_path, monkeypatch,
                                                                                          capsys):
    """The stage converts a drafter to GGUF while it traces the drafter's ONNX graph: a converter that fails there
    still fails the stage with its one line, and that kind's export dir is never written."""
    import yaml

    from export.export import main

    root = tiny_workspace(tmp_path)
    monkeypatch.setattr(gguf_files, "DRAFT_TYPES", (*gguf_files.DRAFT_TYPES, "no_such_type"))
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(tmp_path / "metrics"),
                    "plots_dir": str(tmp_path / "plots")},
        "export": {"kinds": ["ar"], "tensorrt": "off", "parity_prompts": 1, "parity_steps": 2}}))
    assert main(["--params", str(params)]) == 1
    stderr = capsys.readouterr().err
    error = stderr.strip().splitlines()[-1]  # the lines above it are the ONNX exporter's torchvision warnings
    assert "Traceback" not in stderr and "llama.cpp's converter failed" in error and "no_such_type" in error
    assert (root / "artifacts" / "export" / gguf_files.VERIFIER_GGUF).is_file()  # converted before the drafters
    assert not (root / "artifacts" / "export" / "ar").exists()
