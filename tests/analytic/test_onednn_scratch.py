"""oneDNN's 16-bit matmul scratch in the analytic engine (analytic/onednn.py): the ISA rule on known CPUs, and the
formula against what the op really allocates on this CPU (the trace engine's probe, trace/kernel_scratch.py)."""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from trainfit.analytic import onednn
from trainfit.setup import Setup

# /proc/cpuinfo flags (the ones the rule reads) of a few CPUs
HASWELL = frozenset({"avx", "avx2", "fma"})
ICE_LAKE = HASWELL | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
ZEN4 = ICE_LAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}
SIERRA_FOREST = HASWELL | {"avx_vnni", "avx_vnni_int8", "avx_ne_convert"}


@pytest.mark.parametrize("flags,cap,isa,bf16", [
    (HASWELL, "", "avx2", False),
    (ICE_LAKE, "", "avx512_core_vnni", True),  # AVX-512 without BF16: oneDNN's gemm:jit:bf16
    (ZEN4, "", "avx512_core_bf16", True),
    (ZEN4, "AVX2", "avx2", False),  # the cap the CI's second families run sets
    (ZEN4, "avx512_core", "avx512_core", True),
    (ZEN4, "AVX2_VNNI_2", "avx2", False),  # the cap's mask admits no AVX-512, and this CPU has no AVX-VNNI
    (SAPPHIRE_RAPIDS, "", "avx512_core_amx", True),
    (SAPPHIRE_RAPIDS, "AVX512_CORE_AMX", "avx512_core_amx", True),  # an alias (cpu_isa_traits.cpp:36-46)
    (SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", "avx512_core_bf16", True),
    (SIERRA_FOREST, "", "avx2_vnni_2", True),
    (ZEN4, "NO_SUCH_ISA", "avx512_core_bf16", True),  # an unknown value caps nothing
])
def test_the_isa_rule_on_known_cpus(flags, cap, isa, bf16):
    assert onednn.effective_isa(flags, cap) == isa
    assert onednn.onednn_matmul("bf16", flags, cap) is bf16


def test_fp16_takes_the_path_on_fewer_cpus():
    # ideep has_fp16_type_support: avx512_core_fp16 and up, or avx2_vnni_2 (abstract_types.hpp:96-101)
    assert not onednn.onednn_matmul("fp16", ZEN4, "")
    assert onednn.onednn_matmul("fp16", SAPPHIRE_RAPIDS, "")
    assert onednn.onednn_matmul("fp16", SIERRA_FOREST, "")


def test_scratch_only_for_a_cpu_step_in_16_bit_on_the_path():
    isa = onednn.effective_isa()
    on_path = onednn.onednn_matmul("bf16")
    cpu_bf16 = Setup(batch=2, seq=128, precision="bf16", device="cpu")
    assert (onednn.gemm_scratch(cpu_bf16, 256, 128, 256) > 0) is on_path, isa
    for other in (cpu_bf16.with_(device="cuda"), cpu_bf16.with_(precision="fp32")):
        assert onednn.gemm_scratch(other, 256, 128, 256) == 0
    assert onednn.matmul_scratch(2, 16, 128, isa="avx512_core_bf16", threads=2) == 0  # m·n·k <= 16³: not oneDNN


def test_threads_are_torchs():
    torch = pytest.importorskip("torch")
    assert onednn.cpu_threads() == torch.get_num_threads()


def test_the_rule_agrees_with_torch_on_this_cpu():
    torch = pytest.importorskip("torch")
    assert onednn.onednn_matmul("bf16") is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert onednn.onednn_matmul("fp16") is bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


# (M, K, N, A transposed): the layers' GEMMs at the families test's sizes (tokens 256, hidden 128, widths 256-1000:
# q/k/v/o, gate/up, down, an encoder's LM head, a weight gradient's x^T·grad and grad^T·x) and a few larger ones
SHAPES = [(256, 128, 128, False), (256, 128, 256, False), (256, 256, 128, False), (256, 128, 1000, False),
          (2, 128, 1000, False), (512, 256, 128, True), (128, 256, 512, True), (1024, 512, 1024, False),
          (100, 1000, 17, False)]


@pytest.mark.parametrize("threads", [1, 2])
def test_formula_equals_what_onednn_allocates_on_this_cpu(threads):
    """On a CPU without oneDNN's 16-bit path both read 0 (the probe's zero checks the rule); on AMX CPUs the AMX
    blocking (analytic/onednn_amx.py); on AVX2-VNNI-2 CPUs the blocking is not checked (onednn.py NB): skipped there."""
    torch = pytest.importorskip("torch")
    isa = onednn.effective_isa()
    if isa == "avx2_vnni_2":
        pytest.skip(f"oneDNN's blocking on {isa} is not checked against a real CPU (analytic/onednn.py)")
    _assert_2d_shapes(torch, SHAPES, threads)


@contextmanager
def _threads(torch, n: int | None):
    """torch's CPU threads set to `n` (None: left as they are) for the block, restored after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _assert_2d_shapes(torch, shapes, threads: int) -> None:
    """For each (M, K, N, A transposed) of `shapes` (B transposed where A is not, as nn.Linear's forward and weight
    gradient), the formula equals the probe's bytes at `threads` threads (0 = 0 off oneDNN's 16-bit path)."""
    from bench.studies import onednn_scratch
    on_path = onednn.onednn_matmul("bf16")
    with _threads(torch, threads):
        for m, k, n, ta in shapes:
            formula = onednn.matmul_scratch(m, k, n, transposed_a=ta, transposed_b=not ta,
                                            threads=threads) if on_path else 0
            assert formula == onednn_scratch.measured(m, k, n, ta, not ta), (m, k, n, ta,
                                                                             onednn.effective_isa(), threads)


# (M, K, N, A transposed): 1-row A (plain whatever its strides, K blocked as transposed) and mm's M×1 result (run as
# Cᵀ = Bᵀ·Aᵀ): brg_matmul's rules on every ISA, not only AMX's
ONE_ROW_SHAPES = [(1, 2048, 1000, False), (1, 1000, 17, True), (1, 4096, 128, False), (1000, 256, 1, True),
                  (256, 1000, 1, False), (2048, 2048, 1, False)]
# (batch, M, K, N, A transposed, B transposed): small-nemotron_h's scan bmm (C_times_states, new_states, G), batches
# whose work lets oneDNN take larger M blocks than the 2-D problem, a 1-row A, a K split at batch 1 only, the gate
BMM_SHAPES = [(16, 128, 256, 64, False, True), (16, 2, 2, 16384, False, False), (16, 128, 256, 128, False, False),
              (2, 128, 256, 64, False, True), (16, 128, 64, 256, True, False), (3, 100, 1000, 17, False, False),
              (16, 1, 2048, 1, False, False), (7, 1, 2048, 1000, False, True), (2, 256, 4096, 64, True, False),
              (1, 256, 4096, 64, True, False), (64, 16, 16, 16, False, False), (8, 1024, 4096, 64, False, False)]


def _skip_unchecked_isa():
    isa = onednn.effective_isa()
    if isa == "avx2_vnni_2":
        pytest.skip(f"oneDNN's blocking on {isa} is not checked against a real CPU (analytic/onednn.py)")
    if isa in ("avx512_core_amx", "avx512_core_amx_fp16"):
        pytest.skip("a 1-row A / a batch on AMX: onednn_amx.py's own rules, or not ported (analytic/onednn.py NB)")


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_one_row_and_one_column_products_equal_what_onednn_allocates(threads):
    torch = pytest.importorskip("torch")
    _skip_unchecked_isa()
    _assert_2d_shapes(torch, ONE_ROW_SHAPES, threads)


def _bmm(torch, b, m, k, n, ta, tb, gap=1):
    """bf16 operands for torch.bmm, A (b, m, k) and B (b, k, n) plain or transposed; `gap` spaces B's matrices
    (batch stride gap·k·n, as a view of every other matrix)."""
    a = torch.zeros(b, k, m, dtype=torch.bfloat16).transpose(1, 2) if ta else torch.zeros(b, m, k, dtype=torch.bfloat16)
    w = torch.zeros(b * gap, n, k, dtype=torch.bfloat16)[::gap].transpose(1, 2) if tb else \
        torch.zeros(b * gap, k, n, dtype=torch.bfloat16)[::gap]
    return a, w


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_batched_formula_equals_what_bmm_allocates_on_this_cpu(threads):
    """aten.bmm in bf16 reaches oneDNN with its batch (mkldnn_matmul): the batch feeds the blocking's parallel work;
    the per-thread buffers are one block's."""
    torch = pytest.importorskip("torch")
    _skip_unchecked_isa()
    from trainfit.trace.kernel_scratch import scratch_of
    on_path = onednn.onednn_matmul("bf16")
    with _threads(torch, threads):
        for b, m, k, n, ta, tb in BMM_SHAPES:
            a, w = _bmm(torch, b, m, k, n, ta, tb)
            peak, live = scratch_of(lambda: torch.bmm(a, w))
            formula = onednn.matmul_scratch(m, k, n, transposed_a=ta, transposed_b=tb, threads=threads,
                                            batch=b) if on_path else 0
            assert formula == peak - live, (b, m, k, n, ta, tb, threads)


def test_bmm_copies_an_operand_whose_matrices_are_not_packed():
    """mkldnn_matmul copies an operand that is neither contiguous nor transposed with packed matrices (Mamba-2's
    chunk states at one chunk, a view of every other matrix): the copy, then the primitive's scratch on the copy."""
    torch = pytest.importorskip("torch")
    _skip_unchecked_isa()
    from trainfit.trace.kernel_scratch import scratch_of
    cpu_amp = Setup(batch=2, seq=128, precision="amp-bf16", device="cpu")
    for b, m, k, n, tb in [(16, 128, 256, 64, True), (4, 64, 128, 256, False)]:
        a, w = _bmm(torch, b, m, k, n, False, tb, gap=2)
        peak, live = scratch_of(lambda: torch.bmm(a, w))
        assert onednn.bmm_scratch(cpu_amp, b, m, k, n, transposed_b=tb, copied_b=True) == peak - live, (b, m, k, n)
    assert onednn.bmm_scratch(cpu_amp.with_(device="cuda"), 16, 128, 256, 64, copied_b=True) == 0
    assert onednn.bmm_scratch(cpu_amp, 2, 8, 8, 8) == 0  # b·m·n·k <= 16³: not oneDNN


def test_the_steps_matmuls_use_this_cpus_threads():
    setup = Setup(batch=2, seq=128, precision="amp-bf16", device="cpu")
    expected = onednn.matmul_scratch(256, 128, 1000, threads=onednn.cpu_threads()) if onednn.onednn_matmul() else 0
    assert onednn.gemm_scratch(setup, 256, 128, 1000) == expected


# (batch, heads, sequence, head width, causal, threads): packed and unpacked on an AMX CPU (both lengths >= 64 and 4x
# the packed bytes of work per thread), an odd head width (its padded query block), an odd length (even key blocks)
FLASH_SHAPES = [(2, 4, 128, 32, True, 2), (1, 1, 77, 31, True, 1), (8, 4, 200, 64, False, 2), (1, 1, 63, 32, True, 2),
                (17, 1, 64, 32, True, 32), (15, 1, 64, 32, True, 16), (2, 4, 600, 128, True, 2)]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_flash_attention_buffers_equal_what_the_kernel_allocates_on_this_cpu(dtype):
    """analytic/cpu_flash.py against the trace's probe of torch's CPU flash kernel (a real call's c10 bytes inside the
    op): on an AMX CPU the bf16 kernel packs K and V (its copies and blocks), elsewhere and in fp32 it does not."""
    torch = pytest.importorskip("torch")
    from trainfit.analytic import cpu_flash
    from trainfit.trace.kernel_scratch import scratch_of

    tdt, elem = (torch.bfloat16, 2) if dtype == "bf16" else (torch.float32, 4)
    with _threads(torch, None):
        for b, h, s, d, causal, threads in FLASH_SHAPES:
            torch.set_num_threads(threads)
            q = torch.zeros(b, h, s, d, dtype=tdt)
            peak, live = scratch_of(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, q, q, is_causal=causal))
            formula = cpu_flash.scratch(s, s, d, elem, batch=b, heads=h, causal=causal, threads=threads)
            assert formula == peak - live, (b, h, s, d, causal, threads, onednn.effective_isa())
