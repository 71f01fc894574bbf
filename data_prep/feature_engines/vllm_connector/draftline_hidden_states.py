"""vLLM's hidden-states KV connector, made to work on vLLM's CPU build too.

Loaded *inside* vLLM (the serving environment, which has no draftline) by name: engine `vllm` of stage
extract_features puts this directory, and nothing else, on the server's PYTHONPATH and passes
`--kv-transfer-config {"kv_connector": "DraftlineHiddenStatesConnector",
"kv_connector_module_path": "draftline_hidden_states", ...}`. So it imports only vLLM and torch.

With `--speculative-config {"method": "extract_hidden_states", ...}` vLLM writes the requested layers' hidden
states of every scheduled token into a cache-only KV cache group; vLLM's `ExampleHiddenStatesConnector`
copies a finished request's slots from it into `<shared_storage_path>/<request id>.safetensors`
(`hidden_states` (tokens, layers, hidden), `token_ids` (tokens,)) and releases the file's `.lock`
(flock) once written. Its copy is CUDA-only (pinned host memory, a CUDA stream and events), which raises
on the CPU build. On CPU the slots are already in host memory, so this subclass copies them synchronously
and hands the disk write to the same writer threads and lock protocol; on a GPU the parent runs unchanged.
"""

from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _CopiedEvent:
    """Stands for the parent's CUDA copy event: a synchronous CPU copy is finished when it returns."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class DraftlineHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.device.type != "cpu":
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        # clone: the request's blocks are freed (and reused) as soon as get_finished reports it done
        hidden_states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}
        copied = _CopiedEvent()
        lock_fd = self._lock_fds.pop(pending.req_id, None)  # held LOCK_EX since the request was scheduled
        future = self._executor.submit(self._write_tensors, tensors, copied, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = copied
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
