"""The one table of precision policies: what dtype each piece of state and compute has (no torch).

Every engine, the planner and the config writers read this table instead of re-deriving a policy's dtypes
from its name. Sources:
  * amp-*: torch.autocast (Micikevicius et al. 2018, "Mixed Precision Training"): fp32 weights, gradients
    and optimizer states; matmuls in the low-precision dtype (torch/amp/autocast_mode.py).
  * bf16: pure bf16 — every tensor in bf16, the optimizer's state in the parameters' dtype (torch.optim).
  * bf16-master: bf16 weights and gradients plus an fp32 master copy the optimizer updates (Rajbhandari et
    al. 2020, ZeRO §3: 2Ψ + 2Ψ + 12Ψ bytes; Megatron-LM / DeepSpeed `bf16`).
  * fp16-master: the same with fp16 weights and gradients and a dynamic loss scale (Micikevicius et al. 2018 §3.2;
    Megatron-LM `--fp16`, DeepSpeed `fp16.enabled`); V100 and T4 run its matmuls on fp16 tensor cores.
  * inference weight formats fp16 / fp8 / int8 / int4 store the weights so and compute in fp16/bf16 (int4:
    weight-only quantisation, GPTQ/AWQ) or natively (fp8, int8 GEMMs on GPUs that have them).
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
               # int4 weight-only quantisation (GPTQ/AWQ style): 4 bits + one fp16 scale and zero per group of 128
               # NB: group size 128 assumed; finer groups cost slightly more.
               "int4": 0.5 + 4 / 128}


@dataclass(frozen=True)
class Precision:
    name: str
    weight: str  # dtype of the parameters the model holds
    grad: str  # dtype of .grad (PyTorch: the parameter's dtype); "" for inference-only formats
    master: str  # fp32 master copy updated by the optimizer ("" when none)
    state: str  # dtype of the optimizer's per-parameter state (that of the tensors it updates)
    compute: str  # dtype the matmuls run in (decides the GPU peak FLOP/s)
    autocast: str  # torch.autocast dtype ("" when autocast is off)
    train: bool  # a training policy (all are valid for inference)
    summary: str


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "fp32", "fp32", "", "fp32", "fp32", "", True, "everything fp32"),
    Precision("amp-bf16", "fp32", "fp32", "", "fp32", "bf16", "bf16", True,
              "torch.autocast bf16: fp32 weights, grads, states; bf16 matmuls"),
    Precision("amp-fp16", "fp32", "fp32", "", "fp32", "fp16", "fp16", True,
              "torch.autocast fp16: fp32 weights, grads, states; fp16 matmuls"),
    Precision("bf16", "bf16", "bf16", "", "bf16", "bf16", "", True, "pure bf16 weights, grads and states"),
    Precision("bf16-master", "bf16", "bf16", "fp32", "fp32", "bf16", "", True,
              "bf16 weights and grads + fp32 master and states (Megatron/DeepSpeed)"),
    Precision("fp16-master", "fp16", "fp16", "fp32", "fp32", "fp16", "", True,
              "fp16 weights and grads + fp32 master and states, dynamic loss scaling (Megatron/DeepSpeed fp16)"),
    Precision("fp16", "fp16", "", "", "", "fp16", "", False, "fp16 weights (inference)"),
    Precision("fp8", "fp8", "", "", "", "fp8", "", False, "fp8 weights and GEMMs (inference)"),
    Precision("int8", "int8", "", "", "", "int8", "", False, "int8 weights and GEMMs (inference)"),
    Precision("int4", "int4", "", "", "", "fp16", "", False, "int4 weight-only, fp16 compute (inference)"),
)}

TRAIN_PRECISIONS = tuple(n for n, p in PRECISIONS.items() if p.train)
INFER_PRECISIONS = tuple(n for n, p in PRECISIONS.items() if not p.master)  # a master copy is a training thing
DEFAULT = {"train": "amp-bf16", "infer": "bf16"}


def inference_counterpart(train_name: str) -> str:
    """The weight format a trained model is served in: its compute dtype (amp-bf16 -> bf16, fp32 -> fp32)."""
    return PRECISIONS[train_name].compute
