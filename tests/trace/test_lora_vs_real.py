"""LoRA/DoRA (peft's real get_peft_model, trainfit/step/lora.py) in the trace engine against the real CPU step
(truth: trainfit.measure, c10's allocation records) within 0.5% (DESIGN.md §5), the analytic engine against the
trace within 2%, and the recorder's categories: adapters are the only parameters with gradients and optimizer
states."""
from __future__ import annotations

import warnings

import pytest
from trace_configs import tiny_spec  # tests/trace is on sys.path (rootdir-less import)

from trainfit.analytic.engine import estimate
from trainfit.measure import measure
from trainfit.setup import Setup
from trainfit.trace import trace_spec

pytest.importorskip("peft")
warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*")

# (precision, settings): all-linear, attention-only, DoRA, and all-linear under full recompute
CASES = [
    ("amp-bf16", dict(lora_rank=8)),
    pytest.param("bf16", dict(lora_rank=8, lora_targets="attention"), marks=pytest.mark.heavy),  # the others: all-linear
    ("amp-bf16", dict(lora_rank=8, dora=True)),
    ("bf16", dict(lora_rank=8, recompute="full")),
]
IDS = ["-".join([p] + [f"{k}={v}" for k, v in kw.items()])
       for p, kw in (getattr(c, "values", c) for c in CASES)]


def _setup(precision, kw):
    return Setup(batch=1, seq=64, precision=precision, optimizer="adamw", device="cpu", **kw)


def _adapters(spec, kw) -> int:
    """Hand count for tiny-llama's dims: r·(in + out) per adapted Linear (Hu et al. 2021 §4.1), + out for DoRA's
    magnitude (Liu et al. 2024 eq. 5), per layer."""
    h, q, kv, i, r = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate, kw["lora_rank"]
    attn = [(h, q), (h, kv), (h, kv), (q, h)]
    mlp = [(h, i), (h, i), (i, h)]
    mats = attn if kw.get("lora_targets") == "attention" else attn + mlp
    return spec.layers * sum(r * (a + b) + (b if kw.get("dora") else 0) for a, b in mats)


@pytest.mark.slow
@pytest.mark.parametrize("precision,kw", CASES, ids=IDS)
def test_lora_trace_equals_real_and_analytic_follows(precision, kw):
    spec = tiny_spec("llama")
    setup = _setup(precision, kw)
    traced = trace_spec(spec, setup)
    real = measure(spec, setup, steps=0)
    assert abs(traced.memory.peak - real.peak) <= 0.005 * real.peak, (traced.memory.peak, real.peak)
    assert traced.params == real.params
    an = estimate(spec, setup)
    assert abs(an.memory.peak - traced.memory.peak) <= 0.02 * traced.memory.peak, (an.memory.peak, traced.memory.peak)
    n = _adapters(spec, kw)
    # gradients and optimizer states of the fp32 adapters only (peft keeps adapters fp32): 4 B per gradient, AdamW 8
    assert traced.memory.gradients == an.memory.gradients == 4 * n
    # the frozen base in the precision's weight dtype beside the fp32 adapters
    base = traced.params - n
    assert traced.memory.weights == an.memory.weights == (2 if precision == "bf16" else 4) * base + 4 * n
    assert abs(traced.memory.optimizer_states - 8 * n) <= 512  # the recorder counts AdamW's step scalars too
    assert an.detail.params_trainable == n


def test_frozen_base_and_trainable_adapters():
    torch = pytest.importorskip("torch")
    from trainfit.step import build_model, make_optimizer

    spec = tiny_spec("llama")
    setup = _setup("bf16", dict(lora_rank=4, dora=True))
    model = build_model(spec, setup)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, _ in trainable)
    assert all(p.dtype == torch.float32 for _, p in trainable)  # peft's autocast_adapter_dtype
    frozen = [p for n, p in model.named_parameters() if not p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in frozen)  # the precision's weight dtype
    opt = make_optimizer(model, setup)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == _adapters(spec, dict(lora_rank=4, dora=True))
