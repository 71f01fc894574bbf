"""`train.block.mask`: `auto` always gives a servable mask id, on vocabularies with and without a spare
special token; `learned` is said to be unservable up front (params check, start of train_block)."""

from __future__ import annotations

import json

import pytest
import yaml
from datasets import Dataset

from pipeline.drafters.block import serving as block_serving
from pipeline.drafters.block.config import BlockDrafterConfig
from pipeline.drafters.block.mask import choose_mask, resolve_mask
from pipeline.drafters.block.model import build_drafter
from pipeline.drafters.block.serving import write_served_config
from pipeline.errors import DraftlineError
from pipeline.integrity import stop_token_ids
from tests.support.tiny_models import tiny_llama, tiny_llama_tokenizer, tiny_qwen3, tiny_tokenizer


@pytest.fixture(scope="module")
def llama():
    """A verifier whose vocabulary has nothing to spare: bos, eos, an end-of-turn id, then BPE tokens."""
    tokenizer = tiny_llama_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token  # what loading the verifier does when it has no pad token
    return tiny_llama(tokenizer), tokenizer


def corpus_of(rows: list[list[int]]) -> Dataset:
    return Dataset.from_list([{"prompt_ids": row[:2], "response_ids": row[2:]} for row in rows])


def test_full_vocabulary_gets_its_rarest_ordinary_id(llama):
    verifier, tokenizer = llama
    vocab = len(tokenizer)
    assert tokenizer.mask_token_id is None and tokenizer.unk_token_id is None
    # 3..6 never occur, every other id twice: the lowest of the rarest wins
    seen = [i for i in list(range(3, vocab)) * 2 if i not in (3, 4, 5, 6)]
    choice = resolve_mask("auto", verifier, tokenizer, corpus_of([seen, [0, 1, 2, 2, 1, 0]]), "block")
    assert choice.token_id == 3 and "rarest id in the training corpus, 0 occurrences" in choice.rule
    # the special ids are never chosen, however rare: bos, eos and the end-of-turn id of generation_config
    everything_but_specials = corpus_of([list(range(3, vocab)) * 2])
    assert resolve_mask("auto", verifier, tokenizer, everything_but_specials, "block").token_id not in (0, 1, 2)
    assert stop_token_ids(verifier.generation_config, tokenizer) == [1, 2]


def test_spare_special_ids_come_first():
    tokenizer = tiny_tokenizer()  # has <|mask|>
    assert choose_mask(tokenizer, len(tokenizer), [], corpus_of([])).rule == "the tokenizer's mask token"

    tokenizer = tiny_llama_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|reserved_special_token_0|>"]})
    reserved = tokenizer.convert_tokens_to_ids("<|reserved_special_token_0|>")
    choice = choose_mask(tokenizer, len(tokenizer), [], corpus_of([]))
    assert (choice.token_id, choice.rule) == (reserved, "a reserved special token")

    tokenizer = tiny_llama_tokenizer()
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    assert choose_mask(tokenizer, len(tokenizer), [], corpus_of([])).rule == "the pad token"
    # a pad that is the eos (the loader's fallback) is not spare
    tokenizer.pad_token = tokenizer.eos_token
    assert choose_mask(tokenizer, len(tokenizer), [], corpus_of([[5, 6, 7]])).rule.startswith("the rarest id")


def test_token_mode_without_a_mask_token_is_one_line(llama):
    verifier, tokenizer = llama
    with pytest.raises(DraftlineError, match="no mask token; set train.block.mask to 'auto'"):
        resolve_mask("token", verifier, tokenizer, corpus_of([]), "block")
    assert resolve_mask("learned", verifier, tokenizer, corpus_of([]), "block") is None


def test_auto_mask_drafter_is_servable_and_says_its_rule(llama, tmp_path):
    verifier, tokenizer = llama
    choice = resolve_mask("auto", verifier, tokenizer, corpus_of([list(range(3, 40))]), "block")
    drafter = build_drafter(verifier, BlockDrafterConfig(block_size=4, num_layers=1), choice.token_id, choice.rule)
    drafter.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    write_served_config(tmp_path)  # a learned mask would be refused here
    served = json.loads((tmp_path / "config.json").read_text())
    assert served["dflash_config"]["mask_token_id"] == choice.token_id and served["mask_rule"] == choice.rule
    markdown = block_serving.launch(served, "/models/llama", tmp_path, tmp_path).markdown
    assert f"mask token id {choice.token_id} ({choice.rule})" in markdown


def test_learned_mask_is_said_at_params_check(tmp_path, capsys):
    from pipeline.params_cmd import main

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"train": {"block": {"mask": "learned"}}}))
    assert main(["check", "--params", str(path)]) == 0
    assert "draftline: warning: train.block.mask is 'learned'" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"train": {"block": {"mask": "auto"}}}))
    assert main(["check", "--params", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_collapsed_feature_layers_are_said():
    from pipeline.drafters.block.training import layer_line

    cfg = BlockDrafterConfig(num_feature_layers=5)
    drafter = build_drafter(tiny_qwen3(320, num_layers=5), cfg, 1)
    line = layer_line(cfg, drafter.config)
    assert line.startswith("verifier layers feeding the block drafter: [1, 2] of 5")
    assert "num_feature_layers 5 collapsed to 2 distinct layers" in line
    deep = build_drafter(tiny_qwen3(320, num_layers=12), cfg, 1)
    assert "collapsed" not in layer_line(cfg, deep.config)
