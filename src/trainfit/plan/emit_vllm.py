"""`--emit vllm` (with --mode serve): the `vllm serve` command line that runs the setup trainfit sized.

Every flag is vLLM 0.33's own (engine/arg_utils.py EngineArgs: each field is the flag with dashes), so the engine
starts with the settings the estimate assumed: the model's dtype, TP/PP, the memory fraction, the lengths and
batch limits the profile run and the CUDA graphs are sized from, the block size, the KV dtype and quantisation.
"""
from __future__ import annotations

import json
import shlex

from ..estimate import Serving
from ..models.resolve import serving_ref
from ..setup import Setup

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --dtype
KV_DTYPES = {"fp8": "fp8", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --kv-cache-dtype (fp8 = e4m3)


def vllm_command(model: str, setup: Setup, serving: Serving) -> str:
    """`model`: the model's reference as given (a catalog name, hub id or config.json path: models.resolve.serving_ref
    turns it into what --model takes); `serving`: the estimate's resolved engine settings (Estimate.detail.serving,
    analytic/serving.py)."""
    k = serving.knobs
    args = ["vllm", "serve", serving_ref(model), "--dtype", DTYPES[setup.precision],
            "--tensor-parallel-size", str(setup.tp), "--pipeline-parallel-size", str(setup.pp),
            "--gpu-memory-utilization", f"{k['gpu_memory_utilization']:g}",
            "--max-model-len", str(serving.max_model_len),
            "--max-num-batched-tokens", str(k["max_num_batched_tokens"]),
            "--max-num-seqs", str(k["max_num_seqs"]), "--block-size", str(k["block_size"])]
    # a KV dtype that is the model's own is vLLM's default "auto" (CacheDType in every release): written only where it
    # differs, since 0.8.5 and 0.10.1 know no "bfloat16" (their CacheDType: auto and the fp8 kinds)
    if setup.kv_dtype is not None and setup.kv_dtype != setup.precision:
        args += ["--kv-cache-dtype", KV_DTYPES.get(setup.kv_dtype, setup.kv_dtype)]
    if setup.quant:
        args += ["--quantization", setup.quant]
    if setup.enforce_eager:
        args.append("--enforce-eager")
    if setup.kv_cache_memory:  # EngineArgs.kv_cache_memory_bytes: the KV budget taken as given (analytic/serving.py)
        args += ["--kv-cache-memory-bytes", str(setup.kv_cache_memory)]
    if setup.draft_model:  # NB: the number of speculative tokens is a throughput choice, not a memory one
        draft = serving_ref(setup.draft_model, field="draft_model")
        args += ["--speculative-config", json.dumps({"model": draft, "num_speculative_tokens": 4})]
    return shlex.join(args)
