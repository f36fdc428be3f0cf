"""Serving capacity (--mode serve, analytic/serving.py) against published vLLM start-up logs.

trainfit models vLLM 0.33. The published runs used older vLLMs whose start-up formula differed; each case is
recomputed with ITS version's formula from trainfit's own terms (weights, the profile run's activation peak, the
CUDA context and cuBLAS workspace of data/overheads.toml), so what is checked is the terms, not a refit:

  late 2023 (v0.2.x, after PR #2031 "Fix peak memory profiling", worker.py profile_num_available_blocks):
      blocks = (total × util − (total − free after the profile run)) // block bytes
      (everything in use counts: weights, the profile run's cached activations, the CUDA context, cuBLAS);
      the profile run: max(max_model_len, 2048) tokens over 256 sequences, no CUDA graphs subtracted.
  v0.6 (worker.py determine_num_available_blocks, its log line "Memory profiling results: total_gpu_memory=...
      peak_torch_memory=... non_torch_memory=... kv_cache_size=..."):
      kv = total × util − peak torch (weights + activation peak) − non-torch (context, cuBLAS);
      without chunked prefill the profile run is max_model_len tokens.
  0.33 (trainfit's model): see analytic/serving.py.

Calibration (C4, ../shared/calibration.md; fitting allowed, nothing fitted) and validation (never fitted) rows.

SGLang (--server sglang, analytic/serving_sglang.py): published "KV Cache is allocated. #tokens: N" and
"max_total_num_tokens=N" lines, checked out of sample (never fitted): max_total_num_tokens = (free memory at start ×
mem_fraction_static − weights) // cell. The published runs used SGLang 0.4.x, whose formula is 0.5.23's (0.4.3.post4
model_executor/model_runner.py:608-633 profile_max_num_token: rest = free after the weights − free at start × (1 −
fraction), // cell_size); where the log prints its free memory at start ("Load weight begin. avail mem") and the
weights ("mem usage" at "Load weight end"), the error is split between those two terms.
vLLM V1 start-up lines (--server vllm==VERSION, analytic/serving.py serve_memory at the version's facts,
data/servers.toml): C11 (../shared/calibration.md; the non-torch constant is fitted on it, nothing else) line by line,
and the vLLM half of vllm-project/vllm#21348 (validation, never fitted): its "Available KV cache memory" and "GPU KV
cache size" lines. Targets (issue 42): peak activation within 15 %, KV pool within 10 %.
Run: python -m bench run serving_published
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace

from bench.figures import pct, record
from bench import ROOT
from trainfit import nccl_buffers, overheads
from trainfit.analytic.inference import kv_bytes_per_token
from trainfit.analytic.params import count_params
from trainfit.analytic.serving import forward_transient, sampler_transient, serve_memory, weights_per_gpu, Knobs
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

ABOUT = {"summary": "vLLM KV blocks and SGLang token pools vs published start-up logs", "minutes": 0.3, "quick": None}

GiB = 2**30


@dataclass(frozen=True)
class Case:
    label: str
    source: str
    kind: str  # "calibration" or "validation"
    model: str
    gpu: str
    total_gib: float | None  # the total the log prints (None: the catalog's)
    precision: str
    utilization: float
    max_model_len: int
    formula: str  # "v0.2" or "v0.6"
    published_blocks: int


CASES = [
    Case("C4: Llama-2-7B, A100-80GB, fp16, util 0.9", "vLLM PR #2031 (calibration C4)", "calibration",
         "llama-2-7b", "A100-80GB", None, "fp16", 0.9, 4096, "v0.2", 7351),
    Case("Llama-3.1-8B-Instruct, RTX 3090, bf16, util 0.9, max-model-len 20000",
         "vllm-project/vllm#10517 (2024-12-02 comment: 1952 GPU blocks)", "validation",
         "llama-3.1-8b", "RTX-3090", 23.58, "bf16", 0.9, 20000, "v0.6", 1952),
    Case("Llama-3.1-8B-Instruct, RTX 3090, bf16, util 0.9, max-model-len 29000",
         "vllm-project/vllm#10517 (2024-12-02 comment: 1478 GPU blocks)", "validation",
         "llama-3.1-8b", "RTX-3090", 23.58, "bf16", 0.9, 29000, "v0.6", 1478),
]


def legacy_blocks(case: Case) -> tuple[int, dict]:
    """Blocks by the case's vLLM formula, from trainfit's terms."""
    spec = load_model(case.model)
    gpu = get_gpu(case.gpu)
    total = case.total_gib * GiB if case.total_gib else gpu.memory
    setup = Setup(mode="serve", precision=case.precision, max_model_len=case.max_model_len,
                  gpu_memory_utilization=case.utilization)
    pc = count_params(spec)
    weights = weights_per_gpu(spec, setup, pc)
    tokens = max(case.max_model_len, 2048) if case.formula == "v0.2" else case.max_model_len
    knobs = Knobs(case.utilization, case.max_model_len, tokens, 256, 16, case.precision, ())
    act = max(forward_transient(spec, setup, tokens), sampler_transient(spec, setup, knobs))
    non_torch = overheads.cuda_context(gpu) + overheads.blas_workspace(gpu)
    kv = total * case.utilization - weights - act - non_torch
    block = 16 * kv_bytes_per_token(spec, setup.with_(kv_dtype=case.precision))
    terms = {"total": total, "weights": weights, "activations": act, "non_torch": non_torch, "kv": kv}
    return int(kv // block), terms


def rows() -> list[tuple[Case, int, float]]:
    out = []
    for c in CASES:
        blocks, _ = legacy_blocks(c)
        out.append((c, blocks, (blocks - c.published_blocks) / c.published_blocks))
    return out


@dataclass(frozen=True)
class SglangCase:
    label: str
    source: str
    config: dict  # the model's config.json values over a catalog entry of its family (HF config.json of the model)
    base: str
    gpu: str
    tp: int
    quant: str | None
    mem_fraction_static: float
    published_tokens: int
    published_k_gib: float  # "K size: x GB" (GB = 2**30, mem_cache/memory_pool.py:2083-2090)
    published_pre_gib: float | None = None  # "Load weight begin. avail mem=x GB": the free memory at start
    published_weights_gib: float | None = None  # "Load weight end. ... mem usage=x GB" (or begin − end avail mem)
    # NCCL communicators the run's SGLang opens before its baseline: pynccl's tp communicator; 0.4.3.post4 also
    # all-reduces a CUDA tensor on torch's default (NCCL) group there (srt/utils.py:225-229, get_available_gpu_memory
    # with distributed=True), from 0.4.9 on the gloo group (0.4.9.post2 srt/utils.py:417-421): trainfit counts one
    communicators: int = 1
    published_dist_gib: float | None = None  # "Init torch distributed ends. mem usage=x GB"


SGLANG_CASES = [
    SglangCase("Qwen3-235B-A22B-FP8, 4× H100-80GB, tp 4, mem-fraction-static 0.93",
               "vllm-project/vllm#21348 (SGLang log: KV Cache is allocated. #tokens: 367404, K size: 8.23 GB)",
               # HF Qwen/Qwen3-235B-A22B config.json: hidden 4096, 94 layers, 64 heads, 4 kv heads, head_dim 128,
               # 128 experts of 1536, 8 active, vocab 151936, 40960 positions
               {"hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                "num_attention_heads": 64, "num_hidden_layers": 94, "max_window_layers": 94},
               "qwen3-30b-a3b", "H100-80GB", 4, "fp8", 0.93, 367404, 8.23),
    SglangCase("Llama-3.1-8B-Instruct, H100-80GB, tp 1, mem-fraction-static 0.88 (SGLang 0.4.1's default at tp 1)",
               "SGLang docs, Quick Start: Sending Requests (docs.sglang.ai/start/send_request.html, notebook run "
               "2025-01-23: avail mem 78.81 -> 63.72 GB, K size 27.13 GB, max_total_num_tokens=444500)",
               {}, "llama-3.1-8b", "H100-80GB", 1, None, 0.88, 444500, 27.13, 78.81, 78.81 - 63.72),
    SglangCase("Llama-3.1-8B-Instruct, H100 (FA3), tp 1, mem-fraction-static 0.88 (SGLang 0.4.4's default)",
               "sgl-project/sglang PR #4760 (test log 2025-03-25: avail mem 63.48 GB, mem usage 15.11 GB, "
               "#tokens: 442750, K size: 27.02 GB)",
               {}, "llama-3.1-8b", "H100-80GB", 1, None, 0.88, 442750, 27.02, 63.48 + 15.11, 15.11),
    SglangCase("QwQ-32B (Qwen2.5-32B architecture), 4× L4, tp 4, mem-fraction-static 0.85 (0.4.3.post4's at tp 4)",
               "didier-durand/llms-in-clouds docs (SGLang 0.4.3.post4 start-up on a g6.12xlarge: avail mem 21.63 "
               "GB, mem usage 15.54 GB, #tokens: 46611, K size: 1.42 GB)",
               {}, "qwen2.5-32b", "L4", 4, None, 0.85, 46611, 1.42, 21.63, 15.54, communicators=2,
               published_dist_gib=0.13),
]


def sglang_spec(case: SglangCase):
    if not case.config:  # the catalog's config.json is the model's
        return load_model(case.base)
    import json
    import os
    import tempfile

    base = ROOT / "src" / "trainfit" / "models" / "catalog" / f"{case.base}.json"
    with open(base) as f:
        cfg = json.load(f)
    cfg.pop("_trainfit", None)
    cfg.update(case.config)
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return load_model(folder)


def sglang_rows() -> list[tuple[SglangCase, object, float]]:
    from trainfit.analytic import serving_sglang as sg

    out = []
    for c in SGLANG_CASES:
        setup = Setup(mode="serve", server="sglang", precision="bf16", tp=c.tp, quant=c.quant,
                      mem_fraction_static=c.mem_fraction_static)
        gpu = get_gpu(c.gpu)
        # the version's further communicators (NVLS off under SGLang) are taken off the memory serve_memory starts
        # from, so its free memory at start is the run's
        extra = (c.communicators - 1) * nccl_buffers.communicator_bytes(gpu, c.tp, 0)
        sv = sg.serve_memory(sglang_spec(c), setup, replace(gpu, memory=gpu.memory - extra))
        out.append((c, sv, (sv.kv_tokens - c.published_tokens) / c.published_tokens))
    return out


def dist_init_bytes(case: SglangCase) -> int:
    """What the run's distributed init holds by trainfit's terms: its NCCL communicators (NVLS off) + SGLang's custom
    all-reduce buffers."""
    gpu = get_gpu(case.gpu)
    setup = Setup(mode="serve", server="sglang", precision="bf16", tp=case.tp)
    return case.communicators * nccl_buffers.communicator_bytes(gpu, case.tp, 0) + \
        overheads.custom_allreduce_bytes(gpu, setup)


def log_terms_tokens(case: SglangCase, cell: float) -> int:
    """The formula on the log's own free memory at start and weights (GiB to 2 decimals), trainfit's cell."""
    rest = case.published_pre_gib * case.mem_fraction_static - case.published_weights_gib
    return int(rest * GiB // cell)


@dataclass(frozen=True)
class V1Case:
    label: str
    source: str
    kind: str  # "calibration" or "validation"
    model: str  # a catalog name, or an SglangCase's spec (sglang_spec) by its label
    server: str  # --server: the vLLM version modelled
    total_gib: float  # CUDA's total the log prints (or the GPU's)
    tp: int
    quant: str | None
    utilization: float
    max_model_len: int | None
    published: dict  # GiB by line: weights, activation, non_torch, kv; "kv_tokens" a count


V1_CASES = [
    V1Case("C11: Llama-3.1-8B-Instruct, H100, max-model-len 16000, util 0.9",
           "llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md (calibration C11)", "calibration",
           "llama-3.1-8b", "vllm==0.11.0", 79.18, 1, None, 0.9, 16000,
           {"weights": 14.99, "activation": 4.76, "non_torch": 0.13, "kv": 51.38}),
    V1Case("Qwen3-235B-A22B-FP8, 4x H100, tp 4, util 0.9 (vLLM of 2025-07, modelled with 0.11.0's facts)",
           "vllm-project/vllm#21348 (Available KV cache memory: 8.11 GiB, GPU KV cache size: 178,880 tokens; "
           "run with an LMCache KV connector)", "validation",
           SGLANG_CASES[0].label, "vllm==0.11.0", 79.18, 4, "fp8", 0.9, None, {"kv": 8.11, "kv_tokens": 178880}),
]


def v1_rows() -> list[tuple[V1Case, object, dict]]:
    """(case, trainfit's Serving, {line: relative error}) of each vLLM V1 start-up log."""
    out = []
    for c in V1_CASES:
        spec = next((sglang_spec(s) for s in SGLANG_CASES if s.label == c.model), None) or load_model(c.model)
        setup = Setup(mode="serve", server=c.server, precision="bf16", tp=c.tp, quant=c.quant,
                      gpu_memory_utilization=c.utilization, max_model_len=c.max_model_len)
        sv = serve_memory(spec, setup, replace(get_gpu("H100-80GB"), memory=int(c.total_gib * GiB)))
        ours = {"weights": sv.weights / GiB, "activation": sv.activations / GiB, "non_torch": sv.non_torch / GiB,
                "kv": sv.available_kv / GiB, "kv_tokens": sv.kv_tokens}
        out.append((c, sv, {k: (ours[k] - v) / v for k, v in c.published.items()}))
    return out


def table_rows(values: dict) -> list[dict]:
    """The page's published-runs lines (bench/report.py): vLLM's C4 (calibration) and the other start-up logs."""
    errs = {**values["vllm"], **values["sglang"]}
    c4 = [e for k, e in errs.items() if k.startswith("C4")]
    others = [e for k, e in errs.items() if not k.startswith("C4")]
    v1 = [(k, e) for k, e in values.get("vllm_v1", {}).items() if k.endswith(":kv")]
    v1_rows_out = [{"table": "published", "runs": f"serving: vLLM V1 start-up, {kind} (available KV)", "kind": kind,
                    "n": len(errs_), "median |error|": pct(statistics.median(map(abs, errs_)), False),
                    "worst": pct(max(errs_, key=abs))}
                   for kind in ("calibration", "validation")
                   for errs_ in [[e for k, e in v1 if k.startswith("C11") == (kind == "calibration")]] if errs_]
    return v1_rows_out + [{"table": "published", "runs": "serving: vLLM C4 (KV blocks)", "kind": "calibration", "n": len(c4),
             "median |error|": pct(statistics.median(map(abs, c4)), False), "worst": pct(max(c4, key=abs))},
            {"table": "published", "runs": "serving: vLLM and SGLang start-up logs", "kind": "validation",
             "n": len(others), "median |error|": pct(statistics.median(map(abs, others)), False),
             "worst": pct(max(others, key=abs))}]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("| case | source | kind | published blocks | trainfit | error |")
    print("|---|---|---|---:|---:|---:|")
    vllm = rows()
    for c, blocks, err in vllm:
        print(f"| {c.label} | {c.source} | {c.kind} | {c.published_blocks:,} | {blocks:,} | {err:+.1%} |")
    # the same model in trainfit's own (0.33) terms, for the record
    sv = serve_memory(load_model("llama-2-7b"), Setup(mode="serve", precision="fp16", max_model_len=4096,
                                                      gpu_memory_utilization=0.9), get_gpu("A100-80GB"))
    print(f"\nC4's model under vLLM 0.33 (trainfit's model): {sv.kv_blocks:,} blocks "
          f"(CUDA graphs {sv.cuda_graphs / GiB:.2f} GiB and no context subtracted; total {sv.cuda_total / GiB:.2f} GiB)")
    print("\n| SGLang case | source | published tokens | trainfit | error | K size published / trainfit's cell | "
          "free at start: log / trainfit | weights: log / trainfit | tokens from the log's own terms | "
          "distributed init: log / trainfit |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    sglang = sglang_rows()
    for c, sg_sv, err in sglang:
        k_gib = c.published_tokens * sg_sv.kv_bytes_per_token / 2 / GiB
        terms = ("—", "—", "—")
        if c.published_pre_gib is not None:
            own = log_terms_tokens(c, sg_sv.kv_bytes_per_token)
            terms = (f"{c.published_pre_gib:.2f} / {sg_sv.pre_model_load / GiB:.2f} GiB",
                     f"{c.published_weights_gib:.2f} / {sg_sv.weights / GiB:.2f} GiB",
                     f"{own:,} ({(own - c.published_tokens) / c.published_tokens:+.2%})")
        dist = f"{c.published_dist_gib:.2f}" if c.published_dist_gib is not None else "—"
        print(f"| {c.label} | {c.source} | {c.published_tokens:,} | {sg_sv.kv_tokens:,} | {err:+.1%} | "
              f"{c.published_k_gib:.2f} / {k_gib:.2f} GiB | {' | '.join(terms)} | "
              f"{dist} / {dist_init_bytes(c) / GiB:.2f} GiB |")
    print("\n| vLLM V1 case | source | kind | line | published | trainfit | error |")
    print("|---|---|---|---|---:|---:|---:|")
    v1 = v1_rows()
    for c, sv, errs_ in v1:
        for line, e in errs_.items():
            pub = c.published[line]
            fmt = (lambda x: f"{x:,.0f}") if line == "kv_tokens" else (lambda x: f"{x:.2f} GiB")
            print(f"| {c.label} | {c.source} | {c.kind} | {line} | {fmt(pub)} | {fmt(pub * (1 + e))} | {e:+.1%} |")
    errs = [(c.label, e) for c, _, e in vllm] + [(c.label, e) for c, _, e in sglang]
    worst = max(errs, key=lambda x: abs(x[1]))
    values = {"vllm": {c.label: e for c, _, e in vllm}, "sglang": {c.label: e for c, _, e in sglang},
              "vllm_v1": {f"{c.label}:{line}": e for c, _, errs_ in v1 for line, e in errs_.items()}}
    record("serving_published", "serving capacity vs published vLLM and SGLang start-up logs",
           "C4 within 3 %, others within 5 %",
           f"{len(vllm)} vLLM and {len(sglang)} SGLang start-up logs: worst {worst[1]:+.1%}",
           values, "published", rows=table_rows(values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
