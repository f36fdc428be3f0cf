"""Published post-training runs against trainfit: LoRA/QLoRA under FSDP or ZeRO, FSDP CPU offload, DeepSpeed
ZeRO-Offload on one GPU and long-context recipes. Each run's published memory (of its kind: allocated, reserved or
the device total nvidia-smi shows) and whether it ran, against the analytic engine's memory and fit verdict; the
calibration runs (C9, C10 of shared/calibration.md) apart from the validation ones. Nothing is fitted here, and
validation is never a gate.

    python -m bench run posttrain_published    # prints the table, writes bench/results/posttrain_published.md

A run is expressed as the trainfit settings that describe it (`flags`). When the engine refuses the flags (a
TrainfitError: a feature or GPU it does not model yet), its one-line message is listed as "not expressible: ...",
and the run is left out of the medians and counts.

Errors: memory = predicted / published − 1 in the published kind (allocated = the engine's memory.peak, reserved =
memory.reserved, device total = memory.device_total, the nvidia-smi / pynvml figure). Verdict: a run that ran (every
run with a published memory, and every "ran") should be judged to fit; an OOM should be judged not to.
Targets (issue 41 item 6), on runs not fitted on: memory median |error| within 10 %, longest context within 15 %,
every ran judged to fit and every OOM judged not to.

Other modules' published runs join the summary when they exist: C9 (bench/targets/fsdp_qlora_c9.py c9_rows()), C10
(bench/targets/alst_c10.py c10_rows()), the longest-context boundaries (bench/targets/longest_context_published.py
rows()) and the RL runs (bench/targets/rl_published.py rows()). Each of their rows is read as a dict with "id" and,
where it has them, "error" (the signed relative error of the number it compares), "fits" (trainfit's verdict),
"expected" ("ran" or "oom") and "not_expressible" (why not).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import trainfit
from bench.data import results_dir
from bench.figures import pct, record
from trainfit.errors import TrainfitError

ABOUT = {"summary": "published LoRA/QLoRA, offload and long-context runs: memory and fit verdict vs published",
         "minutes": 0.1, "quick": None}

GiB = 2**30
KINDS = ("calibration", "validation")
MODELS = Path(__file__).resolve().parent / "posttrain_models"  # config.json of models the catalog lacks

# where each run was published (a pinned commit; each run adds its line)
AAI = ("https://github.com/AnswerDotAI/fsdp_qlora/blob/05ed9f2a60f96a0795cb082bceab70a9b19fd213/"
       "benchmarks_03_2024.md")
PEFT = "https://github.com/huggingface/peft/blob/5d602fdbff04c33c1c4de55cda9d4ae1d7cb7e40/docs/source/accelerate/"
TT = "https://github.com/pytorch/torchtune/blob/bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1/README.md"
DS = "https://github.com/deepspeedai/DeepSpeed/blob/74213e282050df9582eb6b6b28ab57577d3cc3af/docs/_tutorials/zero-offload.md"
ALST = ("https://github.com/snowflakedb/ArcticTraining/blob/b28638e6c577ece34cc147ab3d45d27a7f66b33b/"
        "projects/sequence-parallelism/")

FAMILIES = ("LoRA/QLoRA under FSDP or ZeRO", "FSDP CPU offload", "ZeRO-Offload on one GPU", "long context",
            "fine-tuning on one GPU")


@dataclass(frozen=True)
class Run:
    id: str
    family: str  # one of FAMILIES
    model: str  # a catalog name or a config.json path
    gpus: str  # as published: "2 × RTX 3090"
    published_setup: str  # the stack and settings as published
    metric: str  # "allocated", "reserved", "device_total" (GiB), "ran" or "oom"
    value: float | None  # GiB for the memory metrics
    source: str  # URL#line
    flags: dict = field(default_factory=dict)  # trainfit.estimate's settings
    note: str = ""  # NB: what is assumed where the source is silent


# --- Answer.AI fsdp_qlora (train.py at 05ed9f2): bf16 weights (precision "bf16" = model.to(bfloat16),
# train.py:538,577), LoRA rank 64 on every linear (train.py:1207,1210), torch AdamW unfused (train.py:459-461: fused
# only for "fused_adamw", so torch's CUDA default foreach), gradient checkpointing on (train.py:1197), FULL_SHARD
# (train.py:740) or NO_SHARD for "ddp" (train.py:744), CPUOffload(offload_params=True) for --use_cpu_offload
# (train.py:759). "Peak Memory" is max_memory_reserved (train.py:961: C9). Adapters in bf16: peft v0.10.0 (Mar 2024)
# casts a new adapter to its base layer's floating dtype (src/peft/tuners/lora/layer.py:119-120), and QLoRA's storage
# dtype is the bf16 of the model (train.py:616 quant_storage=torch_dtype).
def _aai(row: int, model: str, gpu: str, n: int, train: str, batch: int, reserved: float | None, seq: int = 2048,
         shard: str = "full_shard", offload: bool = False, act_offload: bool = False, metric: str = "reserved",
         gpu_text: str | None = None) -> Run:
    """One row of the benchmark file (`row`: its line): `model` a catalog name or a posttrain_models/ file stem."""
    flags = dict(batch=batch, seq=seq, precision="bf16", lora_rank=64, lora_dtype="weight", recompute="full",
                 optimizer_impl="foreach", dp=n, zero=3 if shard == "full_shard" else 0, gpu=gpu,
                 # transformers 4.40's loss (fp32 logits returned, a shifted fp32 copy) and train.py's loop holding
                 # the model's output through the backward (train.py:872-894): stacks/hf.toml [releases]
                 stack_release="2024-03-fsdp-qlora")
    if train == "QLoRA":  # train.py never calls peft's prepare_model_for_kbit_training: the embedding, head and
        # norms keep torch_dtype (train.py:536-549, 615-616)
        flags.update(quant="nf4", kbit_prep="none")
    if offload:
        flags["offload"] = "params"  # FSDP CPUOffload(offload_params=True): sharded params and grads on the host
    if act_offload:  # train.py:794-797: offload_wrapper(model), torch's save_on_cpu over the whole forward
        flags["offload"] = "activations+params" if offload else "activations"
    model_ref = model if model.startswith("llama") else str(MODELS / f"{model}.json")
    setup = (f"{train}, {'DDP (NO_SHARD)' if shard == 'ddp' else 'FSDP FULL_SHARD'}"
             f"{', CPU offload' if offload else ''}{', activation offload' if act_offload else ''}, batch {batch}, "
             f"context {seq}, rank 64, bf16, gradient checkpointing")
    return Run(f"aai-{model}-{train.lower()}-{gpu.lower()}x{n}-b{batch}-s{seq}"
               f"{'-ddp' if shard == 'ddp' else ''}{'-off' if offload else ''}{'-alloc' if metric == 'allocated' else ''}",
               FAMILIES[1] if offload else FAMILIES[0], model_ref, f"{n} × {gpu_text or gpu}", setup, metric, reserved,
               f"{AAI}#L{row}", flags,
               note="NB: offload_wrapper (torch's save_on_cpu) moves every saved tensor, torchtune's offloading "
                    "(--offload activations) keeps two layers' on the device: predicted high" if act_offload else "")


AAI_RUNS = (
    # the dual-3090 case study (no NVLink, 280 W); the rows 34 and 44 (QLoRA and LoRA at 512) are C9
    _aai(35, "llama-2-7b", "RTX-3090", 2, "QLoRA", 1, 5.21),
    _aai(45, "llama-2-7b", "RTX-3090", 2, "LoRA", 1, 10.22),
    # line 49: "the peak allocated memory is 8.28 GiB vs 9.16 GiB" for the LoRA runs at 512 (C9's run) and 2048
    _aai(49, "llama-2-7b", "RTX-3090", 2, "LoRA", 1, 8.28, seq=512, metric="allocated"),
    _aai(49, "llama-2-7b", "RTX-3090", 2, "LoRA", 1, 9.16, metric="allocated"),
    _aai(57, "llama-2-7b", "RTX-3090", 2, "QLoRA", 4, 11.22),
    _aai(58, "llama-2-7b", "RTX-3090", 2, "QLoRA", 10, 20.97),
    _aai(59, "llama-2-7b", "RTX-3090", 2, "LoRA", 4, 16.14),
    _aai(60, "llama-2-7b", "RTX-3090", 2, "LoRA", 6, 21.35),
    _aai(72, "llama-2-7b", "RTX-3090", 2, "QLoRA", 8, 20.94, shard="ddp"),
    _aai(73, "llama-2-7b", "RTX-3090", 2, "LoRA", 4, 22.04, shard="ddp"),
    _aai(89, "yi-34b", "RTX-3090", 2, "QLoRA", 2, 23.05),
    _aai(90, "yi-34b", "RTX-3090", 2, "QLoRA", 4, 22.98, offload=True),
    _aai(104, "llama-2-70b", "RTX-3090", 2, "QLoRA", 2, 14.92, offload=True),
    # the dual-4090 workstation (full x16 PCIe 4)
    _aai(125, "llama-2-7b", "RTX-4090", 2, "LoRA", 4, 22.04, shard="ddp"),
    _aai(126, "llama-2-7b", "RTX-4090", 2, "LoRA", 6, 21.35),
    _aai(127, "llama-2-7b", "RTX-4090", 2, "LoRA", 10, 22.69, offload=True),
    _aai(128, "llama-2-7b", "RTX-4090", 2, "QLoRA", 8, 20.94, shard="ddp"),
    _aai(129, "llama-2-7b", "RTX-4090", 2, "QLoRA", 10, 20.97),
    _aai(130, "llama-2-7b", "RTX-4090", 2, "QLoRA", 12, 22.38, offload=True),
    _aai(142, "yi-34b", "RTX-4090", 2, "QLoRA", 2, 23.05),
    _aai(143, "yi-34b", "RTX-4090", 2, "QLoRA", 4, 22.98, offload=True),
    _aai(153, "llama-2-70b", "RTX-4090", 2, "QLoRA", 2, 14.92, offload=True),
    _aai(163, "mistral-7b-v0.2", "RTX-4090", 2, "QLoRA", 12, 22.54, offload=True),
    _aai(164, "mistral-7b-v0.2", "RTX-4090", 2, "QLoRA", 1, 22.54, seq=24576, offload=True),
    # "Llama-2 70B QLoRA with Context Length of 2048 on Select Accelerators": the fastest setting that ran, no memory
    # figure (NB: gradient checkpointing is not stated; train.py's default, on, is assumed)
    _aai(184, "llama-2-70b", "RTX-A5000", 2, "QLoRA", 2, None, offload=True, act_offload=True, metric="ran",
         gpu_text="RTX A5000 24GB"),
    _aai(185, "llama-2-70b", "RTX-A5000", 4, "QLoRA", 1, None, metric="ran", gpu_text="RTX A5000 24GB"),
    _aai(186, "llama-2-70b", "RTX-A5000", 8, "QLoRA", 1, None, metric="ran", gpu_text="RTX A5000 24GB"),
    _aai(187, "llama-2-70b", "RTX-6000-Ada", 2, "QLoRA", 2, None, metric="ran", gpu_text="RTX 6000 Ada (A6000 Ada) 48GB"),
    _aai(188, "llama-2-70b", "RTX-6000-Ada", 4, "QLoRA", 3, None, metric="ran", gpu_text="RTX 6000 Ada (A6000 Ada) 48GB"),
    _aai(189, "llama-2-70b", "A100-40GB", 2, "QLoRA", 1, None, metric="ran"),
    _aai(190, "llama-2-70b", "A100-40GB", 4, "QLoRA", 4, None, metric="ran"),
    _aai(191, "llama-2-70b", "A100-40GB", 8, "QLoRA", 4, None, metric="ran"),
    _aai(192, "llama-2-70b", "H100-80GB", 4, "QLoRA", 8, None, metric="ran"),
)

# --- huggingface/peft docs (examples/sft/train.py through accelerate): Llama-2-70B, max_seq_len 2048 packed, bf16,
# flash attention 2, LoRA r 8 on all-linear, gradient checkpointing. "Memory consumed per GPU" is read off an
# nvidia-smi screenshot: the device total. NB: the docs write "GB" for what nvidia-smi shows in MiB; taken as GiB
# (an "80 %" of an 80 GB H100 is 63.7 GiB: the 64 GB row), so the published figure may be up to 7 % high in GB.
# Adapters in fp32 (peft > 0.13, the docs' stated version: autocast_adapter_dtype=True), the default lora_dtype.
# Flash attention 2 is the FA2 package (--attention flash2): the launch commands pass --use_flash_attn True, which the
# training code the docs show turns into attn_implementation="flash_attention_2" (deepspeed.md and fsdp.md, read at
# 018ca9d); transformers' FA2 path casts the fp32 q, k, v peft's k-bit preparation leaves to bf16, where SDPA
# (--attention flash) would take the math path for fp32 with GQA
_PEFT_70B = dict(seq=2048, lora_rank=8, recompute="full", attention="flash2")
PEFT_RUNS = (
    Run("peft-ds-z3-lora-70b-8xh100", FAMILIES[0], "llama-2-70b", "8 × H100 80GB",
        "LoRA, DeepSpeed ZeRO-3, batch 8, bf16", "device_total", 64.0, f"{PEFT}deepspeed.md#L157",
        dict(_PEFT_70B, batch=8, stack="deepspeed", precision="bf16-master",
             dp=8, zero=3, gpu="H100-80GB")),
    Run("peft-ds-z3-qlora-70b-2x40gb", FAMILIES[0], "llama-2-70b", "2 × 40GB (A100 40GB assumed)",
        "QLoRA (nf4, nested quant), DeepSpeed ZeRO-3, batch 2, bf16", "device_total", 36.6,
        f"{PEFT}deepspeed.md#L274",
        dict(_PEFT_70B, batch=2, stack="deepspeed", precision="bf16-master",
             quant="nf4", dp=2, zero=3, gpu="A100-40GB"),
        note="NB: the GPU is named only as '2X40GB' (deepspeed.md:170)"),
    Run("peft-fsdp-lora-70b-8xh100", FAMILIES[0], "llama-2-70b", "8 × H100 80GB",
        "LoRA, FSDP FULL_SHARD (accelerate, mixed_precision bf16), batch 8", "device_total", 76.0,
        f"{PEFT}fsdp.md#L158",
        dict(_PEFT_70B, batch=8, dp=8, zero=3, gpu="H100-80GB"),
        note="NB: published as a range, 72-80 GB (90-98 %); its midpoint, so ±5 % of the error is the range's"),
    Run("peft-fsdp-qlora-offload-70b-2x24gb", FAMILIES[1], "llama-2-70b", "2 × 24GB (RTX 4090 assumed)",
        "QLoRA (nf4, nested quant, bf16 storage), FSDP FULL_SHARD + CPU offload, batch 2, bf16", "device_total", 19.6,
        f"{PEFT}fsdp.md#L275",
        dict(_PEFT_70B, batch=2, precision="bf16", quant="nf4", dp=2,
             zero=3, offload="params", gpu="RTX-4090"),
        note="NB: the 24GB GPU is not named"),
    Run("peft-fsdp-qlora-70b-2gpu", FAMILIES[0], "llama-2-70b", "2 GPUs (A100 80GB assumed)",
        "QLoRA (nf4, nested quant, bf16 storage), FSDP FULL_SHARD, batch 2, bf16", "device_total", 35.6,
        f"{PEFT}fsdp.md#L275",
        dict(_PEFT_70B, batch=2, precision="bf16", quant="nf4", dp=2,
             zero=3, gpu="A100-80GB"),
        note="NB: the GPU is not named (more than 24GB: it holds 35.6 GB)"),
)

# --- torchtune README "Memory and training speed" (README.md:123-132): batch 2, packed to 2048, torch.compile, the
# recipes' configs (bf16, activation checkpointing on; LoRA rank 8 on q/v/output_proj + MLP for 8B, rank 16 for 70B
# and 405B). The figure's kind is not stated; torchtune logs peak_memory_active, = allocated (NB: if it is reserved,
# the published figure is high by the allocator's cache). torchtune runs as --stack hf with the foreach optimizer
# (as stacks_published.py's C1); its adapters are in the model's bf16 (lora_dtype weight); NF4 is torchao's.
_TT_LORA8 = dict(lora_rank=8, lora_targets="q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", lora_dtype="weight")
_TT = dict(batch=2, seq=2048, precision="bf16", recompute="full", compile=True, optimizer_impl="foreach")


def _tt_full(**flags) -> dict:
    """8B_full_single_device.yaml: bitsandbytes' PagedAdamW8bit (its own kernel: no --optimizer-impl), stepped in
    the backward (optimizer_in_bwd: True)."""
    out = dict(_TT, optimizer="paged-adamw-8bit", optimizer_in_backward=True, **flags)
    del out["optimizer_impl"]
    return out

TT_RUNS = (
    Run("tt-8b-full-4090", FAMILIES[4], "llama-3.1-8b", "1 × RTX 4090", "full, PagedAdamW8bit, optimizer in backward",
        "allocated", 18.9, f"{TT}#L125",
        _tt_full(gpu="RTX-4090")),
    Run("tt-8b-full-a6000", FAMILIES[4], "llama-3.1-8b", "1 × RTX A6000", "full, PagedAdamW8bit, optimizer in backward",
        "allocated", 37.4, f"{TT}#L126",
        _tt_full(gpu="RTX-A6000"),
        note="NB: the same recipe as on the 4090 at twice the memory: the settings that differ are not published"),
    Run("tt-8b-lora-4090", FAMILIES[4], "llama-3.1-8b", "1 × RTX 4090", "LoRA r 8", "allocated", 16.2, f"{TT}#L127",
        dict(_TT, **_TT_LORA8, gpu="RTX-4090")),
    Run("tt-8b-lora-a6000", FAMILIES[4], "llama-3.1-8b", "1 × RTX A6000", "LoRA r 8", "allocated", 30.3, f"{TT}#L128",
        dict(_TT, **_TT_LORA8, gpu="RTX-A6000")),
    Run("tt-8b-qlora-4090", FAMILIES[4], "llama-3.1-8b", "1 × RTX 4090", "QLoRA r 8 (torchao NF4)", "allocated", 7.4,
        f"{TT}#L129", dict(_TT, **_TT_LORA8, quant="nf4", gpu="RTX-4090")),
    Run("tt-70b-full-8xa100", FAMILIES[1], "llama-3.1-70b", "8 × A100 (80GB assumed)",
        "full, FSDP + CPU offload, fused optimizer", "allocated", 13.9, f"{TT}#L130",
        dict(_TT, dp=8, zero=3, offload="params", optimizer_impl="fused", gpu="A100-80GB"),
        note="NB: torchtune's 70B_full.yaml shards tok_embeddings and output as FSDP units of their own "
             "(custom_sharded_layers; pytorch/torchtune recipes/configs/llama3_1/70B_full.yaml at 0031bfb0); the hf "
             "stack's wrap keeps them in the root, gathered through the step: over by 2 x 128256 x 8192 x 2 B x "
             "(1 - 1/8) = 3.4 GiB"),
    Run("tt-70b-lora-8xa100", FAMILIES[0], "llama-3.1-70b", "8 × A100 (80GB assumed)", "LoRA r 16, FSDP",
        "allocated", 27.6, f"{TT}#L131", dict(_TT, **dict(_TT_LORA8, lora_rank=16), dp=8, zero=3, gpu="A100-80GB")),
    Run("tt-405b-qlora-8xa100", FAMILIES[0], "llama-3.1-405b", "8 × A100 (80GB assumed)", "QLoRA r 16, FSDP",
        "allocated", 44.8, f"{TT}#L132",
        dict(_TT, **dict(_TT_LORA8, lora_rank=16), quant="nf4", dp=8, zero=3, gpu="A100-80GB"),
        note="NB: published in 'GB' where the other rows say GiB"),
)

# --- DeepSpeed ZeRO-Offload tutorial: the 10B GPT-2 (Megatron-LM GPT-2, posttrain_models/gpt2-10b-megatron.json)
# trained on one V100-SXM3 32GB, batch 10, seq 1024, fp16, --checkpoint-activations. Its nvidia-smi screenshot
# (docs/assets/images/zero_offload_dp1_10B_smi.png at the same commit, linked at zero-offload.md:65-68) shows GPU 0 at 32290 MiB of
# 32480 MiB while training (the device total; the log beside it is dated 2020-09-10). The run is DeepSpeedExamples'
# Megatron-LM/scripts/ds_zero-offload_10B_pretrain_gpt2_model_parallel.sh with ds_zero-offload_10B_config.json (at
# b989b41, 2020-09-10): ZeRO-2 with cpu_offload, --cpu-optimizer, reduce_bucket_size 5e7, and
# --deepspeed-activation-checkpointing with activation_checkpointing {partition_activations, contiguous_memory_
# optimization, cpu_checkpointing}: DeepSpeed's CheckpointFunction copies each checkpointed layer input into a host
# buffer (deepspeed/runtime/activation_checkpointing/checkpointing.py:382-407 at c82756c, DeepSpeed of that day) and
# brings it back to the device at the layer's backward (:524-525): --offload activations (one layer's input on the
# device, as ArcticTraining's checkpoint offload) beside the optimizer's.
DS_RUNS = (
    Run("ds-zero-offload-gpt2-10b-v100", FAMILIES[2], str(MODELS / "gpt2-10b-megatron.json"), "1 × V100-SXM3 32GB",
        "ZeRO-2 + offload_optimizer cpu, batch 10, seq 1024, fp16, activation checkpointing with cpu_checkpointing",
        "device_total", 32290 / 1024, f"{DS}#L65-L68",
        dict(batch=10, seq=1024, stack="deepspeed", precision="fp16-master", zero=2, offload="activations+optimizer",
             recompute="full", gpu="V100-32GB"),
        note="NB: trainfit runs the HF GPT-2 on DeepSpeed 0.19.8: Megatron-LM's vocab-parallel cross-entropy of 2020 "
             "(mpu/cross_entropy.py:31-40, 78-104: fp32 clone and exp in the forward, gradient in place of the saved "
             "softmax) peaks ~1 GiB higher in the forward and ~2.9 GiB lower at the loss's backward than HF's loss; "
             "the screenshot is of a nearly full device (the caching allocator keeps what it freed)"),
)

# --- Hugging Face blog "Accelerate Large Model Training using PyTorch Fully Sharded Data Parallel" (Apr 2022), Tables 1
# and 2: run_clm_no_trainer.py on wikitext-2, fp32 (the config's mixed_precision 'no'), no gradient checkpointing,
# 2 × 24GB Titan RTX, whose capacity the OOM message gives: "23.65 GiB total capacity". The Titan RTX is not in the
# catalog: the RTX 3090 (also 24GB GDDR6(X) on a TU102/GA102 board) stands in with --gpu-memory 23.65 (NB: its CUDA
# context is Ampere's). The command's `--block_size 12` is kept as published (NB: it may be a cut-off 128 or 1024;
# the OOM rows do not depend on it: GPT-2 XL's fp32 weights, gradients and AdamW states alone are 16 B × 1.56 B =
# 23.2 GiB). Rows 1M min_num_params (another wrapping, not modelled) are left out.
HFB = "https://github.com/huggingface/blog/blob/00e67ae4b7a8c1bc4db743be1a2931422c6d2be2/pytorch-fsdp.md"
_HFB = dict(seq=12, precision="fp32", gpu="RTX-3090", gpu_memory=23.65)
HFB_RUNS = (
    Run("hfb-gpt2-large-fsdp-offload-2gpu-b22", FAMILIES[1], "gpt2-large", "2 × Titan RTX 24GB",
        "FSDP FULL_SHARD (min_num_params 2K) + CPU offload, batch 22 (the largest that ran)", "ran", None,
        f"{HFB}#table-1", dict(_HFB, batch=22, dp=2, zero=3, offload="params")),
    Run("hfb-gpt2-xl-ddp-1gpu-b1", FAMILIES[1], "gpt2-xl", "1 × Titan RTX 24GB", "DDP, batch 1: CUDA OOM", "oom", None,
        f"{HFB}#table-2", dict(_HFB, batch=1)),
    Run("hfb-gpt2-xl-ddp-2gpu-b1", FAMILIES[1], "gpt2-xl", "2 × Titan RTX 24GB", "DDP, batch 1: CUDA OOM", "oom", None,
        f"{HFB}#table-2", dict(_HFB, batch=1, dp=2)),
    Run("hfb-gpt2-xl-ddp-fp16-1gpu-b1", FAMILIES[1], "gpt2-xl", "1 × Titan RTX 24GB", "DDP + FP16 (amp), batch 1: CUDA OOM",
        "oom", None, f"{HFB}#table-2", dict(_HFB, batch=1, precision="amp-fp16")),
    Run("hfb-gpt2-xl-fsdp-offload-1gpu-b10", FAMILIES[1], "gpt2-xl", "1 × Titan RTX 24GB",
        "FSDP FULL_SHARD (min_num_params 2K) + CPU offload, batch 10 (the largest that ran)", "ran", None,
        f"{HFB}#table-2", dict(_HFB, batch=10, zero=3, offload="params")),
    Run("hfb-gpt2-xl-fsdp-offload-2gpu-b14", FAMILIES[1], "gpt2-xl", "2 × Titan RTX 24GB",
        "FSDP FULL_SHARD (min_num_params 2K) + CPU offload, batch 14 (the largest that ran)", "ran", None,
        f"{HFB}#table-2", dict(_HFB, batch=14, dp=2, zero=3, offload="params")),
)

# --- ArcticTraining ALST recipes (projects/sequence-parallelism/*.yml): Llama-3.1-8B-Instruct / Llama-3.1-70B /
# Qwen3-32B, micro-batch 1, DeepSpeed ZeRO-3 with offload_optimizer cpu (and offload_param cpu on one GPU), cpu_adam,
# flash attention (FA2 on H100, FA3 on H200), activation checkpointing on (C10), PYTORCH_CUDA_ALLOC_CONF
# expandable_segments:True (README.md:35). Each recipe's max_length comment is the run's record: "ok" (ran), "close to
# oom" (ran), "NV x GB" (pynvml's used memory ÷ 2^30 = the device total, C10). The H200 baseline (65,000 ok 137.36 GB)
# is C10. Liger (`model.type: "liger"`, line 24 of the sp1 recipes, 20-22 of the others; liger_factory.py:25-62:
# AutoLigerKernelForCausalLM) applies all of Liger's kernels for the family: --liger (its RMSNorm, RoPE and SwiGLU,
# the SwiGLU left out under tiled_mlp_compute, liger_factory.py:42; and the fused linear cross-entropy).
_ALST = dict(batch=1, stack="deepspeed", zero=3, recompute="full", attention="flash",
             alloc_conf="expandable_segments:True")


def _alst(recipe: str, line: int, model: str, gpu: str, n: int, seq: int, metric: str, value: float | None,
          liger: bool = True, tiled: bool = False, ckpt_offload: bool = False) -> Run:
    """One recipe: ZeRO-3 with offload_optimizer (and offload_param on one GPU), sequence_parallel_size n over the
    n GPUs (--ulysses n inside --dp n), tiled_mlp_compute (--tiled-mlp auto), activation_checkpoint_cpu_offload
    (--offload activations beside the states' offload), Liger's kernels and its fused linear cross-entropy (--liger,
    --loss fused-linear).
    NB: without Liger, sft_trainer.py:100-150 at b28638e computes the loss with TiledFusedLogitsLoss (--loss tiled);
    the recipes without it are the baselines ("no extras"), whose records fit the whole logits instead (C10, the H200
    baseline, is calibrated with them; 32,000 tokens "NV 71.91 GB" is 24 GiB under the tiled loss): the full loss."""
    state = "params" if n == 1 else "optimizer"
    flags = dict(_ALST, seq=seq, dp=n, gpu=gpu, offload=f"activations+{state}" if ckpt_offload else state,
                 loss="fused-linear" if liger else "full", liger=liger)
    if n > 1:
        flags["ulysses"] = n
    if tiled:
        flags["tiled_mlp"] = 0  # auto: ceil(tokens per rank / hidden) slices (tiled_compute.py:51-56)
    extras = ", ".join(x for x, on in (("Liger", liger), ("tiled MLP", tiled), ("ckpt offload", ckpt_offload)) if on)
    setup = (f"ZeRO-3 + {'optimizer and param' if n == 1 else 'optimizer'} offload, SP {n}, seq {seq:,}"
             f"{', ' + extras if extras else ''}")
    gpu_text = {"H100-80GB": "H100 80GB", "H200": "H200"}[gpu]
    return Run(f"alst-{recipe}-{seq}", FAMILIES[3], model, f"{n} × {gpu_text}", setup, metric, value,
               f"{ALST}{recipe}.yml#L{line}", flags)


ALST_RUNS = (
    _alst("run-h100-sp1-llama-8b-baseline", 41, "llama-3.1-8b", "H100-80GB", 1, 32_000, "device_total", 71.91,
          liger=False),
    _alst("run-h100-sp1-llama-8b-baseline", 42, "llama-3.1-8b", "H100-80GB", 1, 36_000, "ran", None, liger=False),
    _alst("run-h100-sp1-llama-8b", 43, "llama-3.1-8b", "H100-80GB", 1, 500_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp1-qwen3-32b", 48, "qwen3-32b", "H100-80GB", 1, 230_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h200-sp1-llama-8b-liger", 43, "llama-3.1-8b", "H200", 1, 300_000, "device_total", 134.96),
    _alst("run-h200-sp1-llama-8b-liger-offload", 43, "llama-3.1-8b", "H200", 1, 650_000, "device_total", 126.81,
          ckpt_offload=True),
    _alst("run-h200-sp1-llama-8b-liger-offload-tiled-mlp", 43, "llama-3.1-8b", "H200", 1, 1_200_000, "device_total",
          136.15, tiled=True, ckpt_offload=True),
    _alst("run-h100-sp8-llama-8b", 41, "llama-3.1-8b", "H100-80GB", 8, 3_800_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp8-llama-8b-no-mlp-no-act-offload", 41, "llama-3.1-8b", "H100-80GB", 8, 1_100_000, "ran", None),
    _alst("run-h100-sp8-llama-8b-no-ulysses-no-liger-no-extras", 40, "llama-3.1-8b", "H100-80GB", 8, 32_000, "ran",
          None, liger=False),
    _alst("run-h100-sp8-llama-8b-no-ulysses-yes-liger-no-extras", 41, "llama-3.1-8b", "H100-80GB", 8, 160_000, "ran",
          None),
    _alst("run-h100-sp8-llama-8b-yes-act-offload", 41, "llama-3.1-8b", "H100-80GB", 8, 2_400_000, "ran", None,
          ckpt_offload=True),
    _alst("run-h100-sp8-llama-8b-yes-mlp", 40, "llama-3.1-8b", "H100-80GB", 8, 1_200_000, "ran", None, tiled=True),
    _alst("run-h100-sp8-llama-70b", 41, "llama-3.1-70b", "H100-80GB", 8, 200_000, "ran", None, tiled=True),
    _alst("run-h100-sp8-qwen3-32b", 41, "qwen3-32b", "H100-80GB", 8, 1_550_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp16-llama-8b", 41, "llama-3.1-8b", "H100-80GB", 16, 8_000_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp16-llama-70b", 41, "llama-3.1-70b", "H100-80GB", 16, 1_200_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp16-qwen3-32b", 41, "qwen3-32b", "H100-80GB", 16, 4_000_000, "ran", None, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp32-llama-70b", 41, "llama-3.1-70b", "H100-80GB", 32, 4_000_000, "device_total", 47.70,
          tiled=True, ckpt_offload=True),
    _alst("run-h100-sp32-llama-8b-baseline", 41, "llama-3.1-8b", "H100-80GB", 32, 36_000, "ran", None, liger=False),
    _alst("run-h100-sp32-qwen3-32b", 41, "qwen3-32b", "H100-80GB", 32, 7_000_000, "device_total", 71.55, tiled=True,
          ckpt_offload=True),
    _alst("run-h100-sp64-llama-70b", 41, "llama-3.1-70b", "H100-80GB", 64, 10_000_000, "device_total", 53.83,
          tiled=True, ckpt_offload=True),
    _alst("run-h100-sp64-qwen3-32b", 40, "qwen3-32b", "H100-80GB", 64, 15_000_000, "device_total", 71.00,
          tiled=True, ckpt_offload=True),
)

# published figures not transcribed as runs, and why
LEFT_OUT = (
    "NeMo's long-sequence CP table (NVIDIA/NeMo docs/source/performance/performance_long_sequence.md, Llama-2-7B FP8 "
    "on DGX-H100 to 1M tokens): micro-batch, global batch and recompute are not stated, and the 4K row's fit verdict "
    "flips with the recompute assumed",
    "peft's ZeRO-3 + CPU offload bart-large example (docs/source/accelerate/deepspeed.md:408-411, 9,404 MiB "
    "max_memory_allocated): its padded input length is the dataset's, not stated",
    "the HF FSDP blog's GPT-2 Large rows without offload and with min_num_params 1M: their batch boundaries hinge on "
    "the cut-off --block_size",
    "ArcticTraining run-h100-sp32-llama-8b.yml (15.5M tokens, '? re-run') and run-h100-sp1-llama-8b.yml's 555K "
    "(an illegal memory access, not an OOM)",
)

RUNS = AAI_RUNS + PEFT_RUNS + TT_RUNS + HFB_RUNS + DS_RUNS + ALST_RUNS
MEMORY = {"allocated": "peak", "reserved": "reserved", "device_total": "device_total"}  # metric -> Memory field


def evaluate(run: Run) -> dict:
    """One run's row: its error against the published memory (where it has one) and trainfit's fit verdict, or why
    it is not expressible."""
    row = {"id": run.id, "kind": KINDS[1], "family": run.family, "metric": run.metric}
    settings = dict(run.flags)
    try:
        e = trainfit.estimate(run.model, **settings)
    except TrainfitError as err:  # a feature, model or GPU this checkout does not model yet
        return dict(row, not_expressible=str(err).splitlines()[0])
    row["fits"] = e.time.fits
    row["expected"] = "oom" if run.metric == "oom" else "ran"
    if run.metric in MEMORY:
        predicted = getattr(e.memory, MEMORY[run.metric])
        if predicted is None:
            return dict(row, not_expressible=f"the engine gives no {run.metric} for this setup")
        row["predicted"] = predicted / GiB
        row["error"] = row["predicted"] / run.value - 1
    return row


def optional_rows(module: str, function: str, kind: str | None = None) -> list[dict] | None:
    """Another module's published rows (bench.targets.<module>.<function>()), None while that module does not exist.
    `kind` overrides the rows' kind (C9 and C10 are calibration)."""
    if importlib.util.find_spec(f"bench.targets.{module}") is None:
        return None
    rows = getattr(importlib.import_module(f"bench.targets.{module}"), function)()
    return [dict(r, kind=kind or r.get("kind", KINDS[1])) for r in rows]


def longest_rows() -> list[dict] | None:
    """longest_context_published.rows() in this module's row contract: `error` = predicted / published − 1 where a
    boundary was published; a published OOM (no context fits) as an OOM verdict, judged to fit when the search found
    any length."""
    rows = optional_rows("longest_context_published", "rows")
    if rows is None:
        return None
    out = []
    for r in rows:
        rid = f"lc-{r['model']}-{r['gpu_memory']}gib"
        out.append(dict(r, id=rid, error=r["error_pct"] / 100) if r["published"]
                   else dict(r, id=rid, expected="oom", fits=r["predicted"] > 0))
    return out


def verdicts(rows: list[dict]) -> dict:
    """Agreement of the fit verdict with what happened: ran judged to fit, OOM judged not to."""
    judged = [r for r in rows if "fits" in r and r.get("expected") in ("ran", "oom")]
    ran = [r for r in judged if r["expected"] == "ran"]
    oom = [r for r in judged if r["expected"] == "oom"]
    return {"ran": len(ran), "ran_fits": sum(bool(r["fits"]) for r in ran),
            "oom": len(oom), "oom_not_fits": sum(not r["fits"] for r in oom),
            "disagree": sorted(r["id"] for r in judged if bool(r["fits"]) != (r["expected"] == "ran"))}


def quantity(row: dict) -> str:
    """What a row's error compares: "time" for C9's time rows (its `metric` "time s / 1,024 samples",
    fsdp_qlora_c9.c9_rows), "memory" for every other row."""
    return "time" if str(row.get("metric", "")).startswith("time") else "memory"


def memory_stats(rows: list[dict]) -> dict:
    errs = [r["error"] for r in rows if "error" in r]
    return {"runs": len(rows), "expressible": sum("not_expressible" not in r for r in rows), "with_memory": len(errs),
            "median_abs": statistics.median(abs(e) for e in errs) if errs else None,
            "worst": max(errs, key=abs) if errs else None}


def summarise(own: list[dict], others: dict[str, list[dict] | None]) -> dict:
    """Per kind: memory median |error| and verdict agreement over this module's runs and the RL ones; the longest
    context median over its module's rows; which other modules are not yet available."""
    rl = others.get("rl") or []
    calibration = (others.get("c9") or []) + (others.get("c10") or [])
    out = {"not_yet_available": sorted(k for k, v in others.items() if v is None)}
    for kind, rows in (("validation", own + [r for r in rl if r["kind"] == KINDS[1]]),
                       ("calibration", calibration + [r for r in rl if r["kind"] == KINDS[0]])):
        # memory and time errors apart: a time row's error is no memory error
        out[kind] = {"memory": memory_stats([r for r in rows if quantity(r) == "memory"]),
                     "time": memory_stats([r for r in rows if quantity(r) == "time"]), "verdicts": verdicts(rows)}
    for family in FAMILIES:
        mine = [r for r in own if r["family"] == family]
        out.setdefault("families", {})[family] = {"memory": memory_stats(mine), "verdicts": verdicts(mine)}
    longest = others.get("longest")
    out["longest_context"] = None if longest is None else memory_stats(
        [r for r in longest if r["kind"] == KINDS[1]])
    if longest is not None:
        out["longest_context"]["verdicts"] = verdicts(longest)
    return out


def _mem(s: dict) -> str:
    if not s["runs"]:
        return "no runs yet (see the modules not yet available)"
    if not s["with_memory"]:
        return f"{s['runs']} runs, {s['expressible']} expressible, none with a published memory figure yet"
    return (f"{s['with_memory']} of {s['runs']} runs compared · median \\|error\\| {s['median_abs']:.1%} · worst "
            f"{s['worst']:+.1%}")


def _verdict(v: dict) -> str:
    return (f"ran judged to fit: {v['ran_fits']} of {v['ran']} · OOM judged not to fit: {v['oom_not_fits']} of "
            f"{v['oom']}" + (f" · disagree: {', '.join(v['disagree'])}" if v["disagree"] else ""))


SOURCES = {"c9": "bench/targets/fsdp_qlora_c9.py", "c10": "bench/targets/alst_c10.py",
           "longest": "bench/targets/longest_context_published.py", "rl": "bench/targets/rl_published.py"}


def render(own: list[dict], s: dict) -> str:
    by_id = {r.id: r for r in RUNS}
    out = ["# Published post-training runs vs trainfit (`python -m bench run posttrain_published`)", "",
           "LoRA/QLoRA under FSDP or ZeRO, FSDP CPU offload, ZeRO-Offload on one GPU and long-context recipes, as "
           "published (sources per row: a pinned commit and line). Memory error = predicted ÷ published − 1 in the "
           "published kind (allocated, reserved, or the device total nvidia-smi/pynvml shows); a run that ran should be "
           "judged to fit, an OOM not to. Calibration = C9, C10 (shared/calibration.md); nothing is fitted on "
           "validation, and validation is no gate. Targets on validation: memory median ≤ 10 %, longest context "
           "median ≤ 15 %, every verdict right.", "",
           "| summary | kind | figure |", "| --- | --- | --- |"]
    for kind in ("validation", "calibration"):
        out.append(f"| memory | {kind} | {_mem(s[kind]['memory'])} |")
        if s[kind]["time"]["runs"]:
            out.append(f"| time | {kind} | {_mem(s[kind]['time']).replace('memory figure', 'time figure')} |")
        out.append(f"| ran / OOM | {kind} | {_verdict(s[kind]['verdicts'])} |")
    lc = s["longest_context"]
    out.append("| longest context | validation | " + ("not yet available (" + SOURCES["longest"] + ")" if lc is None
                                                        else _mem(lc).replace("memory figure", "boundary")
                                                        + " · " + _verdict(lc["verdicts"])) + " |")
    for name in (n for n in s["not_yet_available"] if n != "longest"):
        out.append(f"| {name} rows | — | not yet available ({SOURCES[name]}) |")
    out += ["", "By family (this module's runs):", "", "| family | memory | ran / OOM |", "| --- | --- | --- |"]
    out += [f"| {f} | {_mem(st['memory'])} | {_verdict(st['verdicts'])} |" for f, st in s["families"].items()]
    out += ["", "## Runs", "", "| run | GPUs | as published | published | predicted | error | judged | source |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in own:
        run = by_id[r["id"]]
        pub = f"{run.value:g} GiB {run.metric.replace('_', ' ')}" if run.value is not None else run.metric
        if "not_expressible" in r:
            cells = ["—", f"not expressible: {r['not_expressible']}", "—"]
        else:
            cells = [f"{r['predicted']:.2f} GiB" if "predicted" in r else "—",
                     f"{r['error']:+.1%}" if "error" in r else "—",
                     ("fits" if r["fits"] else "does not fit")
                     + (" ✓" if bool(r["fits"]) == (r["expected"] == "ran") else " ✗")]
        note = f" ({run.note})" if run.note else ""
        out.append(f"| {run.id} | {run.gpus} | {run.published_setup}{note} | {pub} | " + " | ".join(cells)
                   + f" | {run.source} |")
    out += ["", "Flags each run is expressed with: `RUNS` in bench/targets/posttrain_published.py (`flags`).", "",
            "Left out (not a stated run): " + "; ".join(LEFT_OUT) + "."]
    return "\n".join(out) + "\n"


def table_rows(s: dict) -> list[dict]:
    """The page's published-runs lines (bench/report.py)."""
    out = []
    for kind in ("calibration", "validation"):
        m, v = s[kind]["memory"], s[kind]["verdicts"]
        out.append({"table": "published", "runs": f"post-training (LoRA/QLoRA, offload, long context): memory "
                    f"({m['with_memory']} of {m['runs']} compared)", "kind": kind, "n": m["with_memory"],
                    "median |error|": "—" if m["median_abs"] is None else pct(m["median_abs"], False),
                    "worst": "—" if m["worst"] is None else pct(m["worst"])})
        t = s[kind]["time"]
        if t["with_memory"]:  # (memory_stats counts any compared error as with_memory)
            out.append({"table": "published", "runs": f"post-training: step time ({t['with_memory']} of {t['runs']} "
                        "compared)", "kind": kind, "n": t["with_memory"], "median |error|": pct(t["median_abs"], False),
                        "worst": pct(t["worst"])})
        out.append({"table": "published", "runs": "post-training: ran judged to fit / OOM judged not to",
                    "kind": kind, "n": v["ran"] + v["oom"],
                    "median |error|": f"{v['ran_fits'] + v['oom_not_fits']} of {v['ran'] + v['oom']} right",
                    "worst": "—"})
    return out


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    own = [evaluate(r) for r in RUNS]
    others = {"c9": optional_rows("fsdp_qlora_c9", "c9_rows", KINDS[0]),
              "c10": optional_rows("alst_c10", "c10_rows", KINDS[0]),
              "longest": longest_rows(),
              "rl": optional_rows("rl_published", "rows")}
    s = summarise(own, others)
    text = render(own, s)
    print(text)
    m, v = s["validation"]["memory"], s["validation"]["verdicts"]
    figure = ("validation: memory " + ("—" if m["median_abs"] is None else f"{m['median_abs']:.1%}")
              + f" median ({m['with_memory']}/{m['runs']}), verdicts {v['ran_fits'] + v['oom_not_fits']}/"
              + f"{v['ran'] + v['oom']} right")
    record("posttrain_published", "published post-training runs (LoRA/QLoRA, offload, long context) vs published",
           "validation: memory median ≤ 10 %, longest context ≤ 15 %, every ran/OOM verdict right", figure,
           {"summary": s, "runs": own}, "published", rows=table_rows(s),
           machine="published GPU runs; predictions by the analytic engine")
    path = results_dir() / "posttrain_published.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    main()
