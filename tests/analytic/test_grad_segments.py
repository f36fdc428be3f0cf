"""The gradients' own segments (analytic/grad_segments.py): a hand count, and the two H200 steps they explain."""
from __future__ import annotations


from trainfit.analytic.engine import estimate, grad_segments, transient_blocks
from trainfit.analytic.memory import train_memory
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.overheads import allocator_held
from trainfit.setup import Setup
from bench import data

MiB = 2**20
RUN = "H200-2026-11-27-unrecorded-10-truth"


def test_llama_3_1_8b_bf16_by_hand():
    """Llama-3.1-8B, bf16, b2 s1024, fused AdamW. The MLP intermediate is 2,048 x 14,336 x 2 B = 56 MiB (its own
    segment); the bf16 gradients of gate/up/down are 4,096 x 14,336 x 2 B = 112 MiB, larger: 96 of them. The loss's
    one cached block, the fp32 logits (2,048 x 128,256 x 4 B = 1,002 MiB), holds 8 (896 MiB); 88 open segments of
    their own: 9,856 MiB. The first optimizer.step() carves from the activations' cache the states no larger than
    56 MiB: q and o (32 MiB), k and v (8 MiB), two AdamW states each, 32 layers: 2 x 32 x 2 x (32 + 8) = 5,120 MiB.
    The peak holds no gradient (early backward): 9,856 - 5,120 = 4,736 MiB free at it."""
    spec, setup = load_model("llama-3.1-8b"), Setup(device="cuda", batch=2, seq=1024, precision="bf16")
    mem = train_memory(spec, setup)
    assert mem.at_peak["gradients"] == 0
    assert grad_segments(spec, setup, mem, transient_blocks(spec, setup, mem)) == 4736 * MiB


def test_the_two_h200_steps_they_explain():
    """Measured on an H200 (rule 1): llama-3.1-8b bf16 read -8.0 % and torchtitan's TinyLlama -7.95 % without them;
    issue 18's target for reserved is 5 %."""
    gpu = get_gpu("H200")
    cases = {c["id"]: c for c in data.gpu_run(RUN)["cases"]}
    for case_id in ("llama-3.1-8b-bf16", "tinyllama-1.1b-torchtitan"):
        case = cases[case_id]
        setup = Setup(device="cuda", **case["settings"])
        reserved = estimate(load_model(case["model"]), setup, gpu=gpu).memory.reserved
        own = reserved - sum(allocator_held(gpu, setup).values())
        assert abs(own / case["measured_own"]["reserved"] - 1) < 0.03, case_id


def test_small_steps_and_16_bit_gradients_add_nothing():
    # llama-3.2-1b b1 s256 amp: the peak comes at the backward's end and holds every gradient; bf16: the 32 MiB
    # gradients fit the 32 MiB bf16 intermediates
    spec = load_model("llama-3.2-1b")
    for kw in (dict(batch=1, seq=256, precision="amp-bf16"), dict(batch=2, seq=1024, precision="bf16")):
        setup = Setup(device="cuda", **kw)
        mem = train_memory(spec, setup)
        assert grad_segments(spec, setup, mem, transient_blocks(spec, setup, mem)) == 0
