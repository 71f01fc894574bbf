"""draftline's vLLM general plugin: a dtype-preserving CPU fallback for the rejection sampler's expand.

vLLM calls `register` in every process that builds an engine or a worker, right before the CPU
platform registers its fallbacks for the Triton kernels (`v1/worker/worker_base.py`:
`load_general_plugins()`, then `register_triton_kernel_overrides()`). That registration reads
`vllm.utils.cpu_triton_utils._expand_kernel_impl` when it runs, so replacing the module attribute
here is enough for `LLM(...)` and `vllm serve` alike. The replacement happens only where the
fallback is in use (CPU platform without Triton) and its self-test fails, never by version.
`VLLM_PLUGINS` (a comma list of plugin names; "" loads none) turns it off like any vLLM plugin.
"""

from __future__ import annotations

import logging
import os

from draftline_vllm_plugin.expand import expand_kernel_impl, self_test

logger = logging.getLogger("vllm.draftline_vllm_plugin")  # under "vllm": printed by vLLM's handler
# set once the replacement is announced: vLLM's engine-core and worker processes inherit the environment,
# so one launch logs one line, not one per process
ANNOUNCED = "DRAFTLINE_VLLM_PLUGIN_ANNOUNCED"


def register() -> None:
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:  # the C++ fallbacks are not used
        return
    current_platform.import_kernels()  # the fallback's C++ op, which the self-test calls
    from vllm.utils import cpu_triton_utils

    defect = self_test(cpu_triton_utils._expand_kernel_impl)
    if defect is None:
        return
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    if os.environ.get(ANNOUNCED):
        return
    os.environ[ANNOUNCED] = "1"
    logger.warning("draftline plugin: vLLM's CPU fallback for the rejection sampler's expand_kernel is broken "
                   "(%s); replaced by a dtype-preserving torch version", defect)
