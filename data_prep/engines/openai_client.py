"""Engine `openai`: OpenAI-compatible servers (vLLM, SGLang, TensorRT-LLM serve) that already run.

Requests spread over all endpoints with at most `corpus.concurrency` in flight per endpoint: each
endpoint has that many worker threads pulling from one queue, so a faster replica simply takes more
prompts. A failed request is retried with exponential backoff, or after the server's `Retry-After` when
it sends one (429/503); an endpoint that stays down stops the stage with one error naming it (finished
shards are already committed, so a rerun loses nothing).

The workers are daemon threads, not a `ThreadPoolExecutor`: an executor's threads are joined at
interpreter exit, so Ctrl-C or a failed endpoint would wait for every request in flight (up to
`request_timeout_s` each) before the stage could stop.

Token-exact: requests ask for `return_token_ids` (vLLM >= 0.10.2) and the corpus keeps the returned
ids. A server that returns text only gets its text tokenised here; those rows are counted in the stats.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import http.client
import io
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.parse
from typing import Callable, Sequence

from data_prep.engines import Request, Result
from pipeline.config.corpus_config import CorpusConfig
from pipeline.errors import DraftlineError, redact_url

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
BACKOFF_S = 1.0  # first retry waits this long, each next one twice as long
MAX_BACKOFF_S = 30.0
# Tokenised by the server and here: a server serving another model (another tokenizer) is caught at start.
TOKENIZER_PROBE = "def probe(x):\n    return x + 1  # The quick brown fox jumps over the lazy dog."


class EndpointDown(DraftlineError):
    """An endpoint failed every retry."""


class InvalidResponse(ValueError):
    """A well-formed answer whose content cannot be what the verifier generated: retried like a failure,
    never committed."""


def token_ids(value: object, vocab_size: int, what: str) -> list[int]:
    """`value` as token ids of the verifier's vocabulary, or InvalidResponse saying what is wrong."""
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise InvalidResponse(f"{what} is not a list of integer token ids")
    outside = [i for i in value if not 0 <= i < vocab_size]
    if outside:
        raise InvalidResponse(f"{what} holds {len(outside)} id(s) outside the verifier's vocabulary "
                              f"[0, {vocab_size}), e.g. {outside[0]}")
    return value


def json_object(value: object) -> dict:
    if not isinstance(value, dict):
        raise InvalidResponse(f"expected a JSON object, got {type(value).__name__}")
    return value


def server_root(url: str) -> str:
    """`http://host:8000/v1` -> `http://host:8000` (where vLLM serves /health, /version, /tokenize)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def retry_after_s(error: urllib.error.HTTPError) -> float | None:
    """The wait a 429/503 answer asks for (`Retry-After`: seconds or an HTTP date), None when it names none."""
    value = (error.headers or {}).get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_message(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read().decode("utf-8", "replace"))
        message = body.get("error", body) if isinstance(body, dict) else body
        message = message.get("message", message) if isinstance(message, dict) else message
    except (ValueError, OSError, http.client.HTTPException):
        message = error.reason
    lines = str(message).strip().splitlines()
    return lines[0][:300] if lines else str(error.code)


def http_json(url: str, body: dict | None, timeout: float) -> object:
    """`timeout` bounds the whole request, from connecting to the last byte: a socket timeout restarts
    with every byte received, so a server trickling a byte every few seconds would never be cut off."""
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if parts.username is not None:  # `http://user:token@host/v1`: sent as HTTP basic auth, never printed
        credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    expired = threading.Event()

    def cut_off() -> None:
        expired.set()
        with contextlib.suppress(OSError, AttributeError):
            connection.sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread

    watchdog = threading.Timer(timeout, cut_off)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.request("GET" if body is None else "POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                           body=None if body is None else json.dumps(body).encode(),
                           headers=headers)
        response = connection.getresponse()
        payload = response.read()
    except (OSError, http.client.HTTPException):
        if expired.is_set():
            raise TimeoutError(f"no complete answer within {timeout:g} s") from None
        raise
    finally:
        watchdog.cancel()
        connection.close()
    if expired.is_set():
        raise TimeoutError(f"no complete answer within {timeout:g} s")
    if response.status >= 400:
        raise urllib.error.HTTPError(url, response.status, response.reason, response.headers, io.BytesIO(payload))
    return json.loads(payload)


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
                         "endpoints": [redact_url(url) for url in self.urls], "models": sorted(set(self.models.values())),
                         "concurrency_per_endpoint": self.concurrency}
        for url in self.urls:
            self._check_tokenizer(url)

    def describe(self) -> dict:
        return dict(self.settings)

    # ----------------------------------------------------------------------- HTTP with retries

    def call(self, url: str, path: str, body: dict | None = None, parse: Callable[[object], object] = json_object):
        """GET (body None) or POST `url + path`, then `parse` the answer; retried with backoff, then
        EndpointDown naming `url` (or, when the server kept answering nonsense, an error saying so)."""
        start = time.monotonic()
        invalid = 0
        for attempt in range(self.retries + 1):
            asked = None
            try:
                return parse(http_json(url + path, body, self.timeout))
            except InvalidResponse as error:
                invalid += 1
                reason = f"invalid response: {error}"
            except urllib.error.HTTPError as error:
                if error.code not in RETRYABLE_STATUS:
                    raise DraftlineError(
                        f"endpoint {redact_url(url)} rejected {path} (HTTP {error.code}: {error_message(error)})"
                    ) from None
                reason = f"HTTP {error.code}"
                asked = retry_after_s(error)
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as error:
                cause = getattr(error, "reason", None) or error
                reason = str(cause).strip() or type(cause).__name__
            if attempt < self.retries:
                backoff = min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
                # the server's own ask wins over our guess, bounded by the request deadline
                time.sleep(backoff if asked is None else min(max(asked, backoff), self.timeout))
        if invalid:
            raise DraftlineError(
                f"endpoint {redact_url(url)} answered {path} with {invalid} invalid response(s) in {self.retries + 1} attempts "
                f"(last: {reason}); nothing from it was committed: check that it serves the verifier"
            )
        raise EndpointDown(
            f"endpoint {redact_url(url)} is down ({reason}; {self.retries + 1} attempts over {time.monotonic() - start:.0f} s); "
            "finished shards are kept: rerun build_corpus when the server is back"
        )

    def _served_model(self, url: str) -> str:
        models = self.call(url, "/models").get("data") or []
        if not models:
            raise DraftlineError(f"endpoint {redact_url(url)} serves no model (GET {redact_url(url)}/models is empty)")
        return models[0]["id"]

    def _version(self, url: str) -> str:
        """The server's version where it reports one (vLLM: GET /version), else 'unknown'."""
        try:
            answer = json_object(http_json(server_root(url) + "/version", None, min(self.timeout, 10.0)))
            return str(answer.get("version", "unknown"))
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            return "unknown"

    def _check_tokenizer(self, url: str) -> None:
        """Where the server can tokenise (vLLM /tokenize), its ids must equal the verifier tokenizer's."""
        body = {"model": self.models[url], "prompt": TOKENIZER_PROBE, "add_special_tokens": False}
        try:
            theirs = json_object(http_json(server_root(url) + "/tokenize", body, min(self.timeout, 30.0))).get("tokens")
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            return  # no tokenize route (not vLLM): nothing to compare
        ours = self.tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
        if theirs is not None and list(theirs) != list(ours):
            raise DraftlineError(
                f"endpoint {redact_url(url)} serves '{self.models[url]}', whose tokenizer differs from the verifier's; "
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
        return self.call(url, path, body, parse=lambda response: self.result(response, request, path, url))

    def result(self, response: object, request: Request, path: str, url: str) -> Result:
        """The server's answer checked before anything keeps it: ids in the vocabulary, at most
        `max_tokens` of them, and the prompt it conditioned on equal to the ids sent (a chat prompt's
        templated ids are the server's to choose)."""
        response = json_object(response)
        try:
            choice = response["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            ids, reason = choice.get("token_ids"), choice["finish_reason"]
        except (KeyError, IndexError, TypeError):
            raise DraftlineError(f"endpoint {redact_url(url)} answered {path} without choices[0]; "
                                 "is it OpenAI-compatible?") from None
        vocab_size = len(self.tokenizer)
        prompt_ids = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if prompt_ids is None:
            prompt_ids = list(request.prompt_ids)
        prompt_ids = token_ids(prompt_ids, vocab_size, "prompt_token_ids")
        if request.chat_text is None and prompt_ids != list(request.prompt_ids):
            raise InvalidResponse("prompt_token_ids differ from the prompt ids sent")
        if not prompt_ids:
            raise InvalidResponse("prompt_token_ids is empty")
        if text is not None and not isinstance(text, str):
            raise InvalidResponse("the text is not a string")
        retokenized = ids is None
        if retokenized:
            # Servers strip special tokens from the text they return (skip_special_tokens defaults to true),
            # so `<|endoftext|>` in it is text the model wrote with ordinary tokens, never the EOS id.
            ids = self.tokenizer(text or "", add_special_tokens=False, split_special_tokens=True)["input_ids"]
        ids = token_ids(ids, vocab_size, "token_ids")
        if len(ids) > request.max_new_tokens:
            raise InvalidResponse(f"{len(ids)} tokens for max_tokens {request.max_new_tokens}")
        finish = "length" if reason == "length" else "eos"
        eos = self.tokenizer.eos_token_id
        if finish == "eos" and eos is not None and (not ids or ids[-1] not in self.stop_ids):
            ids = [*ids, eos]  # the corpus keeps the stop token, as the hf engine does
        return Result(list(prompt_ids), list(ids), finish, retokenized)

    def generate(self, requests: Sequence[Request], on_done: Callable[[int], None]) -> list[Result]:
        if not requests:
            return []
        results: list[Result | None] = [None] * len(requests)
        pending: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(requests)):
            pending.put(index)
        lock = threading.Lock()
        finished = threading.Event()
        failures: list[BaseException] = []
        left = [len(requests)]

        def worker(url: str) -> None:
            while not finished.is_set():
                try:
                    index = pending.get_nowait()
                except queue.Empty:
                    return
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
