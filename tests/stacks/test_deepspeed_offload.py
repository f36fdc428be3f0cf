"""ZeRO-Offload / ZeRO-Infinity on --stack deepspeed: the device/host split by hand from DeepSpeed 0.19.8's
allocations (paths inside the deepspeed package), and the one-GPU rule."""
from __future__ import annotations

import pytest

from trainfit.analytic.memory import train_memory
from trainfit.analytic.params import count_params
from trainfit.errors import SetupError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _setup(**kw) -> Setup:
    return Setup(**{"stack": "deepspeed", "optimizer": "adamw", "precision": "bf16-master", "batch": 1, "seq": 512,
                    **kw})


@pytest.mark.parametrize("dp", [1, 4])
def test_zero3_offload_optimizer_split_by_hand(dp):
    """ZeRO-3 + offload_optimizer, Ψ parameters over dp ranks, bf16 with fp32 masters. Host, per rank
    (stage3.py:333 self.device = 'cpu'): the fp32 partition 4Ψ/dp (:1158-1160), AdamW's two fp32 states 8Ψ/dp,
    the fp32 gradient partition 4Ψ/dp (:1338-1342), and the bf16 gradient partition buffer 2Ψ/dp made on that
    device (:791-795) = 18Ψ/dp. Device: the bf16 parameter partition 2Ψ/dp (+ the norms kept whole) and no
    gradient buffer."""
    spec = load_model("llama-3.1-8b")
    psi = count_params(spec).total
    m = train_memory(spec, _setup(zero=3, dp=dp, offload="optimizer"))
    assert m.host_memory == pytest.approx(18 * psi / dp, rel=1e-6)
    assert m.gradients == 0 and m.master == 0 and m.optimizer == 0
    assert m.weights == pytest.approx(2 * psi / dp, rel=0.001)


def test_zero3_offload_params_moves_the_partition():
    """offload_param as well (ZeRO-Infinity): the bf16 partition in pinned host memory (stage3.py:906,
    param_groups_fp16_flat_cpu_memory) = 20Ψ on one rank; on the device only the whole small parameters (norms,
    under stage3_param_persistence_threshold) stay, far under a percent of 2Ψ."""
    spec = load_model("llama-3.1-8b")
    psi = count_params(spec).total
    m = train_memory(spec, _setup(zero=3, dp=1, offload="params"))
    assert m.host_memory == pytest.approx(20 * psi, rel=1e-6)
    assert m.weights < 0.001 * 2 * psi


def test_zero2_offload_accumulation_keeps_pinned_gradients():
    """ZeRO-2 + offload_optimizer accumulating micro-batches: each partition parameter's gradient kept in a pinned
    host buffer of the model dtype (stage_1_and_2.py:1822-1825), 2Ψ/dp beyond the single micro-batch's host
    bytes: fp32 partition 4 + AdamW 8 + fp32 gradient 4 + the pinned bf16 copy 2 = 18Ψ/dp (:556-577, :937-941;
    DeepSpeed's own estimate_zero2_model_states_mem_needs counts the first three, 16Ψ, before its 1.5 buffer factor),
    and a pinned buffer of the largest parameter."""
    spec = load_model("llama-3.1-8b")
    psi = count_params(spec).total
    one = train_memory(spec, _setup(zero=2, dp=2, offload="optimizer"))
    acc = train_memory(spec, _setup(zero=2, dp=2, offload="optimizer", grad_accum=4))
    largest = spec.vocab * spec.hidden  # the embedding's (and the untied head's) elements
    # + the pinned host twin of the largest-parameter staging buffer (stage_1_and_2.py:653-658)
    assert one.host_memory == pytest.approx(18 * psi / 2 + largest * 2, rel=1e-6)
    assert acc.host_memory - one.host_memory == pytest.approx(2 * psi / 2, rel=1e-6)


def test_zero_on_one_gpu_needs_offload():
    """ZeRO-Offload/Infinity are one-GPU recipes (deepspeed.ai/tutorials/zero-offload): --zero with --dp 1 runs
    under --offload optimizer|params; without offload it still needs data-parallel ranks to shard over."""
    for z in (1, 2, 3):
        _setup(zero=z, dp=1, offload="optimizer")
    _setup(zero=3, dp=1, offload="params")
    with pytest.raises(SetupError, match="--offload optimizer or params"):
        _setup(zero=2, dp=1)


@pytest.mark.parametrize("zero, offload, m, expected", [
    # ZeRO-3, overlap_comm on: D2H 2·(1e9·2) + 1e9·4 = 8e9 B (0.16 s) hidden by 2 × 0.2 s of backward; CPU Adam
    # 28e9 B / 100e9 = 0.28 s; the bf16 partition back 2e9 / 50e9 = 0.04 s
    (3, "optimizer", 2, 0.32),
    # ZeRO-2, one micro-batch, overlap_comm off: the fp32 cast 4e9 B over the link exposed (0.08 s); CPU Adam 0.28 s
    # + the cast into the pinned bf16 copy 6e9 / 100e9 = 0.06 s; the copy back 0.04 s
    (2, "optimizer", 1, 0.46),
    # ZeRO-Infinity: no copy back (the partition is on the host: its cast 0.06 s on the CPU); each pass's fetch
    # 2e9 / 50e9 = 0.04 s under the pass's 0.1 / 0.2 s
    (3, "params", 2, 0.34),
])
def test_offload_seconds_by_hand(zero, offload, m, expected):
    """One rank of 1e9 parameters in bf16 (w = 2), a 50e9 B/s host link, a 100e9 B/s host memory, forward 0.1 s
    and backward 0.2 s per micro-batch: the copies and DeepSpeedCPUAdam's 7 × 4 bytes per element
    (ops/csrc/adam/cpu_adam_impl.cpp:36 Step_1) derived by hand from DeepSpeed 0.19.8's copies."""
    from trainfit.analytic.parallel import deepspeed_offload

    s = _setup(zero=zero, dp=1, offload=offload, grad_accum=m)
    got = deepspeed_offload.offload_seconds(s, 1e9, 2, m, 50e9, 100e9, 0.1, 0.2)
    assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.heavy
@pytest.mark.parametrize("zero, offload, dp, accum", [(3, "optimizer", 1, 1), (3, "params", 1, 1),
                                                      (3, "optimizer", 2, 1), (2, "optimizer", 2, 2)])
def test_host_bytes_match_deepspeeds_own_buffers(zero, offload, dp, accum):
    """DeepSpeed 0.19.8's own ZeRO-Offload on CPU ranks (bench/targets/deepspeed_cpu.py offload_probe: its engine
    built by deepspeed.initialize with the --emit deepspeed config, one step): the buffers it makes on its offload
    device, summed, are the analytic host bytes, to the byte on every rank (ZeRO-3: 68,313,600 B on one rank of
    tiny-llama, 75,904,000 with offload_param), within one cut parameter for ZeRO-2's accumulation buffers."""
    pytest.importorskip("deepspeed")
    from bench.targets import deepspeed_cpu as b

    spec = load_model("tiny-llama")
    setup = Setup(stack="deepspeed", device="cpu", zero=zero, dp=dp, offload=offload, precision="bf16-master",
                  batch=1, seq=32, optimizer="adamw", grad_accum=accum)
    want = train_memory(spec, setup).host_memory
    # ZeRO-1/2's accumulation buffers hold each partition parameter whole (stage_1_and_2.py:1822-1825): a parameter
    # the partition edge cuts adds its other part, at most the largest parameter (the NB in analytic/parallel/
    # deepspeed.py); everything else to the byte
    cut = spec.vocab * spec.hidden * 2 if (zero < 3 and accum > 1) else 0
    for r in b.offload_probe(spec, setup):
        assert want <= sum(r["host"].values()) <= want + cut, r
