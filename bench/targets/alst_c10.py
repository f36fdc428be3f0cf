"""Calibration C10 (shared/calibration.md): ArcticTraining's long-sequence recipe on one H200 — Llama-3.1-8B,
HF transformers 4.51 + FlashAttention-3, DeepSpeed ZeRO-3 with offload_optimizer cpu and offload_param cpu
(cpu_adam), micro-batch 1, activation checkpointing, expandable_segments:True, no Liger / tiled MLP / activation
offload: a 65,000-token sequence ran at "137.36 GB" (pynvml used memory ÷ 2^30, so GiB).

pynvml's "used" is the whole device: torch's reserved pool + the CUDA context + non-torch allocations, which is the
analytic engine's `memory.device_total` (overheads.device_memory), and the driver's own reserve: ArcticTraining reads
it with `pynvml.nvmlDeviceGetMemoryInfo(handle)` (arctic_training/debug/utils.py:84 at b28638e), whose default is
NVML's v1 struct (nvidia-ml-py 13.615.71 pynvml.py:3993-4003, version=None), where `used` is the "Sum of Reserved and
Allocated device memory" (NVML API reference, nvmlMemory_t); nvidia-smi's total less CUDA's total is that reserve
(GPU.smi_memory - GPU.memory, data/gpus.json). Nothing is fitted here: the rows report the prediction against the
published figure.

    c10_rows() -> [dict(id, setup, predicted_gib, published_gib, error, ...)]   (imported by the post-training bench)

Setup as trainfit expresses it: --stack deepspeed --zero 3 --offload params (offload_param with offload_optimizer:
ZeRO-Infinity's pair, setup/parsers.combine_offload) --dp 1 --recompute full --seq 65000 --gpu H200; attention
flash (FlashAttention-3 saves what the fused kernels save: q, k, v, output, log-sum-exp), --alloc-conf
expandable_segments:True (the recipe's PYTORCH_CUDA_ALLOC_CONF, projects/sequence-parallelism/README.md:35;
analytic/expandable.py: reserved is the one segment's mapped high-water mark, required the allocated peak).
The loss is transformers 4.51.3's (README.md:154): loss_utils.py:51 `logits.float()`, :55-56 labels padded and
shifted, :63 cross_entropy, LlamaForCausalLM.forward modeling_llama.py:837-841 (lm_head, then self.loss_function
inside the forward): the same as the 5.x the hf stack's [loss] cites, so no stack release is needed for it.
FlashAttention-3 saves q, k, v, out, softmax_lse (Dao-AILab/flash-attention 01afd16 hopper/flash_attn_interface.py
FlashAttnFunc.forward), as --attention flash counts. ZeRO-3 runs DeepSpeed's own defaults: the recipe's yaml gives a
zero_optimization dict, which replaces ArcticTraining's hidden-size-based one (arctic_training/config/trainer.py:421-430
at b28638e, `ds_config.get("zero_optimization", {...})`), so stage3_prefetch_bucket_size 5e7, max_live 1e9, reduce
bucket 5e8 (stacks/deepspeed.toml). On one rank the fetch is a host-to-device copy (deepspeed 0.19.8
runtime/zero/partition_parameters.py _no_gather_coalesced, NoGatherHandle: ds_tensor.to(device)) on the all-gather
stream (partitioned_param_coordinator.py:606): a pool of its own, which the allocated peak already counts.
"""
from __future__ import annotations

import trainfit
from trainfit.hardware import resolve_gpu

GiB = 2**30
PUBLISHED_GIB = 137.36
SOURCE = ("snowflakedb/ArcticTraining projects/sequence-parallelism (calibration.md C10): Llama-3.1-8B, 1 x H200, "
          "ZeRO-3 offload_optimizer + offload_param cpu, 65,000 tokens, 'ok 137.36 GB' (pynvml used / 2^30)")
SETUP = dict(stack="deepspeed", zero=3, offload="params", dp=1, recompute="full", seq=65000, batch=1, gpu="H200",
             attention="flash")
ALLOC_CONF = "expandable_segments:True"  # the recipe's PYTORCH_CUDA_ALLOC_CONF


def c10_rows() -> list[dict]:
    """The C10 row: the analytic device total (and its parts) against the published pynvml figure."""
    e = trainfit.estimate("llama-3.1-8b", alloc_conf=ALLOC_CONF, **SETUP)
    m = e.memory
    gpu = resolve_gpu(SETUP["gpu"])
    driver_reserve = gpu.smi_memory - gpu.memory  # in NVML v1's used, not in the device total
    predicted = (m.device_total + driver_reserve) / GiB
    return [{
        "id": "C10 ArcticTraining Llama-3.1-8B 65k tokens, 1 x H200, ZeRO-3 + param/optimizer offload",
        "setup": dict(SETUP, alloc_conf=ALLOC_CONF),
        "predicted_gib": predicted,
        "published_gib": PUBLISHED_GIB,
        "error": predicted / PUBLISHED_GIB - 1,
        "device_total_gib": m.device_total / GiB,
        "driver_reserve_gib": driver_reserve / GiB,
        "allocated_peak_gib": m.peak / GiB,
        "reserved_gib": m.reserved / GiB,
        "peak_phase": m.peak_phase,
        "host_gib": (e.detail.host_memory or 0) / GiB,
        "fits": e.time.fits if e.time is not None else None,
        "source": SOURCE,
        "note": "pynvml v1 used = device total (reserved + CUDA context) + the driver's reserve; reserved under "
                "expandable_segments = the allocated peak at the loss backward + the freed bf16 logits' hole",
    }]


def main() -> None:
    for r in c10_rows():
        print(f"{r['id']}: predicted {r['predicted_gib']:.2f} GiB (allocated peak {r['allocated_peak_gib']:.2f}, "
              f"reserved {r['reserved_gib']:.2f}, at {r['peak_phase']}) vs published {r['published_gib']:.2f} GiB: "
              f"{r['error']:+.1%}")


if __name__ == "__main__":
    main()
