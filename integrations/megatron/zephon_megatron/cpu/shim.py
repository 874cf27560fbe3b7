"""CPU shim for Megatron-LM's training loop (megatron-core >= 0.17): for trying and testing only.

Megatron assumes CUDA everywhere: tensors are created with ``device='cuda'``,
moved with ``.cuda()``, RNG state is tracked through ``torch.cuda``'s
generators, and timers/streams/events come from ``torch.cuda``. None of that
exists on a CPU-only machine (with the CPU *or* the CUDA build of torch).

``apply()`` makes the real ``pretrain()`` run on CPU with the gloo backend:

* a process-wide ``TorchFunctionMode`` rewrites every CUDA device argument
  (``'cuda'``, ``'cuda:N'``, ``torch.device('cuda')``, a bare device index) to
  ``'cpu'``, turns ``Tensor.cuda()`` / ``Tensor.pin_memory()`` into the
  identity and ``Tensor.record_stream()`` into a no-op;
* ``torch.cuda`` queries are stubbed (one fake device, no-op sync, dummy
  streams and events, zero memory statistics);
* the CUDA RNG API and Megatron's RNG tracker helpers act on the CPU default
  generator (so "GPU" dropout and CPU randomness share one stream); the JIT
  warm-up's random tensors (sized by TP and CP) do not move it, so the initial
  weights do not depend on the parallel layout;
* the dataset-helper compilation (``make`` on a Makefile the wheel does not
  ship) is skipped: the wheel carries the prebuilt extension;
* with ``--context-parallel-size > 1`` the local layer spec's core attention is
  ``cp_attention.ContextParallelAttention`` (keys and values all-gathered over
  the CP group), since megatron-core's local attention refuses CP.

This is for trying and testing only: it changes semantics (RNG streams, no
overlap, no streams). Import it, call ``apply()`` before importing ``megatron``
(``zephon_megatron.cpu.entry`` does).
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False
_MODE: TorchFunctionMode | None = None


def _is_cuda(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev == "cuda" or dev.startswith("cuda:")
    return False


def _cpu_if_cuda(dev, *, allow_index: bool):
    if _is_cuda(dev):
        return "cpu"
    # A bare int as a device means "CUDA device N" for factories and .to().
    if allow_index and isinstance(dev, int) and not isinstance(dev, bool):
        return "cpu"
    return dev


class _CudaToCpuMode(TorchFunctionMode):
    """Routes every CUDA placement request to the CPU."""

    _IDENTITY = (torch.Tensor.cuda, torch.Tensor.pin_memory)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._IDENTITY:
            return args[0]
        if func is torch.Tensor.record_stream:
            return None
        if func is torch.Tensor.is_pinned:
            return False
        if "device" in kwargs:
            kwargs = dict(kwargs)
            kwargs["device"] = _cpu_if_cuda(kwargs["device"], allow_index=True)
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs)
            kwargs["pin_memory"] = False
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0],) + tuple(_cpu_if_cuda(a, allow_index=True) for a in args[1:])
        return func(*args, **kwargs)


class _FakeStream:
    """Stands in for torch.cuda.Stream: everything is synchronous on CPU."""

    def __init__(self, *args, **kwargs):
        self.device = torch.device("cpu")
        self.priority = kwargs.get("priority", 0)

    def wait_stream(self, other):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        return event or _FakeEvent()

    def synchronize(self):
        return None

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __eq__(self, other):
        return isinstance(other, _FakeStream)

    def __hash__(self):
        return 0


class _FakeEvent:
    def __init__(self, *args, **kwargs):
        self._t = None

    def record(self, stream=None):
        import time

        self._t = time.perf_counter()

    def wait(self, stream=None):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True

    def elapsed_time(self, end):
        if self._t is None or getattr(end, "_t", None) is None:
            return 0.0
        return (end._t - self._t) * 1000.0


_DEFAULT_STREAM = _FakeStream()


def _fake_device_properties(*_a, **_k):
    return types.SimpleNamespace(
        name="cpu-shim",
        major=9,
        minor=0,
        total_memory=64 * 2**30,
        multi_processor_count=1,
        L2_cache_size=0,
        uuid="cpu-shim",
    )


def _const(value):
    """A fresh function object per patched name (torch._dynamo's trace rules
    are keyed by function identity and reject one object under two names)."""

    def fn(*_a, **_k):
        return value

    return fn


def _patch_torch_cuda() -> None:
    cuda = torch.cuda

    cuda.is_available = _const(True)
    cuda.is_initialized = _const(True)
    cuda.device_count = _const(1)
    cuda.current_device = _const(0)
    for name in ("set_device", "synchronize", "empty_cache", "ipc_collect", "set_stream"):
        setattr(cuda, name, _const(None))
    cuda.get_device_properties = lambda *_a, **_k: _fake_device_properties()
    cuda.get_device_capability = _const((9, 0))
    cuda.get_device_name = _const("cpu-shim")
    cuda.is_bf16_supported = _const(True)
    cuda.is_current_stream_capturing = _const(False)
    for name in (
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "device_memory_used",
        "utilization",
        "temperature",
        "power_draw",
        "clock_rate",
    ):
        setattr(cuda, name, _const(0))
        if hasattr(cuda.memory, name):
            setattr(cuda.memory, name, _const(0))
    cuda.reset_peak_memory_stats = _const(None)
    cuda.reset_max_memory_allocated = _const(None)
    cuda.memory_stats = lambda *_a, **_k: {}
    cuda.memory.memory_stats = lambda *_a, **_k: {}
    cuda.memory_summary = _const("")
    cuda.mem_get_info = _const((32 * 2**30, 64 * 2**30))
    cuda.memory.mem_get_info = _const((32 * 2**30, 64 * 2**30))

    _patch_cuda_streams(cuda)
    _patch_cuda_rng(cuda)

    # Torch's optimizer step checks the accelerator's graph-capture state; the
    # CUDA build with no driver fails there. Say there is no accelerator.
    if hasattr(torch, "accelerator"):
        torch.accelerator.current_accelerator = lambda *_a, **_k: None
        torch.accelerator.is_available = lambda: False


def _patch_cuda_streams(cuda: Any) -> None:
    cuda.Stream = _FakeStream
    cuda.Event = _FakeEvent
    cuda.current_stream = _const(_DEFAULT_STREAM)
    cuda.default_stream = _const(_DEFAULT_STREAM)
    cuda.stream = lambda *_a, **_k: contextlib.nullcontext()
    cuda.device = lambda *_a, **_k: contextlib.nullcontext()
    cuda.nvtx = types.SimpleNamespace(
        range_push=_const(None),
        range_pop=_const(None),
        mark=_const(None),
        range=lambda *_a, **_k: contextlib.nullcontext(),
    )



def _patch_cuda_rng(cuda: Any) -> None:
    """The "CUDA" generator is the CPU default generator."""
    cpu_gen = torch.default_generator

    def get_rng_state(device="cuda"):
        return torch.get_rng_state()

    def set_rng_state(new_state, device="cuda"):
        torch.set_rng_state(new_state)

    # Seed the generator object directly: torch.manual_seed itself calls
    # torch.cuda.manual_seed_all, which would recurse.
    def manual_seed(seed):
        cpu_gen.manual_seed(int(seed))

    def manual_seed_all(seed):
        cpu_gen.manual_seed(int(seed))

    cuda.get_rng_state = get_rng_state
    cuda.set_rng_state = set_rng_state
    cuda.get_rng_state_all = lambda: [torch.get_rng_state()]
    cuda.set_rng_state_all = lambda states: torch.set_rng_state(states[0])
    cuda.manual_seed = manual_seed
    cuda.manual_seed_all = manual_seed_all
    cuda.seed = lambda: cpu_gen.seed()
    cuda.seed_all = lambda: cpu_gen.seed()
    cuda.initial_seed = lambda: cpu_gen.initial_seed()
    cuda.random.get_rng_state = get_rng_state
    cuda.random.set_rng_state = set_rng_state
    cuda.random.manual_seed = manual_seed
    cuda.random.manual_seed_all = manual_seed_all
    cuda.default_generators = (cpu_gen,)


def _patch_megatron() -> None:
    """Patches applied to Megatron modules (imported here, after torch.cuda)."""
    import megatron.core.tensor_parallel.random as mrandom

    def _get_state(device="cuda", clone=False, graph_safe=False):
        state = torch.get_rng_state()
        return state.clone() if clone else state

    def _set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    mrandom._get_cuda_rng_state = _get_state
    mrandom._set_cuda_rng_state = _set_state
    _keep_rng_through_jit_warmup()
    # Modules that imported the helpers by name keep a reference; rebind them.
    import sys

    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("megatron"):
            continue
        if getattr(mod, "_set_cuda_rng_state", None) is not None and mod is not mrandom:
            try:
                mod._set_cuda_rng_state = _set_state  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - read-only modules
                pass
        if getattr(mod, "_get_cuda_rng_state", None) is not None and mod is not mrandom:
            try:
                mod._get_cuda_rng_state = _get_state  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover
                pass


def _keep_rng_through_jit_warmup() -> None:
    """The JIT warm-up draws random "CUDA" tensors sized by TP and CP; on a GPU they come from the
    CUDA generator, here from the CPU one that also initialises the weights. Restoring the CPU state
    after it keeps the initial weights the same whatever the TP or CP size, as on a GPU."""
    import megatron.training.initialize as minit

    original = minit._warmup_jit_function

    def _warmup_jit_function(*args, **kwargs):
        state = torch.get_rng_state()
        try:
            return original(*args, **kwargs)
        finally:
            torch.set_rng_state(state)

    minit._warmup_jit_function = _warmup_jit_function


def apply() -> None:
    """Install the CPU shim in this process (idempotent)."""
    global _APPLIED, _MODE
    if _APPLIED:
        return
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    import torch._dynamo  # noqa: F401  (build its trace rules before patching)

    _patch_torch_cuda()
    _MODE = _CudaToCpuMode()
    _MODE.__enter__()  # stays active for the life of the process
    _patch_megatron()
    from zephon_megatron.cpu import cp_attention

    cp_attention.install()
    _APPLIED = True
