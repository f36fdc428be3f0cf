"""The fake CUDA SDPA (trace/cuda_kernels.py) takes the kernel CUDA's dispatcher takes: flash needs one head width
for q, k and v (sdp_utils.cpp check_head_dim_size_flash), so MLA's narrower v goes to the memory-efficient kernel,
whose output has v's width. Before, the trace of a DeepSeek step in bf16 crashed in o_proj (q's width out)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.trace import trace_spec
from trainfit.trace.cuda_kernels import _cuda_sdpa


def test_a_narrower_v_takes_the_efficient_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # the CUDA kernels run as their fake (meta) kernels, as in the trace
        q = torch.empty(1, 2, 8, 24, dtype=torch.bfloat16)
        v = torch.empty(1, 2, 8, 16, dtype=torch.bfloat16)
        out = _cuda_sdpa(F.scaled_dot_product_attention)(q, q, v, is_causal=True)
    assert out.shape == (1, 2, 8, 16)


def test_deepseek_trains_in_bf16_under_cuda_semantics():
    est = trace_spec(load_model("tiny-deepseek"), Setup(batch=2, seq=64, precision="amp-bf16", device="cuda"))
    assert est.memory.peak > est.memory.weights
