"""`--emit vllm` (with --mode serve): the `vllm serve` command line that runs the setup trainfit sized.

Every flag is vLLM 0.33's own (engine/arg_utils.py EngineArgs: each field is the flag with dashes) and is checked
against the --server release's own parser (data/serve_flags.json), so the engine
starts with the settings the estimate assumed: the model's dtype, TP/PP, the memory fraction, the lengths and
batch limits the profile run and the CUDA graphs are sized from, the block size, the KV dtype and quantisation.
"""
from __future__ import annotations

import json
import shlex

from .. import serving_versions
from ..errors import SetupError
from ..estimate import Serving
from ..models.hf_config import quant_method
from ..models.resolve import locate, serving_ref
from ..setup import Setup

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --dtype
KV_DTYPES = {"fp8": "fp8", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --kv-cache-dtype (fp8 = e4m3)
# --quant methods whose weights the engine loads already quantised: it reads the checkpoint's
# config.json quantization_config (vLLM ModelConfig._verify_quantization, vllm/config/model.py: its quant_method
# must match --quantization; model_executor/model_loader/weight_utils.py get_quant_config builds the AWQ/GPTQ config
# from it, else "Cannot find the config file for awq", vllm-project/vllm 0035bdf2). fp8 quantises bf16 weights at load.
PREQUANTISED = ("awq", "gptq")


def model_argument(model: str, setup: Setup, emit: str) -> str:
    """What the engine's model argument takes for `model` (serving_ref); under --quant awq/gptq only a checkpoint
    whose config.json says that quant_method (a local config, or a hub id's in the HF cache): the engine cannot
    load a 16-bit checkpoint as AWQ/GPTQ."""
    why = unloadable(model, setup.quant)
    if why:
        raise SetupError(f"--emit {emit} --quant {setup.quant}: {why}: pass the {setup.quant.upper()} checkpoint's "
                         "config.json or folder as MODEL, or drop --emit")
    return serving_ref(model)


def checkpoint_quant(model: str) -> str | None:
    """The quant_method of `model`'s config.json (a local config, or a hub id's in the HF cache), lower case; None
    for a 16-bit checkpoint or a catalog model."""
    found = locate(model)
    if found.path is None:
        return None
    with open(found.path, encoding="utf-8") as f:
        return quant_method(json.load(f))


def unloadable(model: str, quant: str | None) -> str | None:
    """Why the engine cannot load `model` under --quantization `quant` (awq/gptq: only a checkpoint whose config.json
    says that quant_method; vLLM ModelConfig._verify_quantization, weight_utils.get_quant_config), else None."""
    if quant not in PREQUANTISED:
        return None
    method = checkpoint_quant(model)
    if method == quant:
        return None
    q = quant.upper()
    has = f"has quant_method {method!r}" if method else "has none (16-bit weights)"
    return (f"the engine loads {q} weights only from a {q} checkpoint (its config.json's "
            f"quantization_config.quant_method), and {model} {has}")


def vllm_command(model: str, setup: Setup, serving: Serving) -> str:
    """`model`: the model's reference as given (a catalog name, hub id or config.json path: models.resolve.serving_ref
    turns it into what --model takes); `serving`: the estimate's resolved engine settings (Estimate.detail.serving,
    analytic/serving.py)."""
    k = serving.knobs
    args = ["vllm", "serve", model_argument(model, setup, "vllm"), "--dtype", DTYPES[setup.precision],
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
    release = serving_versions.of(setup)  # (every flag above is 0.33's; an older release's parser may lack one)
    lacks = [a for a in args if a.startswith("--") and not serving_versions.has_flag(release, a)]
    if lacks:
        raise SetupError(f"--emit vllm: {release.label}'s `vllm serve` has no {', '.join(lacks)} "
                         "(data/serve_flags.json): give a release that has them with --server, or drop --emit")
    return shlex.join(args)
