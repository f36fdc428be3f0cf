"""A corpus of bad command lines: each one must be refused with exactly one line on stderr starting with
`error:` (what is wrong and how to fix it), exit code 2, and no traceback — never a silently wrong answer.

The cases run in-process (`trainfit.cli.main(argv)`), a few through the real `trainfit` entry point. Every case
is refused before any heavy work (no trace or measurement runs to completion). Settings are validated once, by
their definition in trainfit/setup/settings.py.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli.shared_folder import left_unwritten
from trainfit.cli import main

TINY_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 512}


def _cfg(**changes) -> str:
    d = {k: v for k, v in {**TINY_LLAMA, **changes}.items() if v is not _DROP}
    return json.dumps(d)


_DROP = object()
_LLAMA_TEXT = json.dumps(TINY_LLAMA, indent=1)

# name -> file contents (bytes, or text written as UTF-8). Referenced in argv as {cfg:name}.
CONFIGS: dict[str, bytes | str] = {
    "binary": bytes(range(256)) * 4,
    "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 32,
    "latin1": _LLAMA_TEXT.replace('"llama"', '"llam\u00e9"').encode("latin-1"),
    "utf16": _LLAMA_TEXT.encode("utf-16"),
    "nan": _LLAMA_TEXT.replace('"hidden_size": 256', '"hidden_size": NaN'),
    "infinity": _LLAMA_TEXT.replace('"intermediate_size": 688', '"intermediate_size": Infinity'),
    "neg-infinity": _LLAMA_TEXT.replace('"vocab_size": 2000', '"vocab_size": -Infinity'),
    "nan-unused-key": _LLAMA_TEXT.replace("{", '{"rope_theta": NaN,', 1),
    "overflow-float": _LLAMA_TEXT.replace('"num_hidden_layers": 4', '"num_hidden_layers": 1e400'),
    "huge-int": _cfg(hidden_size=10**400),
    "absurd-int": _cfg(vocab_size=10**15),
    "empty": b"",
    "blank": "  \n\t\n",
    "array": "[1, 2, 3]",
    "array-of-config": f"[{_LLAMA_TEXT}]",
    "string": '"llama"',
    "number": "42",
    "null": "null",
    "truncated": _LLAMA_TEXT[:-20],
    "trailing-comma": _LLAMA_TEXT[:-2] + ",\n}",
    "comment": "// my model\n" + _LLAMA_TEXT,
    "deep": "[" * 200_000 + "]" * 200_000,
    "no-model-type": _cfg(model_type=_DROP),
    "unknown-model-type": _cfg(model_type="xlnet"),
    "int-model-type": _cfg(model_type=7),
    "multimodal": json.dumps({"model_type": "llava", "text_config": TINY_LLAMA}),
    "no-hidden": _cfg(hidden_size=_DROP),
    "hidden-zero": _cfg(hidden_size=0),
    "hidden-negative": _cfg(hidden_size=-256),
    "hidden-fraction": _cfg(hidden_size=256.5),
    "hidden-string": _cfg(hidden_size="256"),
    "hidden-bool": _cfg(hidden_size=True),
    "hidden-list": _cfg(hidden_size=[256]),
    "layers-zero": _cfg(num_hidden_layers=0),
    "heads-zero": _cfg(num_attention_heads=0),
    "heads-not-dividing": _cfg(num_attention_heads=3, num_key_value_heads=3),
    "kv-not-dividing": _cfg(num_key_value_heads=3),
    "kv-zero": _cfg(num_key_value_heads=0),
    "vocab-zero": _cfg(vocab_size=0),
    "intermediate-negative": _cfg(intermediate_size=-1),
    "positions-zero": _cfg(max_position_embeddings=0),
    "head-dim-zero": _cfg(head_dim=0),
    "tie-string": _cfg(tie_word_embeddings="yes"),
    "act-number": _cfg(hidden_act=5),
    "mixtral-topk": _cfg(model_type="mixtral", num_local_experts=2, num_experts_per_tok=4),
    "mixtral-no-experts": _cfg(model_type="mixtral", num_experts_per_tok=2),
    "moe-only-layers-string": _cfg(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=64, shared_expert_intermediate_size=64, mlp_only_layers="0,1"),
    "gpt2-not-dividing": json.dumps({"model_type": "gpt2", "n_embd": 100, "n_head": 3, "n_layer": 2, "vocab_size": 50,
                                     "n_positions": 64}),
    "bert-relative": json.dumps({"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                                 "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
                                 "position_embedding_type": "relative_key"}),
    "roberta-pad-offset": json.dumps({"model_type": "roberta", "hidden_size": 64, "num_attention_heads": 4,
                                      "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100,
                                      "max_position_embeddings": 64, "pad_token_id": 100}),
    "sliding-negative": _cfg(model_type="mistral", sliding_window=-1),
}



def C(line: str, needle: str | None = None, *, marks=(), id: str | None = None):
    """One case: the argv as a shell line ({cfg:NAME} and {tmp} are filled in), an optional word the error
    must contain."""
    return pytest.param(line, needle, marks=marks, id=id or line)


CASES = [
    # ---- the command line itself -------------------------------------------------------------------------
    C("no-such-command", "No such command"),
    C("estimate", "Missing argument"),
    C("estimate llama-3.1-8b --no-such-flag", "--no-such-flag"),
    C("estimate llama-3.1-8b extra-positional", "unexpected extra argument"),
    # a flag that does not apply to the mode is refused when written at its default value too (its value alone
    # cannot tell it from an unwritten flag: options.written reads click's parameter source)
    C("estimate tiny-llama --rl-algo grpo", "--rl-algo applies to rl only"),
    C("estimate tiny-llama --mode infer --grad-accum 1", "--grad-accum applies to train/rl only"),
    C("estimate tiny-llama --mode train --max-num-seqs 256", "--max-num-seqs applies to serve only"),
    # a --reserve or --gpu-memory that leaves the step nothing is the question's error, not a negative capacity
    C("estimate llama-3.2-1b --gpu H100-80GB --reserve 100", "leave nothing for the step"),
    C("estimate llama-3.2-1b --gpu H100-80GB --gpu-memory 0.001", "leave nothing for the step"),
    C("fit llama-3.1-8b --gpu H100-80GB --reserve 100", "leave nothing for the step"),
    C("fit llama-3.1-8b --gpu H100-80GB --longest-context --seq 4096", "drop --seq"),
    C("fit llama-3.1-8b --gpu H100-80GB --mode rl", "use `trainfit estimate --mode rl`"),
    C("fit llama-3.1-8b --gpu H100-80GB --mode serve", "`trainfit plan --mode serve`"),
    # what the GPU lacks (a recipe's tensor cores, TF32) is the setup's refusal, as estimate gives it: no search on
    # that GPU lifts it (before: every candidate refused, "nothing trainfit tried fits", exit 0)
    C("fit llama-3.1-8b --gpu H100-80GB --stack torchtitan --low-precision mxfp8 --seq 8192",
      "mxfp8 tensor cores, which H100-80GB has not"),
    C("fit llama-3.1-8b --gpu A100-80GB --stack torchtitan --low-precision tensorwise --longest-context",
      "fp8 tensor cores, which A100-80GB has not"),
    C("fit llama-3.2-1b --gpu V100-32GB --precision fp32 --tf32", "--tf32 runs fp32 matmuls on TF32 tensor cores"),
    # ---- the caching allocator's settings (issue 13) ------------------------------------------------------------
    C("estimate tiny-llama --alloc-conf max_split_size_mb:5", "max_split_size_mb too small"),
    C("estimate tiny-llama --alloc-conf expandable_segment:True", "unknown key"),
    C("estimate tiny-llama --alloc-conf garbage_collection_threshold:2", "garbage_collection_threshold"),
    C("estimate tiny-llama --alloc-conf roundup_power2_divisions:3", "power of 2"),
    # ---- the 3D-parallel stacks (issue 12) ---------------------------------------------------------------------
    C("estimate tiny-llama --stack megatron --engine trace --device cpu", "use --engine analytic"),
    C("estimate tiny-llama --stack deepspeed --engine trace --device cpu", "use --engine analytic"),
    C("estimate tiny-llama --stack deepspeed --engine measure --device cpu --zero 2 --dp 2 --offload optimizer",
      "--offload"),
    C("estimate tiny-llama --stack deepspeed --engine measure --device cpu --zero 1 --dp 2 --precision amp-bf16",
      "--precision amp-bf16"),
    C("estimate llama-3.1-8b --cp 2", "use --stack torchtitan or megatron"),
    C("estimate llama-3.1-8b --stack megatron --vpp 2", "needs --pp > 1"),
    C("estimate llama-3.1-8b --stack megatron --pp 2 --pp-split first:0", "first:N,last:M"),
    C("estimate llama-3.1-8b --stack megatron --ep 2 --dp 2", "mixture-of-experts"),
    C("estimate llama-3.1-8b --stack deepspeed --offload params --zero 2 --dp 2", "--zero 3"),
    C("estimate llama-3.1-8b --stack torchtitan --zero 3 --dp 2 --offload activations --offload params",
      "--offload activations"),
    C("estimate llama-3.1-8b --mode serve", "add --gpu"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --batch 4", "--batch applies"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --engine trace", "which the trace engine does not run"),
    C("timeline tiny-llama --mode serve -o {tmp}/t.png", "use `trainfit estimate --mode serve`"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --kv-cache-memory 0", "positive number of bytes"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --gpu-memory-utilization 0", "--gpu-memory-utilization"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --kv-cache-dtype int8", "bf16, fp16 or fp8"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --max-model-len 999999", "max_position_embeddings"),
    C("estimate llama-3.1-8b --mode serve --gpu H100-80GB --quant nf4", "--quant"),
    C("estimate llama-3.1-8b --gpu H100-80GB --emit vllm", "--mode serve"),
    C("estimate llama-3.1-8b --gpu-memory-utilization 0.5", "serve only"),
    C("estimate gemma-2-9b --mode serve --gpu H100-80GB --draft-model gemma-2-2b", "target of several cache kinds"),
    C("plan llama-3.1-8b --mode serve --gpu H100-80GB", "--concurrency"),
    C("sweep llama-3.1-8b --mode serve --gpu H100-80GB --vary batch 1:8", "trainfit estimate --mode serve"),
    C("plan llama-3.1-8b --concurrency 8 --gpu H100-80GB", "add --mode serve"),
    C("plan llama-3.1-8b --mode serve --concurrency 0 --gpu H100-80GB", "positive integer"),
    # one hourly price for several GPU types would rank them by it alone (an L4 at an H100's price)
    C("plan llama-3.2-1b --gpu H100-80GB --gpus 8 --seq 2048 --price 5", "add --tokens"),  # (as estimate refuses it)
    # a training flag written at its default value asks for training too (estimate refuses it so: options.written)
    C("plan llama-3.2-1b --mode serve --gpu H100-80GB --concurrency 8 --optimizer adamw --seq 2048",
      "--optimizer and --seq apply to --mode train only"),
    C("sweep gpt2 --mode infer --vary batch 1,4 --optimizer adamw", "--optimizer applies to train/rl only"),
    C("estimate llama-3.2-1b --mode serve --gpu H100-80GB --price 3", "--price applies to train only"),
    C("estimate llama-3.2-1b --mode infer --gpu H100-80GB --price 3", "--price applies to train only"),
    C("estimate llama-3.2-1b --mode serve --gpu H100-80GB --server vllm --emit vllm --concurrency 16 --mfu 0.3",
      "which --concurrency, --mfu do not change"),
    C("plan llama-3.2-1b --mode serve --concurrency 32 --gpu H100-80GB,L4 --price 5", "lists 2 types: drop --price"),
    C("plan llama-3.2-1b --mode serve --request-rate 2 --gpu all --price 5", "drop --price"),
    C("plan llama-3.1-8b --mode serve --concurrency 8 --gpu H100-80GB --global-batch-tokens 1M", "--mode train only"),
    C("plan llama-3.1-8b --mode serve --concurrency 8 --gpu H100-80GB --tpot-ms -1", "--tpot-ms"),
    C("plan llama-3.1-8b --mode serve --concurrency 8 --gpu H100-80GB --kv-cache-dtype int8", "bf16, fp16 or fp8"),
    C("plan llama-3.1-8b --mode serve --concurrency 8 --gpu NoSuchGPU", "unknown GPU"),
    C("estimate llama-3.1-8b --offload optimizer,bogus", "unknown bogus"),
    C("estimate llama-3.1-8b --stack deepspeed --offload optimizer --offload params --zero 2 --dp 2", "--zero 3"),
    C("estimate llama-3.1-8b --recompute uniform:2", "use --stack megatron"),
    C("estimate llama-3.1-8b --batch", "--batch"),
    C("models --bogus", "--bogus"),
    C("models extra", "unexpected extra argument"),
    C("gpus --json extra", "unexpected extra argument"),
    C("gpus --bogus", "--bogus"),
    C("plan llama-3.1-8b", "--gpu"),
    C("sweep llama-3.1-8b", "--vary"),
    C("sweep llama-3.1-8b --vary batch", "--vary"),
    C("serve --port 0", "--port"),
    C("serve --port 70000", "--port"),
    C("serve --port http", "--port"),
    # ---- models ------------------------------------------------------------------------------------------
    C("estimate llama-3.1-8bb", "did you mean"),
    C("estimate no-such-model-at-all", "unknown model"),
    C("estimate ''", "model"),
    C("estimate '   '", "model"),
    C("estimate nobody/not-a-cached-model", "not in the local HF cache"),
    C("estimate /nonexistent/config.json", "no such file"),
    # a folder or a device where a file is read is said as it is (references.not_a_file), not "no such file"
    C("check {tmp} --gpu H100-80GB", "a folder, not a file"),
    C("check /dev/null --gpu H100-80GB", "not a regular file"),
    C("check '' --gpu H100-80GB", "'': the path is empty"),  # not "a folder": Path('') is the current folder
    C("explain ''", "'': the path is empty"),
    C("estimate llama-3.1-8b --gpu {tmp}", "a folder, not a file"),
    C("estimate ./missing-folder/", "no such file"),
    C("estimate {tmp}", "config.json", id="estimate <folder without config.json>"),
    C("compare no-such-model", "unknown model"),
    C("measure no-such-model --device cpu", "unknown model"),
    C("plan no-such-model --gpu H100-80GB", "unknown model"),
    C("timeline no-such-model -o {tmp}/t.png", "unknown model"),
    C("sweep no-such-model --vary batch 1:4", "unknown model"),
    C("report no-such-model -o {tmp}/r.html", "unknown model"),
    # ---- config.json files -------------------------------------------------------------------------------
    *[C(f"estimate {{cfg:{name}}}", id=f"estimate config:{name}") for name in CONFIGS],
    C("compare {cfg:nan}", "NaN", id="compare config:nan"),
    C("compare {cfg:latin1}", "UTF-8", id="compare config:latin1"),
    C("measure {cfg:binary} --device cpu", id="measure config:binary"),
    C("measure {cfg:infinity} --device cpu", "Infinity", id="measure config:infinity"),
    C("plan {cfg:array} --gpu H100-80GB", "JSON object", id="plan config:array"),
    C("plan {cfg:overflow-float} --gpu H100-80GB", id="plan config:overflow-float"),
    C("timeline {cfg:utf16} -o {tmp}/t.png", id="timeline config:utf16"),
    C("timeline {cfg:hidden-zero} -o {tmp}/t.png", "hidden_size", id="timeline config:hidden-zero"),
    C("sweep {cfg:empty} --vary batch 1:4", id="sweep config:empty"),
    C("sweep {cfg:deep} --vary seq 128:512", id="sweep config:deep"),
    C("report {cfg:nan} -o {tmp}/r.html", "NaN", id="report config:nan"),
    C("report {cfg:huge-int} -o {tmp}/r.html", id="report config:huge-int"),
    # ---- GPUs --------------------------------------------------------------------------------------------
    C("estimate llama-3.1-8b --gpu H100-8GB", "did you mean"),
    C("estimate llama-3.1-8b --gpu ''", "GPU"),
    C("compare llama-3.1-8b --gpu TPUv5", "unknown GPU"),
    C("plan llama-3.1-8b --gpu H900", "unknown GPU"),
    C("sweep llama-3.1-8b --vary batch 1:4 --gpu H900", "unknown GPU"),
    C("report llama-3.1-8b --gpu H900 -o {tmp}/r.html", "unknown GPU"),
    C("timeline llama-3.1-8b --gpu H900 -o {tmp}/t.png", "unknown GPU"),
    # ---- sizes -------------------------------------------------------------------------------------------
    C("estimate llama-3.1-8b --batch 0", "--batch"),
    C("estimate llama-3.1-8b --batch -1", "--batch"),
    C("estimate llama-3.1-8b --batch 1.5", "--batch"),
    C("estimate llama-3.1-8b --batch many", "--batch"),
    C("estimate llama-3.1-8b --batch ''", "--batch"),
    C("estimate llama-3.1-8b --batch " + "9" * 400, "--batch", id="estimate --batch 9×400"),
    C("estimate llama-3.1-8b --seq 0", "--seq"),
    C("estimate llama-3.1-8b --seq -5", "--seq"),
    C("estimate llama-3.1-8b --seq 4k", "--seq"),
    C("estimate llama-3.1-8b --seq 1e3", "--seq"),
    C("estimate llama-3.1-8b --grad-accum 0", "--grad-accum"),
    C("estimate llama-3.1-8b --grad-accum -2", "--grad-accum"),
    C("estimate llama-3.1-8b --dp 0", "--dp"),
    C("estimate llama-3.1-8b --tp 0", "--tp"),
    C("estimate llama-3.1-8b --pp 0", "--pp"),
    C("estimate llama-3.1-8b --dp -8", "--dp"),
    C("compare llama-3.1-8b --batch 0", "--batch"),
    C("compare llama-3.1-8b --seq -1", "--seq"),
    C("sweep llama-3.1-8b --vary seq 128:512 --batch 0", "--batch"),
    C("report llama-3.1-8b --batch 0 -o {tmp}/r.html", "--batch"),
    C("timeline tiny-llama --batch 0 -o {tmp}/t.png", "--batch"),
    C("timeline tiny-llama --seq 0 -o {tmp}/t.png", "--seq"),
    C("measure tiny-llama --device cpu --batch 0", "--batch"),
    C("measure tiny-llama --device cpu --seq -1", "--seq"),
    # ---- impossible layouts ------------------------------------------------------------------------------
    C("estimate llama-3.1-8b --tp 3", "--tp 3"),
    C("estimate llama-3.1-8b --tp 64", "--tp 64"),
    C("estimate llama-3.1-8b --stack megatron --pp 5", "--pp 5"),
    C("estimate llama-3.1-8b --stack torchtitan --pp 2", "--grad-accum"),
    # the HF Trainer and accelerate train with no pipeline (stacks/hf.toml [model_parallel])
    C("estimate llama-3.1-8b --pp 2 --grad-accum 2", "--stack hf runs no pipeline split"),
    C("estimate llama-3.1-8b --zero 2", "--dp"),
    C("estimate llama-3.1-8b --zero 4 --dp 2", "--zero"),
    C("estimate llama-3.1-8b --zero -1 --dp 2", "--zero"),
    C("estimate llama-3.1-8b --sequence-parallel", "--tp"),
    C("estimate gpt2 --seq 2048", "learned positions"),
    C("estimate bert-base --seq 1024", "learned positions"),
    C("estimate opt-125m --mode infer --seq 2048", "learned positions"),
    C("compare gpt2 --seq 4096", "learned positions"),
    C("sweep llama-3.1-8b --vary batch 1:4 --tp 3", "--tp 3"),
    # a swept value or knob the setting's definition or the mode refuses is one line, not rows of n/a
    C("sweep llama-3.1-8b --vary zero 0:5", "--zero 4 is not supported"),
    C("sweep llama-3.1-8b --vary recompute none,bogus", "'bogus' is not supported"),
    C("sweep llama-3.1-8b --vary zero 0:3 --mode infer", "--zero applies to train/rl only"),
    C("sweep gpt2 --vary batch 1:4 --seq 2048", "learned positions"),
    C("report llama-3.1-8b --stack megatron --pp 5 -o {tmp}/r.html", "--pp 5"),
    C("measure tiny-llama --device cpu --zero 1", "--dp"),
    # ---- --attention triton: llm-foundry's Triton kernel runs on a GPU, in 16 bits, on the hf stack -------------
    C("estimate gpt2 --attention triton --device cpu", "--device cpu"),
    C("estimate gpt2 --attention triton --precision fp32", "fp16/bf16"),
    C("estimate llama-3.1-8b --attention triton --precision amp-bf16 --stack torchtitan", "--attention flash"),
    # ---- the learned-position limit in the trace engine (checked before tracing) ----------------------------
    # (the default --seq adapts to the position table: min(2048, positions), so these name a longer one)
    C("estimate gpt2 --engine trace --seq 2048", "learned positions"),
    C("estimate tiny-gpt2 --engine trace --seq 1024", "learned positions"),
    C("estimate tiny-bert --engine trace --mode infer --seq 513", "learned positions"),
    C("estimate tiny-opt --engine trace --mode infer --seq 2048", "learned positions"),
    C("estimate roberta-base --engine trace --seq 1024", "learned positions"),
    C("estimate tiny-gpt2 --engine all --seq 4096 --json", "learned positions"),
    C("estimate tiny-gpt2 --engine trace --dp 2 --zero 1 --seq 1024", "learned positions"),
    C("timeline gpt2 --seq 2048 -o {tmp}/t.png", "learned positions"),
    C("timeline tiny-bert --seq 1024 -o {tmp}/t.png", "learned positions"),
    C("timeline tiny-gpt2 --mode infer --seq 512 -o {tmp}/t.png", "learned positions"),
    C("measure tiny-gpt2 --device cpu --seq 1024 --force", "learned positions"),
    C("measure tiny-gpt2 --device cpu --seq 1024", "learned positions"),
    C("report tiny-gpt2 --trace --seq 1024 -o {tmp}/r.html", "learned positions"),
    # ---- engines that cannot run the setup -----------------------------------------------------------------
    C("estimate llama-3.1-8b --engine magic", "--engine"),
    C("estimate llama-3.1-8b --engine trace --tp 2", "--tp"),
    C("estimate llama-3.1-8b --engine trace --pp 2 --grad-accum 2", "--pp"),
    C("estimate tiny-llama --engine trace --mode infer --precision int4", "int4"),
    C("estimate tiny-llama --engine measure --device cpu --mode infer --precision int8", "int8"),
    C("estimate tiny-llama --engine measure --device cpu --mode infer --kv-dtype fp8", "--kv-dtype"),
    # ---- numbers: NaN, infinities, negatives, bad suffixes --------------------------------------------------
    C("estimate llama-3.1-8b --mfu 0 --gpu H100-80GB", "--mfu"),
    C("estimate llama-3.1-8b --mfu -0.4 --gpu H100-80GB", "--mfu"),
    C("estimate llama-3.1-8b --mfu 1.5 --gpu H100-80GB", "--mfu"),
    C("estimate llama-3.1-8b --mfu nan --gpu H100-80GB", "--mfu"),
    C("estimate llama-3.1-8b --mfu inf --gpu H100-80GB", "--mfu"),
    C("estimate llama-3.1-8b --mfu forty --gpu H100-80GB", "--mfu"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens nan", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens NaN", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens inf", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens Infinity", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens -1T", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens=-5", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens 0", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens 15X", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens 15TB", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens T", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens 1e", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens lots", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens 1e400", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens infT", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens 0x10", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --tokens ''", "--tokens"),
    C("estimate llama-3.1-8b --gpu H100-80GB --price nan", "--price"),
    C("estimate llama-3.1-8b --gpu H100-80GB --price inf", "--price"),
    C("estimate llama-3.1-8b --gpu H100-80GB --price -2", "--price"),
    C("estimate llama-3.1-8b --gpu H100-80GB --price cheap", "--price"),
    C("estimate llama-3.1-8b --price 2", "--price needs --gpu"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --price nan", "--price"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --price -1", "--price"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --tokens nan", "--tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --tokens -15T", "--tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --tokens 15X", "--tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --tokens inf", "--tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens nan", "--global-batch-tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens inf", "--global-batch-tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens -4M", "--global-batch-tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens 0", "--global-batch-tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens 4Q", "--global-batch-tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens 100", "--global-batch-tokens"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --margin 0.05", "--reserve"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --reserve -0.1", "--reserve"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --reserve nan", "--reserve"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 24 --tp 3", "does not divide the 32 attention heads"),
    C("plan llama-3.1-8b --mode serve --concurrency 8 --gpu H100-80GB --tp 3", "does not divide the 32 attention heads"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --efficiency 0", "--efficiency"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --efficiency nan", "--efficiency"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --efficiency 1.5", "--efficiency"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --batch-tolerance nan", "--batch-tolerance"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --batch-tolerance 1", "--batch-tolerance"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --top 0", "--top"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 0", "--gpus"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus -8", "--gpus"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus eight", "--gpus"),
    C("plan llama-3.1-8b --gpu H100-80GB --seq 0", "--seq"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --tp 3", "--tp 3"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --pp 0", "--pp"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --dp 16", "--dp 16"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --zero 4", "--zero"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --zero one", "--zero"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --zero ''", "--zero"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --precision fp64", "--precision"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --precision int4", "--precision"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --recompute sometimes", "--recompute"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --optimizer magic", "--optimizer"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --emit slurm", "--emit"),
    C("plan gpt2 --gpu H100-80GB --gpus 8 --seq 4096", "learned positions"),
    C("report llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens nan -o {tmp}/r.html", "--global-batch-tokens"),
    C("report llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens 4X -o {tmp}/r.html", "--global-batch-tokens"),
    C("report llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens -1M -o {tmp}/r.html", "--global-batch-tokens"),
    C("report llama-3.1-8b --gpu H100-80GB --gpus 0 -o {tmp}/r.html", "--gpus"),
    C("report llama-3.1-8b --mfu nan -o {tmp}/r.html", "--mfu"),
    # ---- choices -----------------------------------------------------------------------------------------
    C("estimate llama-3.1-8b --precision fp64", "--precision"),
    C("estimate llama-3.1-8b --precision int4", "--precision"),
    C("estimate llama-3.1-8b --mode infer --precision bf16-master", "--precision"),
    C("estimate llama-3.1-8b --optimizer adamw9", "--optimizer"),
    C("estimate llama-3.1-8b --recompute sometimes", "--recompute"),
    C("estimate llama-3.1-8b --attention magic", "--attention"),
    C("estimate llama-3.1-8b --device tpu", "--device"),
    C("estimate llama-3.1-8b --mode serve", "--mode"),
    C("estimate llama-3.1-8b --mode infer --kv-dtype int4", "--kv-dtype"),
    C("compare llama-3.1-8b --precision fp64", "--precision"),
    C("compare llama-3.1-8b --optimizer magic", "--optimizer"),
    C("compare llama-3.1-8b --attention magic", "--attention"),
    C("compare llama-3.1-8b --device tpu", "--device"),
    C("measure tiny-llama --device tpu", "--device"),
    C("measure tiny-llama --device cpu --precision fp64", "--precision"),
    C("measure tiny-llama --device cpu --optimizer magic", "--optimizer"),
    C("measure tiny-llama --device cpu --mode serve", "--mode"),
    C("measure tiny-llama --device cpu --steps -1", "--steps"),
    C("measure tiny-llama --device cpu --warmup 0", "--warmup"),
    C("measure tiny-llama --device cpu --nproc 0", "--nproc"),
    C("measure tiny-llama --device cpu --nproc two", "--nproc"),
    C("measure tiny-llama --device cpu --nnodes abc", "--nnodes"),
    C("measure tiny-llama --device cpu --nnodes 0", "--nnodes"),
    C("measure tiny-llama --device cpu --mode infer --precision int4", "int4"),
    C("timeline tiny-llama --precision fp64 -o {tmp}/t.png", "--precision"),
    C("timeline tiny-llama --device tpu -o {tmp}/t.png", "--device"),
    C("timeline tiny-llama --mode infer --measure -o {tmp}/t.png", "--measure"),
    C("timeline tiny-llama --mode infer --precision int8 -o {tmp}/t.png", "int8"),
    C("report llama-3.1-8b --optimizer magic -o {tmp}/r.html", "--optimizer"),
    C("report llama-3.1-8b --mode serve -o {tmp}/r.html", "--mode"),
    # ---- output files ------------------------------------------------------------------------------------
    C("timeline tiny-llama -o {tmp}/t.txt", "-o"),
    C("timeline tiny-llama -o {tmp}/no/such/folder/t.png", "folder"),
    C("timeline llama-3.1-70b -o {tmp}/70b.jpeg", "-o"),
    C("sweep llama-3.1-8b --vary batch 1:4 -o {tmp}/s.txt", "-o"),
    C("sweep llama-3.1-8b --vary batch 1:4 -o {tmp}/missing/s.png", "folder"),
    C("report llama-3.1-8b -o {tmp}/r.pdf", ".html"),
    C("report llama-3.1-8b -o {tmp}/missing/r.html", "folder"),
    # ---- sweep -------------------------------------------------------------------------------------------
    C("sweep llama-3.1-8b --vary colour 1:4", "--vary"),
    C("sweep llama-3.1-8b --vary batch ''", "--vary"),
    C("sweep llama-3.1-8b --vary batch 64:1", "--vary"),
    C("sweep llama-3.1-8b --vary batch 0:8", "--vary"),
    C("sweep llama-3.1-8b --vary batch -4:8", "--vary"),
    C("sweep llama-3.1-8b --vary batch a:b", "--vary"),
    C("sweep llama-3.1-8b --vary batch 1.5,2", "--vary"),
    C("sweep llama-3.1-8b --vary batch 1,2,x", "--vary"),
    C("sweep llama-3.1-8b --vary batch 1:" + "9" * 30, "--vary"),
    C("sweep llama-3.1-8b --vary batch " + ",".join(str(i) for i in range(1, 80)), "--vary"),
    C("sweep llama-3.1-8b --vary recompute 1:4", "--vary"),
    C("sweep llama-3.1-8b --vary precision fp64,fp128", "--precision"),
    C("sweep llama-3.1-8b --vary tp 3,5,7", "--tp"),
    C("sweep llama-3.1-8b --vary seq 128:512 --attention eager,magic", "magic"),
    C("sweep llama-3.1-8b --vary attention eager,flash --attention eager,sdpa", "same knob"),
    C("sweep llama-3.1-8b --vary batch 1:4 --precision fp32,bf16,amp-bf16 --optimizer sgd,adamw,lion,adam,momentum",
      "variants"),
    C("sweep llama-3.1-8b --vary batch 1:4 --mfu nan --gpu H100-80GB", "--mfu"),
    C("sweep llama-3.1-8b --vary batch 1:4 --batch 8", "drop --batch 8"),
    C("sweep llama-3.1-8b --vary seq 128:512 --seq 1024", "drop --seq 1024"),
    C("sweep llama-3.1-8b --vary gpus 1:8 --dp 4", "drop --dp 4"),
    C("sweep llama-3.1-8b --vary attention eager,flash --attention sdpa", "drop --attention sdpa"),
    C("sweep llama-3.1-8b --vary precision fp32,bf16 --precision amp-bf16", "drop --precision amp-bf16"),
    # ---- report ------------------------------------------------------------------------------------------
    C("report llama-3.1-8b --vary colour 1:4 --no-trace -o {tmp}/r.html", "--vary"),
    C("report llama-3.1-8b --gpus 8 --no-trace -o {tmp}/r.html", "--gpu"),
    C("report llama-3.1-8b --gpu H100-80GB --global-batch-tokens 4M --no-trace -o {tmp}/r.html", "--gpus"),
    C("report llama-3.1-8b --vary seq 512:4096 --seq 1024 --no-trace -o {tmp}/r.html", "drop --seq 1024"),
    C("timeline tiny-llama --mode infer --fast -o {tmp}/t.png", "--fast"),
    C("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --emit deepspeed --json", "--json"),
    # ---- trace (a user's nn.Module factory) ----------------------------------------------------------------
    C("trace nomodule", "package.module:function"),
    C("trace :build", "package.module:function"),
    C("trace tests.cli.example_factories:", "package.module:function"),
    C("trace no_such_package_xyz:build", "cannot load"),
    C("trace tests.cli.example_factories:no_such_function", "cannot load"),
    C("trace math:pi", "not callable"),
    C("trace badfactories:boom", "boom"),
    C("trace badfactories:needs_argument", "needs_argument"),
    C("trace badfactories:returns_none", "nn.Module"),
    C("trace badfactories:returns_text", "nn.Module"),
    C("trace badfactories:no_example", "example batch"),
    C("trace badfactories:text_example", "batch must be"),
    C("trace badfactories:wrong_shape", "wrong_shape"),
    C("trace badfactories:no_parameters", "parameters"),
    C("trace broken_syntax:build", "SyntaxError"),
    C("trace raising_import:build", "raising_import"),
    C("trace tests.cli.example_factories:mlp --batch 0", "--batch"),
    C("trace tests.cli.example_factories:mlp --batch -3", "--batch"),
    C("trace tests.cli.example_factories:mlp --grad-accum 0", "--grad-accum"),
    C("trace tests.cli.example_factories:mlp --precision fp64", "--precision"),
    C("trace tests.cli.example_factories:mlp --optimizer magic", "--optimizer"),
    C("trace tests.cli.example_factories:mlp --device tpu", "--device"),
    C("trace tests.cli.example_factories:mlp --recompute selective", "--recompute"),
    C("trace tests.cli.example_factories:mlp_no_batch_arg --batch 0", "--batch"),
    # ---- flags that do not apply (contradictory, or silently ignored today) ---------------------------------
    C("estimate llama-3.1-8b --mode infer --optimizer sgd", "--optimizer"),
    C("estimate llama-3.1-8b --mode infer --recompute full", "--recompute"),
    C("estimate llama-3.1-8b --mode infer --grad-accum 4", "--grad-accum"),
    C("estimate llama-3.1-8b --mode infer --gpu H100-80GB --tokens 1T", "--tokens"),
    C("estimate llama-3.1-8b --mode infer --zero 1 --dp 2", "--zero"),
    C("estimate llama-3.1-8b --kv-dtype fp8", "--kv-dtype"),
    C("estimate llama-3.1-8b --tokens 1T", "--gpu"),
    C("measure tiny-llama --device cpu --seq 16 --steps 0 --mode infer --optimizer sgd", "--optimizer"),
    C("measure tiny-llama --device cpu --seq 16 --steps 0 --kv-dtype fp8", "--kv-dtype"),
    C("timeline tiny-llama --seq 16 --mode infer --optimizer sgd -o {tmp}/t.png", "--optimizer"),
]


BAD_FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn

    def boom():
        raise RuntimeError("boom: the factory could not build its model")

    def needs_argument(width):
        return nn.Linear(width, width), torch.zeros(2, width)

    def returns_none():
        return None

    def returns_text():
        return "a model"

    def no_example():
        return nn.Linear(4, 4)

    def text_example():
        return nn.Linear(4, 4), "hello"

    def wrong_shape():
        return nn.Linear(4, 4), torch.zeros(2, 5)

    def no_parameters():
        return nn.ReLU(), torch.zeros(2, 4)
''')


@pytest.fixture(scope="module")
def _workdir_files(tmp_path_factory):
    """One folder per module (per xdist worker) holding every config file, the bad factory modules and an empty
    folder: every case only reads it (each is refused before writing anything: assert_refused), so it is built once
    rather than per case (394 cases: ~24 ms of file writing each)."""
    tmp = tmp_path_factory.mktemp("workdir")
    for name, content in CONFIGS.items():
        path = tmp / "configs" / f"{name}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    mods = tmp / "mods"
    mods.mkdir()
    (mods / "badfactories.py").write_text(BAD_FACTORIES)
    (mods / "broken_syntax.py").write_text("def build(:\n    pass\n")
    (mods / "raising_import.py").write_text("raise RuntimeError('this module fails on import')\n")
    (tmp / "empty").mkdir()
    return tmp


@pytest.fixture
def workdir(_workdir_files, monkeypatch):
    """The folder holding every config file, and the bad factory modules on sys.path; the cwd."""
    monkeypatch.syspath_prepend(str(_workdir_files / "mods"))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # tests.cli.example_factories
    monkeypatch.chdir(_workdir_files)
    # shared by the module's cases: one that wrote into it would change what the next reads
    with left_unwritten(_workdir_files):
        yield _workdir_files


def argv_for(line: str, tmp: Path) -> list[str]:
    def fill(arg: str) -> str:
        for name in CONFIGS:
            arg = arg.replace(f"{{cfg:{name}}}", str(tmp / "configs" / f"{name}.json"))
        return arg.replace("{tmp}", str(tmp / "empty") if arg == "{tmp}" else str(tmp))

    return [fill(a) for a in shlex.split(line)]


def run(capsys, argv: list[str]) -> tuple[object, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_refused(code, out: str, err: str, needle: str | None) -> None:
    assert code == 2, f"exit code {code!r} (expected 2); stdout: {out[-400:]!r}; stderr: {err[-800:]!r}"
    assert "Traceback" not in err and "Traceback" not in out, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"stderr must be one line, got {len(lines)}: {err[-800:]!r}"
    assert lines[0].startswith("error: "), lines[0]
    if needle is not None:
        assert needle.lower() in lines[0].lower(), f"{needle!r} not in {lines[0]!r}"


@pytest.mark.parametrize("line,needle", CASES)
def test_bad_command_line_is_one_error_line(workdir, capsys, line, needle):
    code, out, err = run(capsys, argv_for(line, workdir))
    assert_refused(code, out, err, needle)


def test_corpus_is_large_and_covers_every_command():
    assert len(CASES) >= 150
    commands = {shlex.split(c.values[0])[0] for c in CASES}
    assert {"estimate", "compare", "measure", "trace", "plan", "timeline", "sweep", "report", "models", "gpus"} <= commands


def _entry_point() -> list[str]:
    script = Path(sys.executable).parent / "trainfit"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from trainfit.cli import main; main()"]


@pytest.mark.parametrize("line,needle", [
    ("estimate llama-3.1-8b --gpu H100-80GB --tokens 15X", "--tokens"),
    ("estimate {cfg:nan}", "NaN"),
    ("estimate {cfg:latin1}", "UTF-8"),
    ("plan llama-3.1-8b --gpu H100-80GB --gpus 8 --global-batch-tokens nan", "--global-batch-tokens"),
    ("estimate tiny-gpt2 --engine trace --seq 1024", "learned positions"),
])
def test_real_entry_point(workdir, line, needle):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(_entry_point() + argv_for(line, workdir), capture_output=True, text=True, env=env,
                       cwd=workdir, timeout=120)
    assert_refused(p.returncode, p.stdout, p.stderr, needle)


# Every inference weight format × attention kernel, on a GPU where the estimate does not fit (so the fit advice runs:
# it retries with int8/int4 weights) and on one where it does: an answer or one error line, never a traceback.
# (Before: every eager estimate that did not fit raised KeyError 'int8' in analytic/ops/ layer_forward.)
INFER_PATHS = [pytest.param(p, a, g, id=f"{p}-{a}-{g}")
               for p in ("fp32", "bf16", "fp16", "fp8", "int8", "int4") for a in ("auto", "eager", "sdpa", "flash")
               for g in ("T4", "H100-80GB")]


@pytest.mark.parametrize("precision,attention,gpu", INFER_PATHS)
def test_inference_paths_answer_without_traceback(capsys, precision, attention, gpu):
    code, out, err = run(capsys, ["estimate", "llama-3.1-8b", "--mode", "infer", "--precision", precision,
                                  "--attention", attention, "--seq", "8192", "--batch", "4", "--gpu", gpu])
    assert "Traceback" not in out + err, err[-2000:]
    if code != 0:
        assert_refused(code, out, err, None)
    else:
        assert "fit" in out and "prefill" in out, out[-1500:]


def test_attention_beside_int8_gemms_runs_in_fp16():
    """bitsandbytes' LLM.int8 quantises the Linear layers' matmuls only; attention's q·kᵀ and p·v run on the fp16
    activations, so an int8 model's eager attention launches the kernels an fp16 model's does, and what eager
    attention costs over SDPA's fused kernel (the GEMMs being the same in both) is the fp16 model's to the ns."""
    from trainfit import estimate

    runs = {(p, a): estimate("llama-3.2-1b", mode="infer", precision=p, attention=a, seq=4096, gpu="T4").detail
            for p in ("fp16", "int8") for a in ("eager", "sdpa")}
    assert runs["int8", "eager"].prefill.kernels == runs["fp16", "eager"].prefill.kernels
    eager_over_sdpa = {p: runs[p, "eager"].prefill.gpu_seconds - runs[p, "sdpa"].prefill.gpu_seconds
                       for p in ("fp16", "int8")}
    assert eager_over_sdpa["int8"] == pytest.approx(eager_over_sdpa["fp16"], rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("tp", ["5", "7"])
def test_fit_refuses_a_tp_the_model_cannot_take(cli, tp):
    """fit starts from the layout given: one the model's heads refuse is refused as estimate refuses it, not
    answered with another --tp (5 became 6) or "nothing fits" (7)."""
    code, out, err = cli("fit", "gpt2", "--gpu", "A100-40GB", "--tp", tp)
    assert code == 2 and err.count("\n") == 1 and f"--tp {tp} does not divide the 12 attention heads" in err, (out, err)


@pytest.mark.parametrize("mode", ["infer", "serve", "rl"])
def test_report_plans_training_only(cli, tmp_path, mode):
    """report --gpus adds a training plan (ZeRO, accumulation, bf16-master): refused beside another mode, not added."""
    code, out, err = cli("report", "tiny-llama", "--gpu", "H100-80GB", "--mode", mode, "--gpus", "4", "--no-trace",
                         "-o", str(tmp_path / "r.html"))
    assert code == 2 and err.count("\n") == 1 and "--gpus plans a training run" in err, (out, err)
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("flag", ["--tokens", "--price"])
def test_sweep_does_not_take_a_budget(cli, flag):
    code, _, err = cli("sweep", "tiny-llama", "--vary", "batch", "1,2", "--gpu", "H100-80GB", flag, "1")
    assert code == 2 and f"No such option: {flag}" in err, err


@pytest.mark.parametrize("args,words", [
    (["--mode", "rl", "--rollout", "hf", "--vllm-gpu-memory-utilization", "0.3"], "needs --rollout vllm"),
    (["--mode", "rl", "--rollout", "hf", "--rollout-tp", "1"], "needs --rollout vllm"),
    (["--mode", "serve", "--server", "sglang", "--block-size", "16"], "does not apply to --server sglang"),
    (["--mode", "serve", "--mem-fraction-static", "0.88"], "does not apply to --server vllm"),
])
def test_other_engines_flags_are_refused_at_their_default_too(cli, args, words):
    """The vLLM rollout's flags under --rollout hf, one serving engine's under the other: refused when written, at
    their default value too (rules.py can only refuse them away from it)."""
    code, out, err = cli("estimate", "qwen2.5-1.5b", "--gpu", "H100-80GB", *args)
    assert code == 2 and err.count("\n") == 1 and words in err, (out, err)


@pytest.mark.parametrize("top", ["0", "-1"])
def test_plan_serve_refuses_top_below_one(cli, top):
    code, out, err = cli("plan", "llama-3.1-8b", "--mode", "serve", "--gpu", "H100-80GB", "--concurrency", "64",
                         "--top", top)
    assert code == 2 and f"--top must be >= 1, got {top}" in err, (out, err)


def test_timeline_refusals_do_not_offer_an_engine_option(cli, tmp_path):
    """timeline always runs the trace engine and has no --engine: a refusal it passes on names the analytic engine
    through `trainfit estimate`, not an option timeline does not take."""
    code, out, err = cli("timeline", "tiny-llama", "--mode", "rl", "--gpu", "H100-80GB", "-o", str(tmp_path / "t.png"))
    assert code == 2 and err.count("\n") == 1 and "--engine" not in err and "trainfit estimate" in err, err
