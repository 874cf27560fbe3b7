"""CPU only, for trying and testing: run TorchTitan's own trainer on CPU (gloo), under torchrun.

    torchrun --standalone --nproc-per-node 2 <this file> <trainer args>

(``python -m zephon_torchtitan.cpu`` runs it so; torchrun runs it by path, not as a module: the
package's ``__init__`` imports torchtitan, and the device patch must come first.)

``<trainer args>`` are passed untouched to TorchTitan's ``ConfigManager``:
``--module llama3 --config llama3_debugmodel ...`` for 0.3.x, or
``--job.config_file job.toml ...`` for 0.2.x (put ``$ZEPHON_TT022`` first on
``PYTHONPATH`` to get 0.2.2).  The installed version is detected by feature.

TorchTitan has no CPU mode.  Before handing over to ``torchtitan.train.main``
this shim applies these patches (all process-local, nothing is written to disk):

``device``   ``torch._utils._get_available_device_type`` returns "cpu" *before*
             torchtitan is imported (``tools/utils.py`` binds the device at import
             time and falls back to "cuda").  ``torch.cpu`` then becomes the device
             module and ``init_process_group`` picks gloo.
``mem``      the CUDA memory-statistics API that ``components/metrics.py`` calls
             is added to ``torch.cpu`` where missing (peak = process peak RSS).
``flex``     FlexAttention has no CPU backward; its compiled kernel is replaced by
             dense attention over the same ``BlockMask.mask_mod`` and the compiled
             ``create_block_mask`` by the eager one.  Needed on 0.3.x (llama3 always
             uses flex); on 0.2.x only for the ``*_flex_attn`` flavours.
``sum``      torchtitan sets FSDP's gradient divide factor to 1.0, which torch turns
             into ``ReduceOp.PREMUL_SUM``; gloo lacks it.  Any
             ``set_gradient_divide_factor`` call now also forces plain-SUM
             reduction (same numbers: the factor is 1).
``barrier``  ``set_pg_timeouts`` calls ``barrier(device_ids=[torch.cpu.current_device()])``
             ("cpu", a string), which the binding rejects; the ids are dropped
             for that call.

``ZEPHON_TT_SHIM_SKIP=flex,sum`` (comma list) turns patches off, to re-check that
each one is still needed.  Never import this module from library code.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import sys
import types

PATCHES = ("device", "mem", "flex", "sum", "barrier")


def _skipped() -> set[str]:
    skip = {p.strip() for p in os.environ.get("ZEPHON_TT_SHIM_SKIP", "").split(",") if p.strip()}
    unknown = skip - set(PATCHES)
    if unknown:
        raise SystemExit(f"ZEPHON_TT_SHIM_SKIP: unknown patch(es) {sorted(unknown)}; known: {PATCHES}")
    return skip


# --------------------------------------------------------------------------- torch-only patches


def patch_device() -> None:
    import torch._utils

    if "torchtitan" in sys.modules:
        raise RuntimeError("the device patch must run before torchtitan is imported")
    torch._utils._get_available_device_type = lambda: "cpu"


def patch_memory_api() -> None:
    import torch

    cpu = torch.cpu

    def _total_ram() -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def _peak_rss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    fallbacks = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: types.SimpleNamespace(
            name="cpu", total_memory=_total_ram()
        ),
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda device=None: {
            "active_bytes.all.peak": _peak_rss(),
            "reserved_bytes.all.peak": _peak_rss(),
            "num_alloc_retries": 0,
            "num_ooms": 0,
        },
    }
    for name, fn in fallbacks.items():
        if not hasattr(cpu, name):
            setattr(cpu, name, fn)


def patch_sum_reduction() -> None:
    from torch.distributed.fsdp import FSDPModule

    original = FSDPModule.set_gradient_divide_factor
    if getattr(original, "_zephon_cpu_shim", False):
        return

    @functools.wraps(original)
    def set_gradient_divide_factor(self, factor: float) -> None:
        original(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    set_gradient_divide_factor._zephon_cpu_shim = True  # type: ignore[attr-defined]
    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor  # type: ignore[method-assign]


def dense_flex_attention(
    query,
    key,
    value,
    score_mod=None,
    block_mask=None,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    kernel_options=None,
    *,
    return_aux=None,
):
    """Drop-in for ``flex_attention`` (0.2.x ``return_lse`` and 0.3.x ``return_aux``
    conventions) computed densely: the token-level mask is materialised from
    ``block_mask.mask_mod``.  Slow in general, fine for the debug model."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask

    batch, q_heads, q_len, head_dim = query.shape
    kv_len = key.shape[-2]
    if enable_gqa and key.shape[1] != q_heads:
        rep = q_heads // key.shape[1]
        key = key.repeat_interleave(rep, dim=1)
        value = value.repeat_interleave(rep, dim=1)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale

    mask = None
    if block_mask is not None:
        mask_b = 1 if block_mask.kv_num_blocks.shape[0] == 1 else batch
        mask_h = 1 if block_mask.kv_num_blocks.shape[1] == 1 else q_heads
        mask = create_mask(block_mask.mask_mod, mask_b, mask_h, q_len, kv_len, device=query.device)

    want_lse = bool(return_lse) or bool(return_aux is not None and return_aux.lse)
    want_max = bool(return_aux is not None and getattr(return_aux, "max_scores", False))
    if score_mod is None and not want_lse and not want_max:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        lse = max_scores = None
    else:
        out, lse, max_scores = _dense_with_scores(query, key, value, score_mod, mask, scale)

    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput

        return out, AuxOutput(
            lse=lse if return_aux.lse else None,
            max_scores=max_scores if want_max else None,
        )
    if return_lse:
        return out, lse
    return out


def _dense_with_scores(query, key, value, score_mod, mask, scale):
    """Attention computed from explicit scores (a ``score_mod``, or the log-sum-exp / max scores asked for)."""
    import torch

    batch, q_heads, q_len, _ = query.shape
    kv_len = key.shape[-2]
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if score_mod is not None:
        dev = query.device
        scores = score_mod(
            scores,
            torch.arange(batch, device=dev).view(-1, 1, 1, 1),
            torch.arange(q_heads, device=dev).view(1, -1, 1, 1),
            torch.arange(q_len, device=dev).view(1, 1, -1, 1),
            torch.arange(kv_len, device=dev).view(1, 1, 1, -1),
        )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    max_scores = scores.amax(dim=-1).float()
    # Rows with no allowed key give 0 (as flex_attention does), not NaN.
    probs = torch.exp(scores.float() - lse.unsqueeze(-1)).nan_to_num(0.0).to(value.dtype)
    return torch.matmul(probs, value), lse, max_scores


# --------------------------------------------------------------------------- torchtitan patches


def _install_dense_flex(attention_module, wrapper_cls) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    def eager_create_block_mask(*args, **kwargs):
        # torch defaults to device="cuda"; 0.2.x does not pass one.
        if len(args) < 6:
            kwargs.setdefault("device", "cpu")
        return create_block_mask(*args, **kwargs)

    wrapper_cls._compiled_flex_attn = dense_flex_attention
    attention_module._compiled_create_block_mask = eager_create_block_mask


def patch_flex(version: str) -> None:
    if version.startswith("0.2"):
        from torchtitan.models import attention as attn

        _install_dense_flex(attn, attn.FlexAttentionWrapper)
        return

    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common import attention as attn

    _install_dense_flex(attn, attn.FlexAttention)
    # --debug.deterministic makes set_determinism re-compile the kernel: undo that.
    original = dist_utils.set_determinism
    if getattr(original, "_zephon_cpu_shim", False):
        return

    @functools.wraps(original)
    def set_determinism(*args, **kwargs):
        result = original(*args, **kwargs)
        attn.FlexAttention._compiled_flex_attn = dense_flex_attention
        return result

    set_determinism._zephon_cpu_shim = True  # type: ignore[attr-defined]
    dist_utils.set_determinism = set_determinism


def patch_barrier() -> None:
    import torch.distributed as dist
    from torchtitan.distributed import utils as dist_utils

    original = dist_utils.set_pg_timeouts
    if getattr(original, "_zephon_cpu_shim", False):
        return

    @functools.wraps(original)
    def set_pg_timeouts(*args, **kwargs):
        real_barrier = dist.barrier

        def barrier(*b_args, device_ids=None, **b_kwargs):
            return real_barrier(*b_args, **b_kwargs)

        dist.barrier = barrier
        try:
            return original(*args, **kwargs)
        finally:
            dist.barrier = real_barrier

    set_pg_timeouts._zephon_cpu_shim = True  # type: ignore[attr-defined]
    dist_utils.set_pg_timeouts = set_pg_timeouts


def torchtitan_version() -> str:
    """'0.2' for the TOML/JobConfig generation, '0.3' for the Configurable one."""
    import torchtitan.config as tt_config

    return "0.2" if hasattr(tt_config, "JobConfig") else "0.3"


def apply(skip: set[str] | None = None) -> str:
    """Apply all patches not in ``skip``; import torchtitan; return its generation."""
    skip = _skipped() if skip is None else skip
    if "device" not in skip:
        patch_device()
    if "mem" not in skip:
        patch_memory_api()
    if "sum" not in skip:
        patch_sum_reduction()
    version = torchtitan_version()  # first torchtitan import
    if "flex" not in skip:
        patch_flex(version)
    if "barrier" not in skip:
        patch_barrier()
    return version


def main() -> None:
    # Keep this folder off sys.path: its modules are not meant to shadow anything.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")

    skip = _skipped()
    version = apply(skip)
    import torchtitan
    from torchtitan.tools.logging import init_logger, logger

    init_logger()
    logger.info(
        "[zephon cpu shim] torchtitan %s (%s generation) from %s; patches on: %s",
        getattr(torchtitan, "__version__", "?"),
        version,
        os.path.dirname(torchtitan.__file__),
        ",".join(p for p in PATCHES if p not in skip) or "none",
    )
    import torchtitan.train as tt_train

    if version == "0.2":
        tt_train.main(tt_train.Trainer)
    else:
        tt_train.main()


if __name__ == "__main__":
    main()
