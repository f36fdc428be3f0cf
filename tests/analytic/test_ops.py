"""The op list (analytic/ops/) against independent counts: flops.py's per-token FLOPs (a different code path: weights
per token from the parameter counts), the 2× backward of a GEMM, and one small layer's bytes derived by hand."""
from __future__ import annotations

import pytest

from trainfit.analytic.flops import forward_per_token
from trainfit.analytic.ops import Shape, backward, compiled, embedding_forward, head_forward, layer_forward
from trainfit.analytic.params import count_params
from trainfit.models.resolve import load_model


def _forward_flops(spec, sh: Shape) -> float:
    pc = count_params(spec)
    dense = sum(o.flops for o in layer_forward(spec, sh, moe=False))
    moe = sum(o.flops for o in layer_forward(spec, sh, moe=True)) if spec.moe is not None else 0.0
    ends = sum(o.flops for o in embedding_forward(spec, sh) + head_forward(spec, sh))
    return pc.dense_layers * dense + pc.moe_layers * moe + ends


def _bias_weights_per_token(spec) -> float:
    """Vectors that flops.py's parameter counts (params.py: attention and MLP include biases and Qwen3's q/k norm
    weights) multiply as matrices at 2 FLOPs each; the op list adds them in GEMM epilogues / norms instead."""
    pc = count_params(spec)
    attn = (spec.q_dim + 2 * spec.kv_dim if spec.qkv_bias else 0) + (spec.hidden if spec.out_bias else 0)
    attn += 2 * spec.head_dim if spec.qk_norm else 0
    mlp = ((2 if spec.gated_mlp else 1) * spec.intermediate + spec.hidden) if spec.mlp_bias else 0
    return 2 * (spec.layers * attn + pc.dense_layers * mlp)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "phi-3-mini", "gemma-7b", "gpt2",
                                  "bert-base", "pythia-160m", "qwen3-8b", "opt-125m", "gemma-2-2b"])
def test_forward_flops_match_flops_py(name):
    spec = load_model(name)
    sh = Shape(batch=2, seq=1024)
    want = (forward_per_token(spec, 1024) - _bias_weights_per_token(spec)) * 2 * 1024
    assert _forward_flops(spec, sh) == pytest.approx(want, rel=1e-12)


def test_tensor_parallel_splits_the_matmuls():
    spec = load_model("llama-3.1-8b")
    one = sum(o.flops for o in layer_forward(spec, Shape(batch=1, seq=4096)))
    eight = sum(o.flops for o in layer_forward(spec, Shape(batch=1, seq=4096, tp=8, sp=True)))
    assert eight == pytest.approx(one / 8, rel=1e-12)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt2", "mixtral-8x7b"])
def test_backward_gemms_are_twice_the_forward(name):
    """dgrad (m,k,n) + wgrad (k,n,m): each 2·m·n·k (Narayanan et al. 2021 §5.1: backward = 2 × forward)."""
    spec = load_model(name)
    fwd = layer_forward(spec, Shape(batch=1, seq=512), moe=spec.moe is not None)
    f = sum(o.flops for o in fwd if o.kind == "gemm")
    b = sum(o.flops for o in backward(fwd) if o.kind == "gemm")
    assert b == pytest.approx(2 * f, rel=1e-12)
    # attention's backward: FlashAttention-2 §3.1 counts 2.5× the forward's matmul FLOPs
    fa = sum(o.flops for o in fwd if o.kind == "attention")
    ba = sum(o.flops for o in backward(fwd) if o.kind == "attention")
    assert ba == pytest.approx(2.5 * fa, rel=1e-12)


def test_tiny_llama_layer_bytes_by_hand():
    """tiny-llama (h 256, i 688, q 8×32, kv 2×32), pure bf16 (2 B everywhere), HF kernels, per token:
      HF RMSNorm, six kernels in fp32: to(fp32) 2h+4h, pow 4h+4h, mean 4h+4, rsqrt (+eps, two kernels on one
      float) 4+4, mul 4h+4 + 4h, to(bf16) 4h+2h, weight mul 2h+2h  -> 36h + 16, twice per layer;
      rotary per projection of width w (rotate_half = neg of half + cat, then ·cos, ·sin, add):
      w+w, 2w+2w, 2w+2w, 2w+2w, 4w+2w -> 20w, for q (256) and k (64);
      two residual adds, 2h+2h read, 2h written -> 6h each;
      SiLU 2i+2i, its product with up 4i+2i -> 10i."""
    spec = load_model("tiny-llama")
    h, i, q, kv = 256, 688, 256, 64
    per_token = 2 * (36 * h + 16) + 20 * q + 20 * kv + 2 * 6 * h + 10 * i
    ops = layer_forward(spec, Shape(batch=1, seq=128))
    assert sum(o.nbytes for o in ops if o.kind == "memory") == pytest.approx(128 * per_token, rel=1e-12)
    # compiled (inductor fuses each elementwise chain between two matmuls): norm reads x, writes its bf16 output
    # (4h); rotary on q and k in one kernel (4q + 4kv); residual add (6h) fused with the MLP norm (+ its read of x
    # and its output: 4h); SiLU·mul reads gate and up, writes the product (6i... gate 2i + up 2i, product 2i);
    # the last residual add 6h
    fused = 4 * h + 4 * q + 4 * kv + 6 * h + 4 * h + 6 * i + 6 * h
    got = sum(o.nbytes for o in compiled(ops) if o.kind == "memory")
    assert got == pytest.approx(128 * fused, rel=1e-12)


def test_op_sac_reruns_every_second_matmul_and_not_sdpa():
    """torchtitan's per-op SAC (activation_checkpoint.py:110-116) stores the outputs of the 1st, 3rd, 5th, 7th mm of a
    Llama block (wq, wv, w1... in call order q, k, v, o, gate, up, down: q, v, gate, down) and the SDPA kernel's;
    the backward re-runs k, o, up and every elementwise kernel."""
    from trainfit.analytic.ops import recomputed
    from trainfit.setup import Setup

    spec = load_model("llama-3.1-8b")
    setup = Setup(stack="torchtitan", recompute="op", batch=1, seq=512)
    fwd = layer_forward(spec, Shape(batch=1, seq=512, norm="torch-rms-norm", rope="complex-buffer"))
    rerun = recomputed(spec, setup, fwd)
    assert [o.name for o in rerun if o.kind == "gemm"] == ["k", "o", "up"]
    assert not any(o.kind == "attention" for o in rerun)
    assert [o for o in fwd if o.kind == "memory"] == [o for o in rerun if o.kind == "memory"]


def test_packed_attention_flops_are_the_documents_sum():
    """--doc-len (analytic/packing.py): an 8192-token row packed from documents, each attending causally within
    itself, costs Σ d(d+1)/2 query-key pairs per head, 4 FLOPs per pair per head dim (q·kᵀ and p·v). Eight 1024-token
    documents (L = Σd²/Σd = 1024): 8 · 1024 · 1025 / 2 = 4,198,400 pairs, against the unpacked row's
    8192 · 8193 / 2 = 33,558,528; llama-3.1-8b, 32 heads of 128, micro-batch 1."""
    from trainfit.analytic.ops import layer_forward as lf

    spec = load_model("llama-3.1-8b")

    def core(sh):
        return sum(o.flops for o in lf(spec, sh) if o.kind == "attention")

    assert core(Shape(batch=1, seq=8192, doc_len=1024)) == pytest.approx(4 * 32 * 128 * 4_198_400, rel=1e-12)
    assert core(Shape(batch=1, seq=8192)) == pytest.approx(4 * 32 * 128 * 33_558_528, rel=1e-12)
    # mixed lengths: 4096 + 2048 + 1024 + 512 + 512 tokens, L = Σd²/Σd = 22,544,384 / 8192 = 2752
    docs = [4096, 2048, 1024, 512, 512]
    assert sum(docs) == 8192 and sum(d * d for d in docs) / 8192 == 2752
    # the setting's token-weighted mean: Σ d(d+1)/2 = (Σd² + Σd)/2 = 8192 · (2752 + 1)/2
    assert core(Shape(batch=1, seq=8192, doc_len=2752)) == pytest.approx(
        4 * 32 * 128 * sum(d * (d + 1) / 2 for d in docs), rel=1e-12)
    # the GEMMs and every per-token op are unchanged
    gemms = [(o.name, o.flops) for o in lf(spec, Shape(batch=1, seq=8192)) if o.kind != "attention"]
    assert gemms == [(o.name, o.flops) for o in lf(spec, Shape(batch=1, seq=8192, doc_len=1024)) if o.kind != "attention"]
