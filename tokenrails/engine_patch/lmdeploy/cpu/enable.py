"""Register ``device_type='cpu'`` with LMDeploy 0.18's PyTorch engine (idempotent, by inspection)."""
from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.RLock()  # another thread waits for the device; this thread's nested call returns
_ENABLED = False
_ENABLING = False  # enable() is running: the start-up hook it triggers (LMDeploy imports) returns
CPU_MARK = "_tokenrails_cpu"  # on LMDeploy's patched backend selector: the device is registered


def enable() -> None:
    """Install the CPU backend selector and CUDA no-op shims in the LMDeploy modules that need them."""
    global _ENABLING
    if _ENABLED:
        return
    with _LOCK:
        if _ENABLED or _ENABLING:
            return
        _ENABLING = True
        try:
            _enable()
        finally:
            _ENABLING = False


def _enable() -> None:
    global _ENABLED
    from lmdeploy.pytorch.backends import selector

    if getattr(selector._get_backend, CPU_MARK, False):  # registered in this process already
        _ENABLED = True  # (by another copy of this module): once per process
        return
    from lmdeploy.pytorch.engine import logits_process
    from lmdeploy.pytorch.engine.cache_engine import engine as cache_engine
    from lmdeploy.pytorch.engine.cache_engine import layout as cache_layout
    from lmdeploy.pytorch.engine.executor import mp_executor
    from lmdeploy.pytorch.engine.model_agent import agent
    from lmdeploy.pytorch.spec_decode import spec_agent
    from lmdeploy.pytorch.spec_decode.proposers import base as proposer_base

    from . import shim

    original = selector._get_backend

    def _get_backend():
        ctx = selector.get_device_manager().current_context()
        if ctx.device_type == 'cpu':
            from .backend import CpuOpsBackend
            return CpuOpsBackend
        return original()

    setattr(_get_backend, CPU_MARK, True)
    selector._get_backend = _get_backend

    _patch_engine_checker()
    _patch_bf16_support()
    _patch_rotary_eager()
    # the modules calling torch.cuda unconditionally (speculative decoding's draft model: spec_agent,
    # proposer_base; TP > 1 workers: mp_executor)
    for module in (agent, cache_engine, cache_layout, logits_process, spec_agent, proposer_base, mp_executor):
        shim.rebind(module)
    _patch_agent_device(agent.BaseModelAgent)
    from .sampling import patched_sampling
    flp = logits_process.FusedLogitsProcessor
    flp.sampling = patched_sampling(flp.sampling)  # greedy rows on CPU: a fast kernel, the same ids
    from ..boot.inherit import export_cpu
    export_cpu()  # TP workers and the api_server's engine process register the device too
    original_to_cuda = agent._try_to_cuda

    def _try_to_cuda(val: Any, non_blocking: bool = False) -> Any:
        """Host→device copy of step inputs: on a CUDA-less torch, 'device' is the CPU.

        Objects with ``to_device`` still go through it (it also derives device-side fields, e.g. a
        delta's ``indices`` from ``indice_cpu``); tensors are already where they run.
        """
        if not _real_cuda_available():
            if hasattr(val, 'to_device'):
                return val.to_device('cpu', non_blocking=non_blocking)
            return val
        return original_to_cuda(val, non_blocking=non_blocking)

    agent._try_to_cuda = _try_to_cuda
    _patch_worker_process_group()
    from .distributed import install as install_tp
    install_tp()  # TP > 1: the executor's ring waits off the ranks' loops (distributed.py)
    _ENABLED = True


def _patch_engine_checker() -> None:
    """On CPU, LMDeploy's ``EngineChecker`` would demand deeplink (its branch for every non-CUDA
    device) and probe torch on 'cuda'. Drop only those: the config checks (``num_gpu_blocks`` >= 16,
    ``max_batch_size`` > 0, ...), the model/transformers checks and the distributed checks still run,
    so a config stock LMDeploy rejects is rejected here too."""
    from lmdeploy.pytorch.check_env.torch import TorchChecker
    from lmdeploy.pytorch.engine.engine_checker import EngineChecker

    original_handle = EngineChecker.handle

    def handle(self):
        if self.engine_config.device_type != 'cpu':
            return original_handle(self)
        _cpu_only_checkers(self, TorchChecker)
        return original_handle(self)

    handle.__wrapped__ = original_handle  # type: ignore[attr-defined]
    EngineChecker.handle = handle


def _patch_rotary_eager() -> None:
    """LMDeploy's default rotary embedding is ``torch.compile``d on its first call: on CPU that is a
    dynamo trace and an inductor C++ build (or cache load) in every engine process and TP rank, a
    few CPU seconds each before the first token, for an op that runs as fast eagerly. CPU tensors
    take the eager function; any other device keeps the compiled one."""
    from lmdeploy.pytorch.backends.default import rotary_embedding as rotary

    compiled = rotary._rotary_embedding_fwd
    if getattr(compiled, CPU_MARK, False):
        return
    eager = compiled.__wrapped__

    def _rotary_embedding_fwd(position_ids, *args: Any, **kwargs: Any):
        fwd = eager if position_ids.device.type == 'cpu' else compiled
        return fwd(position_ids, *args, **kwargs)

    setattr(_rotary_embedding_fwd, CPU_MARK, True)
    _rotary_embedding_fwd.__wrapped__ = compiled  # type: ignore[attr-defined]
    rotary._rotary_embedding_fwd = _rotary_embedding_fwd


def cpu_supports_bf16() -> bool:
    """Whether this CPU has a fast bfloat16 matmul (oneDNN's bf16 path: AVX-512 BF16 / AMX, or its
    AVX-512 emulation). Float16 has no such path on most CPUs (oneDNN fp16 needs AVX512-FP16/AMX-FP16)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _patch_bf16_support() -> None:
    """LMDeploy resolves ``dtype='auto'`` to the model's own half type (``hf_config.torch_dtype``:
    float16 or bfloat16; anything else → float16), demoting bfloat16 to float16 where
    ``is_bf16_supported(device_type)`` says no — and it says no for every device type it does not
    list, 'cpu' included. On CPU, answer for the CPU (``cpu_supports_bf16``), so a bfloat16 model
    runs in bfloat16 as on a GPU that supports it (a float16 matmul has no fast CPU kernel: 5x slower
    than bfloat16 at 8 rows here). A float32 config still resolves to float16: LMDeploy's rule."""
    import lmdeploy.utils as lm_utils
    from lmdeploy.pytorch import config as pt_config

    original = lm_utils.is_bf16_supported
    if getattr(original, "_tokenrails_cpu", False):
        return

    def is_bf16_supported(device_type: str = 'cuda') -> bool:
        if device_type == 'cpu':
            return cpu_supports_bf16()
        return original(device_type)

    is_bf16_supported.__wrapped__ = original  # type: ignore[attr-defined]
    is_bf16_supported._tokenrails_cpu = True  # type: ignore[attr-defined]
    # the dtype resolution (bound at import) and the engine checker's warning (imported per call)
    pt_config.is_bf16_supported = is_bf16_supported
    lm_utils.is_bf16_supported = is_bf16_supported


def _cpu_only_checkers(checker: Any, torch_checker_cls: type) -> None:
    """Remove the deeplink checker from ``checker``'s tree and point torch checks at the CPU."""
    seen: set[int] = set()

    def visit(node: Any) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, torch_checker_cls):
            node.device = 'cpu'
        required = getattr(node, '_required_checker', [])
        required[:] = [c for c in required if type(c).__name__ != 'DeeplinkChecker']
        for child in required:
            visit(child)

    visit(checker)


def _patch_worker_process_group() -> None:
    """TP > 1: ``WorkerWrapperBase.init_process_group`` asks ``get_backend()`` for the collective
    backend outside any device context, which means CUDA's (nccl); on a CPU worker ask inside the
    worker's own device context, so the process group is gloo, and route the forward's
    all_reduces through shared memory (collectives.py)."""
    from lmdeploy.pytorch.devices import DeviceContext, get_device_manager
    from lmdeploy.pytorch.engine.executor.base_worker import WorkerWrapperBase

    original = WorkerWrapperBase.init_process_group

    def init_process_group(self, rank: int, master_addr: str | None = None, master_port: str | None = None):
        if self.device_type != 'cpu':
            return original(self, rank, master_addr, master_port)
        from .collectives import install
        install()  # the forward's all_reduces through shared memory (collectives.py)
        with get_device_manager().context(DeviceContext('cpu')):
            return original(self, rank, master_addr, master_port)

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    WorkerWrapperBase.init_process_group = init_process_group


def _patch_agent_device(cls: type) -> None:
    """``BaseModelAgent.__init__`` hard-codes ``device = 'cuda'``; on a CPU context use ``'cpu'``."""
    original = cls.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(getattr(self, 'device_ctx', None), 'device_type', None) == 'cpu':
            self.device = 'cpu'
            # the speculative agent and its draft proposer were built inside __init__ with the
            # hard-coded 'cuda'; they build the draft model and its cache later, from these fields
            spec_agent = getattr(self, 'spec_agent', None)
            for part in (spec_agent, getattr(spec_agent, 'proposer', None)):
                if part is not None and getattr(part, 'device', None) is not None:
                    part.device = 'cpu'

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__init__ = __init__

    original_free = cls.get_free_mem

    def get_free_mem(self) -> int:
        """CPU: no device memory to query; the block count is fixed by ``num_gpu_blocks``."""
        if self.device == 'cpu':
            return CPU_FREE_MEM_BYTES
        return original_free(self)

    cls.get_free_mem = get_free_mem

    original_warmup = cls.warmup

    def warmup(self) -> None:
        """CPU: skip warmup (it only primes CUDA kernels/graphs, and builds dummy inputs on 'cuda')."""
        if self.device != 'cpu':
            original_warmup(self)

    cls.warmup = warmup


# What the CPU agent reports as free memory: only used for LMDeploy's runtime-memory estimate
# (which may lower max_prefill_token_num); the KV cache size comes from num_gpu_blocks.
CPU_FREE_MEM_BYTES = 8 << 30


def _real_cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def cpu_engine_config(**kwargs: Any):
    """A ``PytorchEngineConfig`` for CPU: eager, fixed block count, small batch (overridable).

    ``PytorchEngineConfig.__post_init__`` only accepts GPU device types, so the object is a subclass
    whose validation lets ``'cpu'`` through (``dataclasses.replace`` keeps working), and whose pickle
    calls ``enable()`` when it is loaded: LMDeploy's api_server runs the engine in a spawned process
    and hands it the config, so the CPU path follows the config there.
    """
    enable()
    defaults: dict[str, Any] = dict(eager_mode=True, enable_metrics=False, num_gpu_blocks=64, block_size=64, max_batch_size=8,
                                    session_len=1024)
    defaults.update(kwargs)
    defaults['device_type'] = 'cpu'
    return _config_class()(**defaults)


_CONFIG_CLASS: Any = None


def _config_class() -> type:
    global _CONFIG_CLASS
    if _CONFIG_CLASS is None:
        from lmdeploy import PytorchEngineConfig

        class CpuPytorchEngineConfig(PytorchEngineConfig):
            """``PytorchEngineConfig`` with ``device_type='cpu'`` that enables the CPU path where it is
            unpickled (a spawned engine process)."""

            def __post_init__(self):
                """Stock validation, which knows only GPU device types, with 'cpu' let through."""
                cpu = self.device_type == 'cpu'
                if cpu:
                    self.device_type = 'cuda'
                super().__post_init__()
                if cpu:
                    self.device_type = 'cpu'

            def __reduce__(self):
                return (_restore_config, (dict(self.__dict__), ))

        CpuPytorchEngineConfig.__module__ = __name__
        _CONFIG_CLASS = CpuPytorchEngineConfig
    return _CONFIG_CLASS


def _restore_config(state: dict) -> Any:
    """Unpickle a CPU engine config: register the CPU device path in this process first."""
    enable()
    cls = _config_class()
    cfg = cls.__new__(cls)
    cfg.__dict__.update(state)
    return cfg
