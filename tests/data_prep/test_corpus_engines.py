"""corpus.engine: hf | vllm | openai.

Fast tests run the client, the server lifecycle and the stage against a fake OpenAI-compatible
server (this module, run as `python -m tests.data_prep.test_corpus_engines --port N --model DIR`), so CI
without the serving environment still covers them. The slow tests start the real `vllm serve` from
`.venv-serve` (skipped where it does not exist): one start for `engine: vllm`, two for the
kill-the-server test of `engine: openai`.
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from data_prep import build_corpus
from data_prep.build_corpus import chat_prompt_ids, roundtrip_mismatches, work_items
from data_prep.corpus import COLUMNS, load_corpus
from data_prep.engines import Request, openai_client
from data_prep.engines.openai_client import EndpointDown, OpenAIEngine
from data_prep.engines.vllm_server import serve_command, vllm_server
from pipeline.config.corpus_config import CorpusConfig
from pipeline.config.sampling_config import SamplingConfig
from pipeline.config.schema import load_all
from pipeline.config.vllm_config import VllmConfig
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.serving_venv import serve_python
from pipeline.verifier_record import write_record
from tests.support.tiny_models import tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


# --------------------------------------------------------------------------- fake OpenAI server


def fake_continuation(prompt_ids: list[int], max_tokens: int, temperature: float, seed: int, eos: int) -> list[int]:
    """A deterministic stand-in for a model: sampled rows depend on the seed, a third stop at EOS."""
    key = json.dumps([prompt_ids, seed if temperature > 0 else None]).encode()
    rng = random.Random(hashlib.sha256(key).hexdigest())
    ids = [rng.randrange(3, 300) for _ in range(max_tokens)]
    return ids[:2] + [eos] if sum(prompt_ids) % 3 == 0 and max_tokens > 3 else ids


class FakeState:
    def __init__(self, tokenizer, delay: float = 0.0, fail_first: int = 0, status: int = 503):
        self.tokenizer, self.delay, self.fail_first, self.status = tokenizer, delay, fail_first, status
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = self.served = 0
        self.bodies: list[tuple[str, dict]] = []
        self.poison = None  # (reply body) -> what a broken server sends instead
        self.poison_first = 0  # how many replies get poisoned (then the server is fine again)
        self.retry_after: str | None = None  # Retry-After header sent with the failures
        self.request_times: list[float] = []


def fake_handler(state: FakeState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, code: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            routes = {"/health": {}, "/version": {"version": "fake-1"},
                      "/v1/models": {"data": [{"id": "verifier"}]},
                      "/stats": {"max_in_flight": state.max_in_flight, "served": state.served,
                                 "pythonpath": os.environ.get("PYTHONPATH")}}
            self.reply(200, routes[self.path]) if self.path in routes else self.reply(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.reply(404, {})  # e.g. no /tokenize, like servers other than vLLM
            with state.lock:
                state.bodies.append((self.path, body))
                state.request_times.append(time.monotonic())
                if state.fail_first > 0:
                    state.fail_first -= 1
                    headers = {"Retry-After": state.retry_after} if state.retry_after is not None else None
                    return self.reply(state.status, {"error": {"message": "try later"}}, headers)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            time.sleep(state.delay)
            tokenizer = state.tokenizer
            if self.path == "/v1/chat/completions":
                prompt = chat_prompt_ids(tokenizer, body["messages"][0]["content"])
            else:
                prompt = body["prompt"]
            ids = fake_continuation(prompt, body["max_tokens"], body["temperature"], body["seed"], tokenizer.eos_token_id)
            choice = {"index": 0, "token_ids": ids, "finish_reason": "stop" if ids[-1] == tokenizer.eos_token_id else "length"}
            text = tokenizer.decode(ids, skip_special_tokens=True)
            choice.update({"message": {"role": "assistant", "content": text}} if "chat" in self.path else {"text": text})
            reply = {"choices": [choice], "prompt_token_ids": prompt}
            with state.lock:
                state.in_flight -= 1
                state.served += 1
                if state.poison is not None and state.poison_first > 0:
                    state.poison_first -= 1
                    reply = state.poison(reply)
            self.reply(200, reply)

    return Handler


def start_fake(tokenizer, **kwargs) -> tuple[str, FakeState, ThreadingHTTPServer]:
    state = FakeState(tokenizer, **kwargs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1", state, server


def fake_serve_python(tmp_path: Path) -> Path:
    """A stand-in for .venv-serve/bin/python: `-m vllm...api_server --model M --port P` runs the fake."""
    script = tmp_path / "fake-serve-python"
    script.write_text(f"#!/bin/sh\nshift 2\ncd {REPO}\nexec {sys.executable} -m tests.data_prep.test_corpus_engines \"$@\"\n")
    script.chmod(0o755)
    return script


def main(argv: list[str]) -> None:
    """The fake server as a process (what fake_serve_python runs)."""
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args(argv)
    if os.environ.get("FAKE_PID_FILE"):
        Path(os.environ["FAKE_PID_FILE"]).write_text(str(os.getpid()))
    state = FakeState(AutoTokenizer.from_pretrained(args.model), delay=float(os.environ.get("FAKE_DELAY", "0")))
    ThreadingHTTPServer(("127.0.0.1", args.port), fake_handler(state)).serve_forever()


# --------------------------------------------------------------------------- helpers


def chat_tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_verifier(directory: Path, tokenizer, *, layers: int = 2) -> None:
    """A tiny Qwen3 that vLLM's CPU attention accepts (head_dim 32), with the given tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    Qwen3ForCausalLM(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    write_record(directory, source="bootstrap", name_or_path=str(directory), id_prefix="tiny")


def make_project(root: Path, *, prompts: int = 12, chat: int = 4, shard_size: int = 4, max_new_tokens: int = 8,
                 temperature: float = 0.0, **corpus) -> Path:
    """Code prompts from a JSONL file plus `chat` MT-Bench-style chat prompts; a tiny verifier with a template."""
    code = [{"prompt": f"def function_{i}(x):\n    return x * {i} +"} for i in range(prompts)]
    turns = [{"turns": [f"Explain step {i} of the quick brown fox.", "And then?"]} for i in range(chat)]
    (root / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in code))
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in turns))
    save_verifier(root / "artifacts" / "verifier", chat_tokenizer())
    sources = [{"kind": "file", "path": str(root / "code.jsonl"), "domain": "code"}]
    if chat:
        sources.append({"kind": "file", "path": str(root / "chat.jsonl"), "prompt_field": "turns.0",
                        "domain": "text", "chat": True})
    params = {
        "project": {"artifacts_dir": str(root / "artifacts")},
        "corpus": {"sources": sources, "max_prompts_per_domain": {"code": prompts, "text": max(chat, 1)},
                   "max_new_tokens": max_new_tokens, "shard_size": shard_size,
                   "sampling": {"temperature": temperature, "top_k": 0, "top_p": 1.0},
                   "split": {"validation": 0.2, "test": 0.2}, **corpus},
    }
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def all_rows(params: Path) -> list[dict]:
    corpus = load_corpus(ArtifactPaths.from_params(load_all(params)))
    return [row for split in corpus for row in corpus[split].to_list()]


def stats_of(params: Path) -> dict:
    return json.loads((ArtifactPaths.from_params(load_all(params)).corpus / "stats.json").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; only its parent has not reaped it yet
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split(")")[-1].split()[0] != "Z"


def wait_gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def vllm_processes() -> list[str]:
    """Every vLLM server process on the machine started from this test's serve env (by command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "vllm.entrypoints.openai.api_server" in cmdline and "--served-model-name verifier" in cmdline:
                found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def stage(params: Path, **env) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "data_prep.build_corpus", "--params", str(params)], cwd=REPO,
                            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --------------------------------------------------------------------------- config and command line


def test_config_validates_engine_settings():
    with pytest.raises(ValueError, match="corpus.endpoints is empty"):
        CorpusConfig(engine="openai")
    with pytest.raises(ValueError, match="not an http"):
        CorpusConfig(engine="openai", endpoints=["node1:8000"])
    with pytest.raises(ValueError):
        CorpusConfig(engine="sglang")
    assert CorpusConfig().engine == "hf"


def test_serve_command_carries_the_engine_arguments():
    config = VllmConfig(tensor_parallel_size=4, data_parallel_size=2, max_model_len=4096,
                        gpu_memory_utilization=0.8, extra_args=["--enable-prefix-caching"])
    command = serve_command(Path("/env/bin/python"), "/models/v", config, dtype="bfloat16", port=1234)
    line = " ".join(command)
    for expected in ("-m vllm.entrypoints.openai.api_server --model /models/v", "--host 127.0.0.1 --port 1234",
                     "--tensor-parallel-size 4", "--data-parallel-size 2", "--max-model-len 4096",
                     "--gpu-memory-utilization 0.8", "--dtype bfloat16", "--generation-config vllm"):
        assert expected in line
    assert command[-1] == "--enable-prefix-caching" and "--no-enable-chunked-prefill" not in command
    # on CPU, seeded sampling needs unchunked prefill (vLLM's CPU generators cannot rewind)
    assert "--no-enable-chunked-prefill" in serve_command(Path("p"), "m", config, dtype="float32", port=1, cpu=True)


def test_runtime_settings_do_not_invalidate_finished_shards():
    base = CorpusConfig(engine="openai", endpoints=["http://a:1/v1"])
    moved = CorpusConfig(engine="openai", endpoints=["http://b:2/v1", "http://c:3/v1"], concurrency=3, retries=9)
    assert build_corpus.fingerprint("h", base, []) == build_corpus.fingerprint("h", moved, [])
    assert build_corpus.fingerprint("h", base, []) != build_corpus.fingerprint("h", CorpusConfig(), [])


# --------------------------------------------------------------------------- openai client


def test_requests_spread_over_endpoints_with_bounded_in_flight():
    tokenizer = tiny_tokenizer()
    servers = [start_fake(tokenizer, delay=0.05) for _ in range(2)]
    try:
        config = CorpusConfig(engine="openai", endpoints=[url for url, _, _ in servers], concurrency=2)
        # 5: an end-of-turn id from the verifier's generation_config, which the server must be told about
        engine = OpenAIEngine(config.endpoints, tokenizer, config, name="openai", stop_ids=[5])
        sampling = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
        requests = [Request((i + 1, 7, 9), sampling, 6, seed=100 + i) for i in range(16)]
        done = []
        results = engine.generate(requests, done.append)
    finally:
        for _, _, server in servers:
            server.shutdown()
    assert sum(done) == 16
    for request, result in zip(requests, results):  # in order, token ids exactly as served
        expected = fake_continuation(list(request.prompt_ids), 6, 0.7, request.seed, tokenizer.eos_token_id)
        assert result.response_ids == expected and result.prompt_ids == list(request.prompt_ids)
        assert result.finish_reason == ("eos" if expected[-1] == tokenizer.eos_token_id else "length")
    states = [state for _, state, _ in servers]
    assert all(1 <= state.max_in_flight <= 2 for state in states)
    assert all(state.served > 0 for state in states) and sum(s.served for s in states) == 16
    path, body = states[0].bodies[0]  # each request carries its own sampling params and seed
    assert path == "/v1/completions" and body["return_token_ids"] is True
    assert (body["temperature"], body["top_k"], body["top_p"]) == (0.7, 5, 0.9) and body["seed"] >= 100
    assert body["stop_token_ids"] == sorted({5, tokenizer.eos_token_id})
    assert engine.describe()["version"] == "fake-1"


def test_retries_with_backoff_then_a_clear_error_naming_the_endpoint(monkeypatch):
    monkeypatch.setattr(openai_client, "BACKOFF_S", 0.01)
    tokenizer = tiny_tokenizer()
    url, state, server = start_fake(tokenizer)
    try:
        config = CorpusConfig(engine="openai", endpoints=[url], retries=2)
        engine = OpenAIEngine([url], tokenizer, config, name="openai")
        state.fail_first = 2  # two 503s, then the third attempt succeeds
        [result] = engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
        assert len(result.response_ids) >= 3
        state.fail_first, state.status = 1, 400  # a rejected request is not retried
        with pytest.raises(DraftlineError, match=f"endpoint {url} rejected /completions .HTTP 400: try later"):
            engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(EndpointDown, match=f"endpoint {url} is down .*3 attempts") as error:
        engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("retry_after", ["1.5", "http-date"])
def test_a_429_waits_as_long_as_the_server_asks(monkeypatch, retry_after):
    monkeypatch.setattr(openai_client, "BACKOFF_S", 0.01)
    tokenizer = tiny_tokenizer()
    url, state, server = start_fake(tokenizer, fail_first=1, status=429)
    # an HTTP date has whole seconds: ask for 3 s from now, which is at least 2 s away
    state.retry_after = email.utils.formatdate(time.time() + 3, usegmt=True) if retry_after == "http-date" else retry_after
    try:
        engine = OpenAIEngine([url], tokenizer, CorpusConfig(engine="openai", endpoints=[url], retries=2), name="openai")
        [result] = engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
    finally:
        server.shutdown()
        server.server_close()
    assert result.response_ids
    first, second = state.request_times
    assert second - first >= (1.5 if retry_after == "1.5" else 2.0)  # not the 0.01 s backoff


def _with_ids(ids):
    def poison(reply):
        reply["choices"][0]["token_ids"] = ids
        return reply
    return poison


def _with_prompt(reply):
    reply["prompt_token_ids"] = [7, 7, 7]
    return reply


@pytest.mark.parametrize("poison, expected", [
    (_with_ids([5, 10**6]), "outside the verifier's vocabulary"),
    (_with_ids([-3, 5]), "outside the verifier's vocabulary"),
    (_with_ids(["5", 6]), "not a list of integer token ids"),
    (_with_ids([5] * 50), "50 tokens for max_tokens 4"),
    (_with_prompt, "prompt_token_ids differ from the prompt ids sent"),
    (lambda reply: [reply], "expected a JSON object"),
])
def test_invalid_responses_are_retried_then_refused(monkeypatch, poison, expected):
    """A server answering nonsense is retried like a failing one, and its answer never comes back."""
    monkeypatch.setattr(openai_client, "BACKOFF_S", 0.01)
    tokenizer = tiny_tokenizer()
    url, state, server = start_fake(tokenizer)
    try:
        engine = OpenAIEngine([url], tokenizer, CorpusConfig(engine="openai", endpoints=[url], retries=2),
                              name="openai")
        state.poison, state.poison_first = poison, 2  # two bad answers, then a good one
        [result] = engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
        assert result.prompt_ids == [5, 6] and all(0 <= i < len(tokenizer) for i in result.response_ids)
        state.poison_first = 10
        with pytest.raises(DraftlineError, match=f"{url} answered /completions with 3 invalid response") as error:
            engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
        assert expected in str(error.value) and "\n" not in str(error.value)
    finally:
        server.shutdown()


def test_text_spelling_a_special_token_is_retokenised_as_text(monkeypatch):
    """A server that returns only text has stripped special tokens from it (skip_special_tokens defaults to
    true): `<|endoftext|>` in that text was written with ordinary tokens and must not become the EOS id."""
    tokenizer = tiny_tokenizer()
    url, state, server = start_fake(tokenizer)

    def text_only(reply):
        choice = reply["choices"][0]
        del choice["token_ids"]
        choice.update(text=f"a{tokenizer.eos_token}b", finish_reason="length")
        return reply
    try:
        engine = OpenAIEngine([url], tokenizer, CorpusConfig(engine="openai", endpoints=[url]), name="openai")
        state.poison, state.poison_first = text_only, 1
        [result] = engine.generate([Request((5, 6), SamplingConfig(), 30, 0)], lambda n: None)
    finally:
        server.shutdown()
    assert result.retokenized and tokenizer.eos_token_id not in result.response_ids
    assert tokenizer.decode(result.response_ids) == f"a{tokenizer.eos_token}b"


def test_a_bad_server_never_commits_a_shard_and_a_poisoned_shard_is_regenerated(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(openai_client, "BACKOFF_S", 0.01)
    url, state, server = start_fake(chat_tokenizer())
    try:
        params = make_project(tmp_path, engine="openai", endpoints=[url], retries=1)
        state.poison, state.poison_first = _with_ids([5, 10**6]), 10**6
        assert build_corpus.main(["--params", str(params)]) == 1
        assert "invalid response" in capsys.readouterr().err
        shard_root = tmp_path / "artifacts" / "corpus_shards"
        assert not list(shard_root.rglob("shard-*.json"))  # nothing from the bad server was committed

        state.poison_first = 0  # the server is fixed
        assert build_corpus.main(["--params", str(params)]) == 0
        reference = all_rows(params)
        shard = sorted(shard_root.rglob("shard-*.json"))[0]
        committed = json.loads(shard.read_text())
        committed["rows"][0]["response_ids"][0] = 10**6  # poisoned after the fact
        shard.write_text(json.dumps(committed))
        assert build_corpus.main(["--params", str(params)]) == 0
        assert "damaged or stale" in " ".join(capsys.readouterr().err.split())
        assert all_rows(params) == reference
    finally:
        server.shutdown()


def test_a_trickling_server_is_cut_off_at_the_request_deadline():
    """One byte every 0.3 s never trips a per-read socket timeout; the deadline covers the whole request."""
    import socket as sockets

    listener = sockets.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
                if stop.wait(0.3):
                    return
                connection.sendall(bytes([byte]))

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="no complete answer within 2 s"):
            openai_client.http_json(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/models", None, 2.0)
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - started < 5


def test_endpoint_credentials_are_sent_as_basic_auth_and_never_echoed(monkeypatch):
    monkeypatch.setattr(openai_client, "BACKOFF_S", 0.01)
    tokenizer = tiny_tokenizer()
    url, state, server = start_fake(tokenizer)
    secret_url = url.replace("http://", "http://user:s3cret@")
    try:
        engine = OpenAIEngine([secret_url], tokenizer, CorpusConfig(engine="openai", endpoints=[secret_url],
                                                                    retries=0), name="openai")
        assert "s3cret" not in json.dumps(engine.describe())  # recorded in shards and stats.json
        state.fail_first, state.status = 1, 400
        with pytest.raises(DraftlineError) as error:
            engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
        assert "s3cret" not in str(error.value) and "***@127.0.0.1" in str(error.value)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(EndpointDown) as error:
        engine.generate([Request((5, 6), SamplingConfig(), 4, 0)], lambda n: None)
    assert "s3cret" not in str(error.value)


# --------------------------------------------------------------------------- chat and token exactness


def test_chat_prompts_are_sent_as_messages_and_stored_as_templated_ids(tmp_path):
    tokenizer = chat_tokenizer()
    params = load_all(make_project(tmp_path, prompts=3, chat=3))
    items = work_items(params.corpus, tokenizer)
    chat_items = [item for item in items if item.chat_text is not None]
    assert len(chat_items) == 3 and all(item.domain == "text" for item in chat_items)
    for item in chat_items:  # the ids the verifier conditions on are the templated ids
        assert list(item.prompt_ids) == tokenizer.apply_chat_template(
            [{"role": "user", "content": item.chat_text}], add_generation_prompt=True, tokenize=True, return_dict=False)
        assert item.prompt.startswith("<|user|>\n") and item.prompt.endswith("<|assistant|>\n")
    plain = [item for item in items if item.chat_text is None]
    assert all(not item.prompt.startswith("<|user|>") for item in plain)

    url, state, server = start_fake(tokenizer)
    try:
        config = CorpusConfig(engine="openai", endpoints=[url])
        engine = OpenAIEngine([url], tokenizer, config, name="openai")
        requests = [Request(item.prompt_ids, SamplingConfig(), 5, item.seed, item.chat_text) for item in items]
        results = engine.generate(requests, lambda n: None)
    finally:
        server.shutdown()
    paths = {body.get("messages", [{}])[0].get("content"): path for path, body in state.bodies}
    for item, result in zip(items, results):
        assert result.prompt_ids == list(item.prompt_ids)  # the server's templated ids, equal to ours
        assert paths.get(item.chat_text, "/v1/completions") == (
            "/v1/chat/completions" if item.chat_text else "/v1/completions")


@pytest.mark.parametrize("template, expected", [
    ("{% for a in range(100000) %}{% for b in range(100) %}{% endfor %}{% endfor %}", "did not render within"),
    ("{% for a in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "renders over 1000000 characters"),
    ("{{ messages.__class__.__mro__ }}", "fails to render"),
])
def test_a_hostile_chat_template_is_one_line_not_a_hang(monkeypatch, template, expected):
    monkeypatch.setattr(build_corpus, "CHAT_TEMPLATE_TIMEOUT_S", 0.2)  # the loop below takes seconds
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = template
    started = time.monotonic()
    with pytest.raises(DraftlineError, match=expected) as error:
        chat_prompt_ids(tokenizer, "hello")
    assert time.monotonic() - started < 10 and "\n" not in str(error.value)


def test_roundtrip_mismatches_count_ids_that_text_would_not_give_back():
    tokenizer = tiny_tokenizer()
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    # a learned merge (one token for several characters) and the same characters as separate tokens
    word = next(word for word in (" quick", "import", " the") if len(encode(word)) == 1)
    merged, split = encode(word), [encode(character)[0] for character in word]
    rows = [{"response_ids": merged + [tokenizer.eos_token_id]}, {"response_ids": split}]
    assert roundtrip_mismatches(tokenizer, rows) == 1


# --------------------------------------------------------------------------- engine vllm lifecycle (fake server)


def test_engine_vllm_builds_the_corpus_and_stops_its_server(tmp_path, monkeypatch, capsys):
    params = make_project(tmp_path, prompts=6, chat=2, shard_size=4, engine="vllm")
    pid_file = tmp_path / "server.pid"
    monkeypatch.setenv("DRAFTLINE_SERVE_PYTHON", str(fake_serve_python(tmp_path)))
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    assert build_corpus.main(["--params", str(params)]) == 0
    rows = all_rows(params)
    assert len(rows) == 8 and len({row["id"] for row in rows}) == 8
    stats = stats_of(params)
    assert stats["engine"]["name"] == "vllm" and stats["engine"]["version"] == "fake-1"
    assert stats["engine"]["vllm"]["dtype"] == "float32"  # verifier.dtype when corpus.vllm.dtype is null
    assert stats["sampling"]["max_new_tokens"] == 8 and stats["chat_template_mismatches"] == 0
    assert stats["retokenized_responses"] == 0 and "roundtrip_mismatches" in stats
    assert wait_gone(int(pid_file.read_text()), 5)

    # a full resume starts no server
    pid_file.unlink()
    capsys.readouterr()
    assert build_corpus.main(["--params", str(params)]) == 0
    assert "2 / 2" in capsys.readouterr().err and not pid_file.exists()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])  # Ctrl-C unwinds as SIGTERM does
def test_no_server_outlives_the_stage(tmp_path, how):
    params = make_project(tmp_path, prompts=40, chat=0, shard_size=4, max_new_tokens=4, engine="vllm", concurrency=1)
    pid_file = tmp_path / "server.pid"
    process = stage(params, DRAFTLINE_SERVE_PYTHON=str(fake_serve_python(tmp_path)), FAKE_PID_FILE=str(pid_file),
                    FAKE_DELAY="0.2")
    shards = tmp_path / "artifacts" / "corpus_shards"
    deadline = time.monotonic() + 120
    while not list(shards.glob("*/shard-*.json")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    server_pid = int(pid_file.read_text())
    process.send_signal(how)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0, stderr
    assert "Traceback" not in stderr
    assert wait_gone(server_pid, 10), f"server {server_pid} outlived the stage killed by {how!r}"


def test_missing_serve_env_is_one_clear_line(tmp_path):
    params = make_project(tmp_path, prompts=12, chat=0, engine="vllm")
    process = stage(params, DRAFTLINE_SERVE_PYTHON=str(tmp_path / "nowhere" / "python"))
    _, stderr = process.communicate(timeout=120)
    errors = [line for line in stderr.splitlines() if "error" in line]
    assert process.returncode == 1 and len(errors) == 1 and "make serve-env" in errors[0], stderr


# --------------------------------------------------------------------------- real vLLM (slow)

needs_vllm = pytest.mark.skipif(serve_python() is None, reason="no serving environment (make serve-env)")
# Eager mode: no torch.compile at start-up, which is most of a start on two cores.
FAST_START = ["--enforce-eager"]


def kv_cache_env(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tests' prompts need little


@pytest.mark.slow
@needs_vllm
def test_engine_vllm_matches_hf_greedy(tmp_path, monkeypatch, capsys):
    from data_prep.continuation import generate_batch
    from data_prep.verifier import load_model_and_tokenizer

    kv_cache_env(monkeypatch)
    params = make_project(tmp_path, prompts=16, chat=4, shard_size=8, max_new_tokens=16, engine="vllm",
                          vllm={"max_model_len": 512, "extra_args": FAST_START})
    assert build_corpus.main(["--params", str(params)]) == 0
    rows = all_rows(params)
    assert len(rows) == 20 and len({row["id"] for row in rows}) == 20
    assert all(list(row) == list(COLUMNS) for row in rows)
    stats = stats_of(params)
    assert stats["engine"]["name"] == "vllm" and stats["engine"]["version"] not in ("", "unknown")
    assert stats["retokenized_responses"] == 0 and stats["chat_template_mismatches"] == 0

    model, tokenizer = load_model_and_tokenizer(str(tmp_path / "artifacts" / "verifier"))
    chat_rows = [row for row in rows if row["domain"] == "text"]
    for row in chat_rows:  # vLLM applied the template; its prompt ids are exactly ours
        user_text = row["prompt"].removeprefix("<|user|>\n").removesuffix("\n<|assistant|>\n")
        assert row["prompt_ids"] == chat_prompt_ids(tokenizer, user_text)
    greedy = generate_batch(model, [row["prompt_ids"] for row in rows], max_new_tokens=16,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    equal = sum(row["response_ids"] == hf.response_ids for row, hf in zip(rows, greedy))
    with capsys.disabled():
        print(f"\nengine vllm vs HF greedy (T=0, fp32): {equal}/{len(rows)} responses token-identical; "
              f"decode->encode mismatches {stats['roundtrip_mismatches']}")
    assert equal >= 0.8 * len(rows)  # fp32 kernels may flip near-ties on a random tiny model
    assert not vllm_processes()


@pytest.mark.slow
@needs_vllm
def test_openai_endpoint_killed_mid_run_then_resumed(tmp_path, monkeypatch):
    kv_cache_env(monkeypatch)
    verifier = tmp_path / "artifacts" / "verifier"
    server_config = VllmConfig(max_model_len=512, extra_args=FAST_START)
    log = tmp_path / "serve.log"
    params = make_project(tmp_path, prompts=48, chat=0, shard_size=4, max_new_tokens=48, temperature=0.8,
                          engine="openai", endpoints=["http://127.0.0.1:9/v1"], concurrency=1, retries=1)
    shards = tmp_path / "artifacts" / "corpus_shards"

    def with_endpoint(url: str, concurrency: int = 1) -> None:
        data = yaml.safe_load(params.read_text())
        data["corpus"].update(endpoints=[url], concurrency=concurrency)
        params.write_text(yaml.safe_dump(data))

    with vllm_server(str(verifier), server_config, dtype="float32", log_path=log) as server:
        with_endpoint(server.url)
        process = stage(params)
        deadline = time.monotonic() + 300
        while not list(shards.glob("*/shard-*.json")) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(server.pid, signal.SIGKILL)  # the whole server, as a node going down
    _, stderr = process.communicate(timeout=180)
    errors = [line for line in stderr.splitlines() if "error" in line]
    assert process.returncode == 1 and "Traceback" not in stderr
    assert len(errors) == 1 and f"endpoint {server.url} is down" in errors[0], stderr
    done = len(list(shards.glob("*/shard-*.json")))
    assert 1 <= done < 12
    assert not (tmp_path / "artifacts" / "corpus").exists()

    with vllm_server(str(verifier), server_config, dtype="float32", log_path=log) as server:  # back, on a new port
        with_endpoint(server.url, concurrency=16)  # how the engine is reached does not void finished shards
        process = stage(params)
        _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    assert f"{done} / 12" in stderr  # the finished shards were kept, none redone
    rows = all_rows(params)
    assert len(rows) == 48 and len({row["id"] for row in rows}) == 48
    assert not vllm_processes()


if __name__ == "__main__":
    main(sys.argv[1:])
