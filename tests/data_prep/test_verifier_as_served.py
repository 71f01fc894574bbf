"""The corpus and the decoding loops treat the verifier as it is served: prompts carry the special tokens
its tokenizer adds (a Llama BOS), and generation stops at every end id of its generation_config."""

from __future__ import annotations

import json

from data_prep.build_corpus import served_prompt_ids, work_items
from data_prep.continuation import generate_batch
from pipeline.config.corpus_config import CorpusConfig
from pipeline.drafters.speculative_loop import decode
from pipeline.integrity import stop_token_ids
from tests.support.tiny_models import tiny_llama, tiny_llama_tokenizer


def test_prompts_get_the_tokenizers_bos_and_keep_their_tail(tmp_path):
    tokenizer = tiny_llama_tokenizer()
    bos = tokenizer.bos_token_id
    path = tmp_path / "stories.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"The quick brown fox {i} jumps over the lazy dog {i}."}) + "\n"
                            for i in range(60)))
    config = CorpusConfig(sources=[{"kind": "file", "path": str(path), "domain": "stories"}], prompt_max_tokens=5)
    items = work_items(config, tokenizer)
    assert len(items) == 60 and {item.domain for item in items} == {"stories"}
    for item in items:
        assert item.prompt_ids[0] == bos and bos not in item.prompt_ids[1:] and len(item.prompt_ids) == 6
    text = "def add(a, b):\n    return a + b\n"
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert served_prompt_ids(tokenizer, text, 3) == [bos] + plain[-3:]


def test_generation_stops_at_every_end_id_of_the_generation_config():
    tokenizer = tiny_llama_tokenizer()
    verifier = tiny_llama(tokenizer)
    prompt = tokenizer("def add(a, b):")["input_ids"]
    free = decode(verifier, prompt, 12).new_ids
    end = free[4]  # make a token the verifier emits its end-of-turn id, as a chat checkpoint's config says
    verifier.generation_config.eos_token_id = [tokenizer.eos_token_id, end]
    stops = stop_token_ids(verifier.generation_config, tokenizer)
    assert stops == sorted({tokenizer.eos_token_id, end})
    stopped = decode(verifier, prompt, 12, eos_token_id=stops)
    assert stopped.finish_reason == "eos" and stopped.new_ids == free[: free.index(end) + 1]
    [batch] = generate_batch(verifier, [prompt], max_new_tokens=12, eos_token_id=stops, pad_token_id=0)
    assert batch.finish_reason == "eos" and batch.response_ids == stopped.new_ids
