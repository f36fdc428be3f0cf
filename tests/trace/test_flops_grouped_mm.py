"""FLOPs of torch's grouped GEMM (trace/flops.py GROUPED_MM_FLOPS), which transformers 5.24 runs MoE experts through
(integrations/moe.py:379-381) and torch 2.13's flop_counter.py has no formula for (the trace counted the experts as
zero: gpt-oss-20b's forward read 2.9 TFLOP against 7.6 by hand).

Independent sources: the same products written as one torch.mm per group, counted by torch's own mm formula; and a
hand count of a Mixtral MoE layer's step."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainfit.trace.flops import GROUPED_MM_FLOPS

BF = torch.bfloat16
ENDS = [3, 8, 8, 12]  # jagged groups of 3, 5, 0 and 4 (an expert no token picked)


def _slices(ends):
    return list(zip([0] + ends[:-1], ends))


def _offs(ends, scale=1):
    return torch.tensor([e * scale for e in ends], dtype=torch.int32)


def _variants():
    """(grouped call, the same products as one mm per group) for each operand layout _grouped_mm accepts
    (torch/_meta_registrations.py _create_grouped_mm_output_tensor)."""
    g, k, n, m = len(ENDS), 16, 32, 8
    a2, b3 = torch.randn(ENDS[-1], k, dtype=BF), torch.randn(g, k, n, dtype=BF)  # 2-D x 3-D: the MoE forward
    wa, wb = torch.randn(ENDS[-1], k, dtype=BF).t(), torch.randn(ENDS[-1], n, dtype=BF)  # 2-D x 2-D: weight grad
    a3, b2 = torch.randn(g, m, k, dtype=BF), torch.randn(k, ENDS[-1] * 8, dtype=BF)  # 3-D x 2-D: columns split
    c3 = torch.randn(g, k, n, dtype=BF)  # 3-D x 3-D: batched
    return {
        "2d-3d": (lambda: torch._grouped_mm(a2, b3, offs=_offs(ENDS)),
                  lambda: torch.cat([a2[s:e] @ b3[i] for i, (s, e) in enumerate(_slices(ENDS))])),
        "2d-2d": (lambda: torch._grouped_mm(wa, wb, offs=_offs(ENDS)),
                  lambda: torch.stack([wa[:, s:e] @ wb[s:e] for s, e in _slices(ENDS)])),
        "3d-2d": (lambda: torch._grouped_mm(a3, b2, offs=_offs(ENDS, 8)),
                  lambda: torch.cat([a3[i] @ b2[:, 8 * s:8 * e] for i, (s, e) in enumerate(_slices(ENDS))], 1)),
        "3d-3d": (lambda: torch._grouped_mm(a3, c3), lambda: torch.stack([a3[i] @ c3[i] for i in range(g)])),
    }


@pytest.mark.parametrize("variant", ["2d-3d", "2d-2d", "3d-2d", "3d-3d"])
def test_grouped_gemm_counts_as_one_mm_per_group(variant):
    grouped, per_group = _variants()[variant]
    with FlopCounterMode(display=False, custom_mapping=GROUPED_MM_FLOPS) as ours:
        out = grouped()
    with FlopCounterMode(display=False) as torchs:
        ref = per_group()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)  # the same products
    assert ours.get_total_flops() == torchs.get_total_flops() > 0


def test_mixtral_moe_layer_against_a_hand_count():
    """tiny-mixtral (hidden 256, expert intermediate 512, 4 experts, top-2, 2 layers), bf16, 2 x 64 = T = 128 tokens
    trained on the trace's CUDA semantics. By hand, per layer's experts: gate_up (T·2, 256) x (256, 1024) and down
    (T·2, 512) x (512, 256), 2·256·256·1024 + 2·256·512·256 = 201,326,592 forward; the router 2·128·256·4 =
    262,144. The whole step against the analytic engine's (analytic/flops.py), an independent count from the config:
    both count the causal SDPA's kept pairs and a backward twice the forward (trace/flops.py), so they agree."""
    from trainfit.analytic.engine import estimate
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup
    from trainfit.trace import trace_spec

    spec = load_model("tiny-mixtral")
    setup = Setup(batch=2, seq=64, precision="bf16", device="cuda")
    traced = trace_spec(spec, setup, flops=True)
    by_module = traced.detail.records["flops_by_module"]
    for layer in (0, 1):
        assert by_module[f"model.layers.{layer}.mlp.experts"] == 2 * 256 * 256 * 1024 + 2 * 256 * 512 * 256
        assert by_module[f"model.layers.{layer}.mlp.gate"] == 2 * 128 * 256 * 4
    analytic = estimate(spec, setup).flops
    assert traced.flops.forward == analytic.forward
    assert traced.flops.backward == 2 * traced.flops.forward == analytic.backward
