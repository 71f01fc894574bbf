"""Engine `openai`: OpenAI-compatible servers (vLLM, SGLang, TensorRT-LLM serve) that already run.

Requests spread over all endpoints with at most `corpus.concurrency` in flight per endpoint: each
endpoint has that many worker threads pulling from one queue, so a faster replica simply takes more
prompts. A failed request is retried with exponential backoff; an endpoint that stays down stops the
stage with one error naming it (finished shards are already committed, so a rerun loses nothing).

Token-exact: requests ask for `return_token_ids` (vLLM >= 0.10.2) and the corpus keeps the returned
ids. A server that returns text only gets its text tokenised here; those rows are counted in the stats.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Callable, Sequence

from data_prep.engines import Request, Result
from pipeline.config import CorpusConfig
from pipeline.errors import DraftlineError

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
BACKOFF_S = 1.0  # first retry waits this long, each next one twice as long
MAX_BACKOFF_S = 30.0
# Tokenised by the server and here: a server serving another model (another tokenizer) is caught at start.
TOKENIZER_PROBE = "def probe(x):\n    return x + 1  # The quick brown fox jumps over the lazy dog."


class EndpointDown(DraftlineError):
    """An endpoint failed every retry."""


def server_root(url: str) -> str:
    """`http://host:8000/v1` -> `http://host:8000` (where vLLM serves /health, /version, /tokenize)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read().decode("utf-8", "replace"))
        message = body.get("error", body) if isinstance(body, dict) else body
        message = message.get("message", message) if isinstance(message, dict) else message
    except (ValueError, OSError, http.client.HTTPException):
        message = error.reason
    lines = str(message).strip().splitlines()
    return lines[0][:300] if lines else str(error.code)


def http_json(url: str, body: dict | None, timeout: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


class OpenAIEngine:
    def __init__(self, urls: Sequence[str], tokenizer, config: CorpusConfig, *, name: str,
                 stop_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        # the verifier's generation_config end ids: a server started with `--generation-config vllm`
        # (or any server, for ids it does not know) stops only at the ones a request names
        self.stop_ids = sorted({*stop_ids, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
        self.concurrency, self.timeout, self.retries = config.concurrency, config.request_timeout_s, config.retries
        self.urls = [url.rstrip("/") for url in urls]
        self.models = {url: self._served_model(url) for url in self.urls}
        versions = sorted({self._version(url) for url in self.urls})
        self.settings = {"name": name, "version": versions[0] if len(versions) == 1 else versions,
                         "endpoints": self.urls, "models": sorted(set(self.models.values())),
                         "concurrency_per_endpoint": self.concurrency}
        for url in self.urls:
            self._check_tokenizer(url)

    def describe(self) -> dict:
        return dict(self.settings)

    # ----------------------------------------------------------------------- HTTP with retries

    def call(self, url: str, path: str, body: dict | None = None) -> dict:
        """GET (body None) or POST `url + path`; retried with backoff, then EndpointDown naming `url`."""
        start = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                return http_json(url + path, body, self.timeout)
            except urllib.error.HTTPError as error:
                if error.code not in RETRYABLE_STATUS:
                    raise DraftlineError(
                        f"endpoint {url} rejected {path} (HTTP {error.code}: {_error_message(error)})"
                    ) from None
                reason = f"HTTP {error.code}"
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as error:
                cause = getattr(error, "reason", None) or error
                reason = str(cause).strip() or type(cause).__name__
            if attempt < self.retries:
                time.sleep(min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S))
        raise EndpointDown(
            f"endpoint {url} is down ({reason}; {self.retries + 1} attempts over {time.monotonic() - start:.0f} s); "
            "finished shards are kept: rerun build_corpus when the server is back"
        )

    def _served_model(self, url: str) -> str:
        models = self.call(url, "/models").get("data") or []
        if not models:
            raise DraftlineError(f"endpoint {url} serves no model (GET {url}/models is empty)")
        return models[0]["id"]

    def _version(self, url: str) -> str:
        """The server's version where it reports one (vLLM: GET /version), else 'unknown'."""
        try:
            return str(http_json(server_root(url) + "/version", None, min(self.timeout, 10.0)).get("version", "unknown"))
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            return "unknown"

    def _check_tokenizer(self, url: str) -> None:
        """Where the server can tokenise (vLLM /tokenize), its ids must equal the verifier tokenizer's."""
        body = {"model": self.models[url], "prompt": TOKENIZER_PROBE, "add_special_tokens": False}
        try:
            theirs = http_json(server_root(url) + "/tokenize", body, min(self.timeout, 30.0)).get("tokens")
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            return  # no tokenize route (not vLLM): nothing to compare
        ours = self.tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
        if theirs is not None and list(theirs) != list(ours):
            raise DraftlineError(
                f"endpoint {url} serves '{self.models[url]}', whose tokenizer differs from the verifier's; "
                "corpus.endpoints must serve the verifier"
            )

    # ----------------------------------------------------------------------- generation

    def body(self, url: str, request: Request) -> tuple[str, dict]:
        sampling = request.sampling
        body = {
            "model": self.models[url], "max_tokens": request.max_new_tokens, "n": 1, "stream": False,
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,  # -1 disables top-k (vLLM and SGLang)
            "seed": request.seed, "return_token_ids": True,
        }
        if self.stop_ids:
            body["stop_token_ids"] = self.stop_ids
        if request.chat_text is not None:
            return "/chat/completions", {**body, "messages": [{"role": "user", "content": request.chat_text}]}
        return "/completions", {**body, "prompt": list(request.prompt_ids)}

    def complete(self, url: str, request: Request) -> Result:
        path, body = self.body(url, request)
        response = self.call(url, path, body)
        try:
            choice = response["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            ids, reason = choice.get("token_ids"), choice["finish_reason"]
        except (KeyError, IndexError, TypeError):
            raise DraftlineError(f"endpoint {url} answered {path} without choices[0]; is it OpenAI-compatible?") from None
        prompt_ids = response.get("prompt_token_ids") or choice.get("prompt_token_ids") or list(request.prompt_ids)
        retokenized = ids is None
        if retokenized:
            ids = self.tokenizer(text or "", add_special_tokens=False)["input_ids"]
        finish = "length" if reason == "length" else "eos"
        eos = self.tokenizer.eos_token_id
        if finish == "eos" and eos is not None and (not ids or ids[-1] not in self.stop_ids):
            ids = [*ids, eos]  # the corpus keeps the stop token, as the hf engine does
        return Result(list(prompt_ids), list(ids), finish, retokenized)

    def generate(self, requests: Sequence[Request], on_done: Callable[[int], None]) -> list[Result]:
        if not requests:
            return []
        results: list[Result | None] = [None] * len(requests)
        pending = deque(range(len(requests)))
        lock = threading.Lock()
        finished = threading.Event()
        failures: list[BaseException] = []
        left = [len(requests)]

        def worker(url: str) -> None:
            while not finished.is_set():
                with lock:
                    if not pending:
                        return
                    index = pending.popleft()
                try:
                    result = self.complete(url, requests[index])
                except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
                    with lock:
                        failures.append(error)
                    finished.set()
                    return
                with lock:
                    results[index] = result
                    left[0] -= 1
                    on_done(1)
                    if left[0] == 0:
                        finished.set()

        per_endpoint = min(self.concurrency, len(requests))
        for url in self.urls:
            for _ in range(per_endpoint):
                # daemon: on an error or Ctrl-C the stage exits without waiting for requests in flight
                threading.Thread(target=worker, args=(url,), daemon=True).start()
        while not finished.wait(0.2):  # a timed wait keeps the main thread responsive to Ctrl-C
            pass
        if failures:
            raise failures[0]
        return results
