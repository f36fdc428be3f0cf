"""The kernel-scratch probe (trace/kernel_scratch.py) against independent truths: a formula derived from
PyTorch's source, and the measure engine's own reading of a real run (torch.profiler.profile +
trainfit.measure.cpu_peak.analyse, a different code path from the probe's)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten

from trainfit.measure.cpu_peak import analyse, profile_run
from trainfit.setup import Setup
from trainfit.trace import trace
from trainfit.trace import kernel_scratch as ks
from trainfit.trace.cpu_casts import cast_scratch
from trainfit.trace.fake import fake_mode
from trainfit.trace.recorder import AllocationRecorder

aten = torch.ops.aten


def real_scratch(func, *args) -> int:
    """Peak minus what is left (the outputs) of one real call, as the measure engine reads a step."""
    prof, out = profile_run(lambda phase: func(*args))
    del out
    p = analyse(prof, 0)
    return p.peak - p.end


def probe(func, *args, **kwargs) -> int:
    leaves, spec = tree_flatten((args, kwargs))
    return ks.measure_call(func, leaves, spec)


def isa() -> str:
    return " ".join(f"{k}={v}" for k, v in ks.cpu_isa().items())


@pytest.mark.parametrize("op", [aten.add.Tensor, aten.add_.Tensor, aten.mul.Tensor])
def test_probe_reads_mixed_dtype_cast_scratch_exactly(op):
    # TensorIterator's mixed-dtype copies (cpu_casts.py, by formula from TensorIterator.cpp) are kernel-internal
    # c10 allocations on any CPU: the probe, fed fake tensors like the recorder's, must measure exactly them.
    with fake_mode():
        a = torch.empty(1000, dtype=torch.bfloat16)
        b = torch.empty(3, 1000)
        out = op(a, b[1]) if op is not aten.add_.Tensor else a
        n = probe(op, a, b[1])
        expected = cast_scratch(op, (a, b[1]), out)
    assert expected > 0
    assert n == expected, isa()


def test_probe_of_flash_attention_matches_its_buffer_formula():
    # FlashAttentionKernel.cpp (cpu_flash_attention): per thread, an at::empty accumulate-type buffer of
    # qSplitSize*kvSplitSize (qk) + qSplitSize (max) + qSplitSize (sum) + qSplitSize*headSize (dst) floats;
    # q_seq_len < 192 -> qSplitSize 32, kvSplitSize = min(512, kv_len); fp32 needs no reduced buffer.
    b, h, s, d = 2, 4, 64, 16
    q = torch.zeros(b, h, s, d)
    expected = torch.get_num_threads() * (32 * s + 32 + 32 + 32 * d) * 4
    assert probe(aten._scaled_dot_product_flash_attention_for_cpu.default, q, q, q, 0.0, True) == expected, isa()


def _mats(dtype):
    x = torch.randn(128, 64).to(dtype)
    w = torch.randn(1000, 64).to(dtype)
    bias = torch.randn(1000).to(dtype)
    batch = torch.randn(8, 64, 32).to(dtype)
    padded = torch.randn(128, 96).to(dtype)[:, :64]  # not dense, but a valid BLAS leading dimension: no copy
    strided = torch.randn(128, 128).to(dtype)[:, ::2]  # neither contiguous nor transposed: cloned inside
    return [
        ("mm-padded", aten.mm.default, (padded, w.t())),
        ("mm", aten.mm.default, (x, w.t())),
        ("mm-contiguous", aten.mm.default, (x, w.t().contiguous())),
        ("addmm-bias", aten.addmm.default, (bias, x, w.t())),
        ("bmm", aten.bmm.default, (batch, batch.transpose(1, 2))),
        ("mm-strided", aten.mm.default, (strided, w.t())),
    ]


# (fp32 in the heavy tier: its matmuls take MKL, not oneDNN, on every CPU; bf16 is the ISA-dependent one)
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.heavy)], ids=str)
def test_probe_of_matmuls_equals_a_real_run(dtype):
    # On an AVX2 CPU (or with ONEDNN_MAX_CPU_ISA=AVX2) bf16 matmuls allocate nothing through c10 except layout
    # copies; on AVX512/AMX CPUs oneDNN's reorders and scratchpad. Either way the probe must read what a real
    # run of the same op shows to the measure engine.
    for name, op, args in _mats(dtype):
        with fake_mode() as mode:
            fake = [mode.from_tensor(a) for a in args]
            scratch = ks.KernelScratch()
            traced = scratch.bytes(op, tuple(fake), {}, op(*fake))
        assert traced == real_scratch(op, *args), f"{name} {dtype}: {isa()}"
    # the strided operand's copy is a real, non-zero allocation on every CPU: the check can fail
    assert real_scratch(aten.mm.default, *_mats(dtype)[-1][2]) > 0


def test_known_zero_matmul_above_the_cap_is_zero_in_a_real_run():
    # fp32 at default precision never reaches oneDNN (Matmul.cpp use_mkldnn_*_matmul): MKL's buffers are not
    # c10's. A matmul above the probe cap is taken as 0 from its verified layout class; a real run must agree.
    n = 1024
    assert 2 * n ** 3 > ks.PROBE_MAX_FLOPS
    a, b = torch.randn(n, n), torch.randn(n, n)
    with fake_mode() as mode:
        fa, fb = mode.from_tensor(a), mode.from_tensor(b.t())
        scratch = ks.KernelScratch()
        traced = scratch.bytes(aten.mm.default, (fa, fb), {}, aten.mm.default(fa, fb))
    assert scratch.known_zero == 1 and not scratch.unprobed
    assert traced == real_scratch(aten.mm.default, a, b.t()) == 0, isa()


def test_cuda_semantics_never_probe():
    rec = AllocationRecorder(round_cuda=True)
    assert rec.kernels is None and not rec.probed
    est = trace(torch.nn.Linear(16, 4), torch.randn(3, 16), Setup(batch=3, seq=1, precision="fp32", device="cuda"))
    assert "cpu_isa" not in est.detail.records and "kernel_scratch" not in est.detail.records


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        q = self.proj(x)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_kernel_above_the_cap_is_named_in_a_note():
    x = torch.randn(1, 8, 1024, 64)  # 4*8*1024*64*1024 FLOPs forward: above the cap
    assert 4 * x.numel() * x.shape[-2] > ks.PROBE_MAX_FLOPS
    est = trace(_Attention(), x, Setup(batch=1, seq=1024, precision="fp32", device="cpu"))
    assert est.detail.records["cpu_isa"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert "_scaled_dot_product_flash_attention_for_cpu.default" in est.detail.records["kernel_scratch"]["unprobed"]
    assert any(n.startswith("NB: internal scratch not measured") and "under-read" in n for n in est.notes)


def test_no_probe_inside_a_callers_profiler_session():
    # Starting our own session would end the caller's: the call is listed as not measured instead.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, fake_mode():
        q = torch.empty(2, 4, 64, 16)
        scratch = ks.KernelScratch()
        n = scratch.bytes(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.0, True), {}, None)
        assert torch.autograd._profiler_enabled()
    assert n == 0 and scratch.probes == 0 and scratch.unprobed
    assert prof.events() is not None
