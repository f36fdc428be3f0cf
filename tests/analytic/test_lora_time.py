"""The step time of LoRA/DoRA/QLoRA (analytic/lora_ops.py): the kernels the step runs, by hand from autograd's rules
and LoRA's definition (Hu et al. 2021 eq. 3)."""
from __future__ import annotations

from trainfit import api
from trainfit.analytic import lora_ops
from trainfit.analytic.ops import backward, layer_forward, shape_of
from trainfit.analytic.precision import state_bytes
from trainfit.analytic.timing import compute_dtype
from trainfit.setup import Request

T = 2048


def _layer(**kw):
    req = Request(model="llama-3.2-1b", gpu="A100-80GB", batch=1, seq=T, precision="bf16", **kw)
    spec = api.load_spec(req.model)
    setup = req.setup(spec)
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    full = layer_forward(spec, sh)
    return spec, full, (lora_ops.layer_forward(spec, setup, sh, full) if setup.lora_rank else full)


def _gemm_flops(ops) -> float:
    return sum(op.flops for op in ops if op.kind == "gemm")


def test_frozen_base_skips_weight_gradients_and_adapters_add_their_gemms():
    """Full fine-tuning: a layer's backward GEMM FLOPs = 2 × its forward's (dgrad + wgrad, Narayanan et al. 2021 §3).
    LoRA (all-linear, r 16): the frozen projections keep their dgrad only (1 × forward); each adapted projection adds
    lora_A (d_in -> r) and lora_B (r -> d_out), 2·T·r·(d_in + d_out) FLOPs forward and twice that backward (dgrad
    and wgrad: both adapters train)."""
    spec, full, _ = _layer()
    _, _, lora = _layer(lora_rank=16)
    r, h, i, q, kv = 16, spec.hidden, spec.intermediate, spec.q_dim, spec.kv_dim
    mats = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]  # q k v o gate up down: (d_in, d_out)
    base = 2 * T * sum(a * b for a, b in mats)
    adapters = sum(2 * T * r * (a + b) for a, b in mats)
    assert _gemm_flops(full) == base
    assert _gemm_flops(backward(full)) == 2 * base
    assert _gemm_flops(lora) == base + adapters
    assert _gemm_flops(backward(lora)) == base + 2 * adapters


def test_dora_norm_has_no_backward_and_qlora_dequantises_each_frozen_weight_twice():
    """DoRA's weight norm runs under torch.no_grad (peft dora.py): its B·A GEMM (d_out × d_in × r) adds forward
    FLOPs and no backward ones. QLoRA reads each frozen weight's 4-bit form (0.5 B + scales) and writes it in bf16
    (2 B), in forward and again for the input gradient, after decoding its double-quantised block scales."""
    spec, _, lora = _layer(lora_rank=16)
    _, _, dora = _layer(lora_rank=16, dora=True)
    h, i, q, kv = spec.hidden, spec.intermediate, spec.q_dim, spec.kv_dim
    mats = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    assert _gemm_flops(dora) - _gemm_flops(lora) == sum(2 * a * b * 16 for a, b in mats)
    assert _gemm_flops(backward(dora)) == _gemm_flops(backward(lora))
    _, _, ql = _layer(lora_rank=16, quant="nf4")
    weights = sum(a * b for a, b in mats)
    deq = [op for op in ql if op.name.endswith(".dequant")]
    # bf16 copies of every frozen projection, and (double quantisation) the fp32 block scales of every 64 weights
    # decoded then offset in place: written twice
    assert sum(op.writes for op in deq) == 2 * weights + 2 * 4 * weights / 64
    assert 0.5 * weights < sum(op.reads for op in deq) < 0.75 * weights
    assert all(op.kernels == 3 for op in deq)  # scales decoded, offset added, weights decoded


def test_lora_step_is_faster_than_full_fine_tuning_and_qlora_slower_than_lora():
    """No weight-gradient GEMMs (a third of the GEMM FLOPs) and an optimizer over ~1 % of the parameters: a LoRA
    step with adapters in the base's bf16 (torchtune's, C1) is faster; QLoRA adds the dequantisation (C1 publishes
    8,210 vs 8,035 tokens/s: 2 % slower). peft's default fp32 adapters on a bf16 base run fp32 GEMMs at the CUDA
    cores' rate (16x below bf16 on an A100): slower than bf16 adapters — on an H200 such a step measured 104 ms
    against full fine-tuning's 76 ms (bench/results/gpu/H200-2026-11-26-unrecorded-2-truth.json)."""
    times = {}
    for name, kw in {"full": {}, "lora": dict(lora_rank=16, lora_dtype="weight"),
                     # torchtune's QLoRA: no peft preparation (--kbit-prep none)
                     "qlora": dict(lora_rank=16, quant="nf4", lora_dtype="weight", kbit_prep="none"),
                     "lora-fp32": dict(lora_rank=16, lora_dtype="fp32")}.items():
        e = api.analytic(Request(model="llama-3.2-3b", gpu="A100-80GB", batch=2, seq=4096, precision="bf16", **kw))
        times[name] = e.time.step_seconds
    assert times["lora"] < 0.9 * times["full"]
    assert times["lora"] < times["qlora"] < 1.1 * times["lora"]
    assert times["lora-fp32"] > 1.1 * times["lora"]
