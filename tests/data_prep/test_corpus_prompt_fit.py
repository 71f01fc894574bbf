"""build_corpus fits prompts to the verifier: a prompt plus `max_new_tokens` must fit the verifier's
positions (cut further than `prompt_max_tokens`, counted in the summary), and the summary says when the
verifier never ended a response on one of its end ids."""

import json

import pytest

from data_prep.build_corpus import PromptFit, end_id_summary, fit_summary, verifier_positions, work_items
from pipeline.config.corpus_config import CorpusConfig
from pipeline.errors import DraftlineError
from tests.support.tiny_models import tiny_llama_tokenizer


def test_a_long_prompt_is_cut_to_the_verifiers_positions_and_counted(tmp_path):
    tokenizer = tiny_llama_tokenizer()
    path = tmp_path / "long.jsonl"
    short = [{"prompt": f"A short prompt number {index}."} for index in range(30)]  # every split gets some
    long = {"prompt": "The quick brown fox jumps over the lazy dog. " * 700}  # 31,500 characters
    path.write_text("".join(json.dumps(record) + "\n" for record in [long, *short]))
    config = CorpusConfig(sources=[{"kind": "file", "path": str(path), "domain": "text"}],
                          prompt_max_tokens=100_000, max_new_tokens=64)
    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    fit = PromptFit.for_verifier(config, verifier_positions(str(tmp_path / "verifier")))
    items = work_items(config, tokenizer, fit)
    assert max(len(item.prompt_ids) for item in items) + config.max_new_tokens <= 512
    assert (fit.cut, fit.dropped) == (1, 0)
    assert fit_summary(fit, config) == {"prompts cut to fit 512 positions": "1 (to at most 448 tokens, not "
                                                                            "corpus.prompt_max_tokens=100000)",
                                        "prompts left out (too long even cut)": 0}


def test_no_room_for_a_prompt_is_one_line():
    with pytest.raises(DraftlineError, match="max_new_tokens=600 leaves no room for a prompt in the verifier's 512"):
        PromptFit.for_verifier(CorpusConfig(max_new_tokens=600), 512)


def test_a_verifier_that_never_ends_on_an_end_id_is_said_in_the_summary():
    assert "0 of 450" in end_id_summary({"finish_reasons": {"length": 450}}, 450)["responses ending on an end id"]
    assert end_id_summary({"finish_reasons": {"eos": 3, "length": 447}}, 450) == {}
