"""`python -m train.dspark_bench` on a tiny project: every variant asked for is trained and decoded at T=0 and
at the evaluate temperatures, and the report holds each one's τ and speedup per temperature and domain."""

from __future__ import annotations

import json

import pytest

from tests.support.workspace import tiny_workspace
from train import dspark_bench


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tiny_workspace(tmp_path_factory.mktemp("dspark_bench"))
    section = {"num_layers": 1, "target_layer_ids": [0, 2], "trainer": {"batch_size": 2}}
    params = {"project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(root / "metrics"),
                          "plots_dir": str(root / "plots")},
              "train": {"block": section, "dspark": {**section, "markov_rank": 8}},
              "evaluate": {"temperatures": [0.0, 0.8]}}
    (root / "params.yaml").write_text(json.dumps(params))
    return root


def test_each_variant_is_measured_at_every_temperature_and_domain(project):
    argv = ["--params", str(project / "params.yaml"), "--variants", "dflash", "dspark_r16", "--steps", "2",
            "--prompts", "1", "--max-new-tokens", "6", "--passes", "2"]
    assert dspark_bench.main(argv) == 0
    report = json.loads((project / "metrics" / "bench_dspark_ablation.json").read_text())
    assert list(report["variants"]) == ["dflash", "dspark_r16"] and report["passes"] == 2
    for result in report["variants"].values():
        assert set(result["cells"]) == {"T=0.0/code", "T=0.0/text", "T=0.8/code", "T=0.8/text"}
        for cell in result["cells"].values():
            assert cell["tau"] >= 1.0 and cell["speedup"] > 0


def test_an_unknown_variant_is_one_line(project, capsys):
    assert dspark_bench.main(["--params", str(project / "params.yaml"), "--variants", "dspark_r3"]) == 1
    err = capsys.readouterr().err
    assert "unknown variant(s) dspark_r3; choose from dflash, dspark_default" in err and "Traceback" not in err


def test_no_passes_is_one_line(project, capsys):
    assert dspark_bench.main(["--params", str(project / "params.yaml"), "--variants", "dflash", "--passes", "0"]) == 1
    err = capsys.readouterr().err
    assert "--passes 0: decode the prompts at least once" in err and "Traceback" not in err


def test_every_variant_is_a_valid_section_and_the_lr_variants_set_their_rate():
    """Each variant's overrides validate against the section it starts from, so none fails hours into a run; the
    loss variants keep the learning rate they were measured with (2e-3) as the default moved to 6e-3."""
    from pipeline.config.schema import parse_all
    from train.block_bench import merged

    train = parse_all({}).train
    sections = {name: merged(getattr(train, section), overrides)
                for name, (section, _, overrides) in dspark_bench.VARIANTS.items()}
    assert train.dspark.trainer.learning_rate == 6e-3 == sections["dspark_default"].trainer.learning_rate
    assert {name: sections[name].trainer.learning_rate for name in ("dspark_ce010", "dspark_fkl_t08", "dspark_lr3e3",
                                                                     "dspark_lr6e3")} == \
        {"dspark_ce010": 2e-3, "dspark_fkl_t08": 2e-3, "dspark_lr3e3": 3e-3, "dspark_lr6e3": 6e-3}
    assert (sections["dspark_fkl_t08"].loss.ce, sections["dspark_fkl_t08"].loss.temperature) == (0.0, 0.8)
    # DSpark's depth moved from the block kind's two layers to one; every variant measured before keeps two
    assert train.dspark.num_layers == 1 == sections["dspark_default"].num_layers
    assert all(sections[name].num_layers == 2 for name, (section, _, _) in dspark_bench.VARIANTS.items()
               if section == "dspark" and name != "dspark_default")
