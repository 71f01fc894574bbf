"""Feature engine `vllm`: the verifier's hidden states from a `vllm serve` the stage starts from the serving
environment (`make serve-env`), with vLLM's `extract_hidden_states` speculative method (the way
vllm-project/speculators generates its training data).

How vLLM extracts them: `--speculative-config {"method": "extract_hidden_states", "num_speculative_tokens": 1,
"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [...]}}}` makes the verifier return
the listed layers' states (EAGLE-3's aux-state path) and a cache-only "drafter" store them in a KV cache group;
a hidden-states KV connector (vllm_connector/draftline_hidden_states.py) writes a finished request's states to
`<scratch>/<request id>.safetensors` and the response names that file (`kv_transfer_params.hidden_states_path`).
A row is one completion request: its ids as the prompt, `max_tokens` 1, so the file holds exactly the row's
prefill states, (tokens, layers, hidden) in the server's dtype, plus the row's `token_ids`.

vLLM's layer ids are HF `output_hidden_states` indices for 0..N-1 (id i is the input of decoder layer i) and
N is the last layer's output *before* the final norm: the feature store's numbering as it is. The file's
layers come in ascending id order whatever order the config lists them in, so ids are sent sorted.

The server runs as long as the engine (started on the first `extract`, again only if the layers change) and
stops on `close`; rows go to it `IN_FLIGHT_PER_ENGINE` at a time per data-parallel engine, so its scheduler
batches them. Each file is read and deleted as soon as its response arrives.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import shutil
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import load_file

from data_prep.engines.openai_client import error_message, http_json, json_object, server_root
from data_prep.engines.vllm_server import vllm_server
from pipeline.config.vllm_config import VllmConfig
from pipeline.errors import DraftlineError
from pipeline.progress import console

CONNECTOR_DIR = Path(__file__).with_name("vllm_connector")  # the server's only PYTHONPATH
CONNECTOR_MODULE, CONNECTOR_CLASS = "draftline_hidden_states", "DraftlineHiddenStatesConnector"
IN_FLIGHT_PER_ENGINE = 64
REQUEST_TIMEOUT_S = 600.0  # one row's prefill (and its file's write) on a busy server


def extraction_args(layers: list[int], scratch: Path) -> list[str]:
    """The `vllm serve` arguments that make it write `layers`' hidden states of every request to `scratch`."""
    speculative = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                   "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}}}
    transfer = {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": str(scratch)}}
    return ["--speculative-config", json.dumps(speculative), "--kv-transfer-config", json.dumps(transfer)]


class VllmFeatureEngine:
    def __init__(self, model: str, config: VllmConfig, *, dtype: str, work_dir: Path, trust_remote_code: bool = False):
        """`work_dir` holds the server's log and the scratch directory its files pass through."""
        self.model, self.config, self.dtype = model, config, config.dtype or dtype
        self.trust_remote_code = trust_remote_code
        self.log_path, self.scratch = work_dir / "vllm-serve.log", work_dir / "hidden_states"
        self._server = contextlib.ExitStack()
        self._url: str | None = None
        self._layers: list[int] | None = None
        self.version = "unknown"
        self.tokens, self.seconds = 0, 0.0  # extraction only, server start-ups excluded

    def describe(self) -> dict:
        return {"name": "vllm", "version": self.version, "vllm": {**self.config.model_dump(mode="json"), "dtype": self.dtype},
                "tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds else None}

    def extract(self, rows: list[list[int]], layers: list[int]) -> list[dict[int, torch.Tensor]]:
        """Per row {layer: (tokens, hidden) float32 on the CPU}; layer N before the final norm."""
        if not rows:
            return []
        ids = sorted(set(layers))
        if ids != self._layers:
            self._start(ids)
        start = time.monotonic()
        pool = ThreadPoolExecutor(min(len(rows), IN_FLIGHT_PER_ENGINE * self.config.data_parallel_size))
        try:
            states = list(pool.map(self._row_states, rows))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # on an error: no new requests, none waited for
        self.seconds += time.monotonic() - start
        self.tokens += sum(map(len, rows))
        return [{layer: state[:, column].float().contiguous() for column, layer in enumerate(ids)} for state in states]

    def close(self) -> None:
        self._server.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.seconds:
            console.print(f"vllm extraction: {self.tokens} tokens in {self.seconds:.1f} s "
                          f"({self.tokens / self.seconds:.0f} tokens/s)")

    def _start(self, layers: list[int]) -> None:
        self.close()
        self._layers = None
        self.scratch.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        server = self._server.enter_context(vllm_server(
            self.model, self.config, dtype=self.dtype, log_path=self.log_path, trust_remote_code=self.trust_remote_code,
            section="features", stage_args=extraction_args(layers, self.scratch), pythonpath=CONNECTOR_DIR))
        self._url, self._layers = server.url, layers
        with contextlib.suppress(urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            self.version = str(json_object(http_json(server_root(server.url) + "/version", None, 10.0)).get("version"))
        console.print(f"vllm {self.version} serving {self.model} for layers {layers} "
                      f"(started in {time.monotonic() - started:.0f} s; log: {self.log_path})")

    def _row_states(self, row: list[int]) -> torch.Tensor:
        """The row's (tokens, layers, hidden) states, read from the file the server wrote, which is then deleted."""
        body = {"model": "verifier", "prompt": row, "max_tokens": 1, "temperature": 0.0}
        try:
            answer = json_object(http_json(f"{self._url}/completions", body, REQUEST_TIMEOUT_S))
        except urllib.error.HTTPError as error:
            raise DraftlineError(f"vllm serve rejected a row of {len(row)} tokens (HTTP {error.code}: "
                                 f"{error_message(error)}); log: {self.log_path}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as error:
            raise DraftlineError(f"vllm serve failed on a row of {len(row)} tokens ({error}); log: {self.log_path}") from None
        path = Path((answer.get("kv_transfer_params") or {}).get("hidden_states_path") or "")
        if path.parent != self.scratch:
            raise DraftlineError(f"vllm serve answered without a hidden-states file in {self.scratch} "
                                 f"(kv_transfer_params: {answer.get('kv_transfer_params')}); log: {self.log_path}")
        lock = path.with_name(path.name + ".lock")
        try:
            with open(lock) as held:
                fcntl.flock(held, fcntl.LOCK_SH)  # the connector holds LOCK_EX until the file is written
                saved = load_file(path)
        except OSError as error:
            raise DraftlineError(f"vllm serve's hidden-states file {path.name} is unreadable ({error}); "
                                 f"log: {self.log_path}") from None
        finally:
            path.unlink(missing_ok=True)
            lock.unlink(missing_ok=True)
        states = saved["hidden_states"]
        if saved["token_ids"].tolist() != row or states.ndim != 3 or states.shape[:2] != (len(row), len(self._layers)):
            raise DraftlineError(f"vllm serve wrote hidden states of shape {tuple(states.shape)} for a row of {len(row)} "
                                 f"tokens and layers {self._layers} (or for other tokens); log: {self.log_path}")
        return states
