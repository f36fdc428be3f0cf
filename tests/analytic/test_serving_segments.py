"""The weights as SGLang reads them off cudaMemGetInfo: the caching allocator's segments (analytic/serving_segments.py)
and the router gate kept whole in the model dtype (serving.layer_bytes). Truths: hand derivations from
CUDACachingAllocator.cpp's rules (requests <= 1 MiB share 2 MiB small-pool segments, 1-10 MiB ones 20 MiB
segments, larger ones a segment of their own rounded up to 2 MiB; a free block is split only when more than 1 MiB
would be left) and the published SGLang 0.4.3.post4 log of QwQ-32B at tp 4 ("mem usage=15.54 GB")."""
from __future__ import annotations

from trainfit.analytic import serving_segments as segments
from trainfit.analytic import serving_sglang as sg
from trainfit.analytic.params import count_params
from trainfit.analytic.serving import layer_bytes
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

MiB = 1 << 20


def _sgl(**kw) -> Setup:
    return Setup(mode="serve", server="sglang", **{"precision": "bf16", **kw})


def test_qwen25_32b_tp4_slack_by_hand():
    """Qwen2.5-32B (QwQ-32B) at tp 4 in bf16, per layer: qkv (40 + 2 × 8 heads) × 128 / 4 = 1792 rows × 5120 × 2 B =
    17.5 MiB -> a segment of 18; o_proj 1280 × 5120 × 2 = 12.5 -> 14; gate_up 13824 × 5120 × 2 = 135 -> 136; down
    6912 × 5120 × 2 = 67.5 -> 68: 3.5 MiB × 64 layers. Embedding and head: 38016 rows × 5120 × 2 = 371.25 -> 372
    MiB each. The rotary cache (131072 × 128 × 4 B = 64 MiB) and its temporaries are whole. Small pool: the qkv
    biases (1792 × 2 B) and two norms (5120 × 2 B each) per layer and the final norm, 1,550,336 B, in one 2 MiB
    segment."""
    spec = load_model("qwen2.5-32b")
    small = 64 * (1792 * 2 + 2 * 5120 * 2) + 5120 * 2
    assert small == 1_550_336
    expected = int(3.5 * MiB) * 64 + 2 * int(0.75 * MiB) + (2 * MiB - small)
    assert segments.slack(spec, _sgl(tp=4)) == expected  # 226.02 MiB


def test_qwq_weights_are_the_logs_mem_usage():
    """The published SGLang 0.4.3.post4 start-up of QwQ-32B on 4 × L4 (didier-durand/llms-in-clouds): "Load weight
    end. ... mem usage=15.54 GB" (GB = 2**30); the bytes alone are 15.32 GiB."""
    sv = sg.serve_memory(load_model("qwen2.5-32b"), _sgl(tp=4, mem_fraction_static=0.85), get_gpu("L4"))
    assert round(sv.weights / 2**30, 2) == 15.54


def test_qwen3_235b_fp8_tp4_slack_by_hand():
    """Qwen3-235B-A22B-FP8 at tp 4: the fp8 qkv (2304 rows × 4096 = 9 MiB) and o_proj (4096 × 2048 = 8 MiB) are the
    only 1-10 MiB requests; the experts (128 × 768 × 4096 = 384 MiB, 128 × 4096 × 384 = 192 MiB) are whole segments,
    the 1 MiB bf16 router gates go to the small pool. Layer 0: qkv0 and o0 in a new 20 MiB segment (3 MiB left,
    which no later 8-9 MiB request fits); then the rotary cache's fp32 temporaries (40960 × 64 × 4 B = 10 MiB each:
    freqs, cos, sin, own segments) are freed: qkv1 takes freqs' 10 MiB whole (1 MiB left: not split), o1 8 of cos'
    (2 left, split), qkv2 sin's whole; from there each 20 MiB segment holds o_k and qkv_(k+1) (k = 2..92, 3 MiB
    left) and the last holds o_93 alone (12 left): 30 + 20 × (1 + 91 + 1) MiB hold 94 × 17 MiB: 292 MiB. Embedding
    and head: 37984 × 4096 × 2 B = 296.75 -> 298 MiB each: 2.5 MiB. The small pool adds less than one segment
    (2 MiB) beyond its ~95.6 MiB."""
    from bench.targets import serving_published as script
    case = script.SGLANG_CASES[0]
    spec = script.sglang_spec(case)
    large = (30 + 20 * 93) * MiB - 94 * 17 * MiB + int(2.5 * MiB)
    assert large == int(294.5 * MiB)
    slack = segments.slack(spec, _sgl(tp=4, quant="fp8"))
    assert large <= slack < large + 2 * MiB


def test_router_gate_is_whole_and_in_the_model_dtype():
    """One Qwen3-235B-A22B-FP8 layer on one of 4 ranks: attention fp8 (qkv 2304 × 4096 + o 4096 × 2048 =
    17,825,792 B), experts fp8 (128 × 3 × 4096 × 384 = 603,979,776 B), the router gate bf16 and whole (128 × 4096 ×
    2 = 1,048,576 B: ReplicatedLinear with no quant config), two norms bf16 (16,384 B). trainfit counts q_norm and
    k_norm (2 × 128) with the attention's projections (1 B per 4 ranks instead of 2 B whole: 448 B under)."""
    from bench.targets import serving_published as script
    spec = script.sglang_spec(script.SGLANG_CASES[0])
    by_hand = 17_825_792 + 603_979_776 + 1_048_576 + 16_384
    got = layer_bytes(spec, _sgl(tp=4, quant="fp8"), count_params(spec))
    assert abs(got - by_hand) < 1024
