"""A masked SDPA call under CUDA semantics takes the kernel CUDA's dispatcher takes (trace/cuda_masked_sdpa.py): the
memory-efficient kernel when sdp_utils.cpp can_use_mem_efficient_attention's checks hold — 16-bit or fp32, q's and
k's head widths equal and q's and v's multiples of 8 (16-bit) or 4 (fp32), one head count — with the mask as an
additive bias, else the math path. The expectations are the dispatcher's rules read off sdp_utils.cpp, checked by
the aten ops the fake call runs."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from trainfit.trace.cuda_kernels import _cuda_sdpa  # noqa: E402

EFFICIENT = "_scaled_dot_product_efficient_attention"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.overloadpacket.__name__, args))
        return func(*args, **(kwargs or {}))


def _run(dtype, d_qk=32, d_v=None, kv_heads=4, k_len=16, mask="bool", efficient=True, grad=True):
    """Forward and backward of one masked call on fake tensors; the aten ops it ran and the bias's gradient."""
    with FakeTensorMode():
        q = torch.empty(2, 4, 16, d_qk, dtype=dtype, requires_grad=grad)
        k = torch.empty(2, kv_heads, k_len, d_qk, dtype=dtype, requires_grad=grad)
        v = torch.empty(2, kv_heads, k_len, d_v or d_qk, dtype=dtype, requires_grad=grad)
        if mask == "bool":
            m = torch.ones(2, 1, 16, k_len, dtype=torch.bool)
        else:  # T5's relative position bias: float, one batch row, requires grad
            m = torch.zeros(1, 4, 16, k_len, dtype=dtype, requires_grad=True)
        with _Ops() as ops:
            out = _cuda_sdpa(F.scaled_dot_product_attention, efficient=efficient)(
                q, k, v, attn_mask=m, enable_gqa=kv_heads != 4)
            if grad:
                out.sum().backward()
    names = [n for n, _ in ops.calls]
    return names, ops.calls, out, (m.grad if mask == "float" else None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_masked_call_takes_the_efficient_kernel(dtype):
    names, calls, out, _ = _run(dtype)
    assert EFFICIENT in names and f"{EFFICIENT}_backward" in names
    assert not any("softmax" in n for n in names)  # no (b, h, q, k) probabilities
    args = next(a for n, a in calls if n == EFFICIENT)
    assert args[3].shape == (2, 4, 16, 16) and args[3].dtype == dtype  # the boolean mask as an additive bias
    assert args[4] is True  # logsumexp kept for backward
    assert out.shape == (2, 4, 16, 32)


def test_no_logsumexp_without_grad():
    names, calls, _, _ = _run(torch.bfloat16, grad=False)
    assert next(a for n, a in calls if n == EFFICIENT)[4] is False


@pytest.mark.parametrize("case", [dict(d_qk=36), dict(d_qk=30, dtype=torch.float32), dict(kv_heads=2),
                                  dict(efficient=False), dict(dtype=torch.float64)])
def test_the_math_path_where_the_efficient_kernel_refuses(case):
    names, _, _, _ = _run(**{"dtype": torch.bfloat16, **case})
    assert EFFICIENT not in names and "_safe_softmax" in names  # the math path's softmax over (b, h, q, k)


def test_fp32_head_width_multiple_of_four_is_taken():
    names, _, _, _ = _run(torch.float32, d_qk=36)  # 36 % 4 == 0: fp32's alignment is 4, 16-bit's 8
    assert EFFICIENT in names


def test_a_narrower_v_with_a_mask_is_taken():
    names, _, out, _ = _run(torch.bfloat16, d_qk=32, d_v=16)  # q and k equal, v its own width
    assert EFFICIENT in names and out.shape[-1] == 16


def test_an_unaligned_mask_is_padded():
    names, calls, _, _ = _run(torch.bfloat16, k_len=13)  # stride 13 is not a multiple of 8: pad_bias
    assert "constant_pad_nd" in names
    assert next(a for n, a in calls if n == EFFICIENT)[3].shape == (2, 4, 16, 13)


def test_a_bias_that_requires_grad_gets_its_gradient():
    names, calls, _, grad = _run(torch.bfloat16, mask="float")
    bwd = next(a for n, a in calls if n == f"{EFFICIENT}_backward")
    assert bwd[10][3] is True  # grad_input_mask: the bias's gradient computed inside the kernel
    assert grad is not None and grad.shape == (1, 4, 16, 16)
