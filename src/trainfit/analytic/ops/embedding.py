"""The first stage's input: the embedding gathers forward, embedding_dense_backward backward."""
from __future__ import annotations

from ...spec import ModelSpec
from ..activations import INDEX
from .norm import norm_ops
from .op import Op, Shape, bwd_kernel, column_sum_launches, memory
from .residual import dropout

def embedding_forward(spec: ModelSpec, sh: Shape) -> list[Op]:
    """The first stage's input: the token gather (and learned positions, BERT's token types and LayerNorm, Gemma's
    √h scale, embedding dropout). NB: OPT-350m's project_in GEMM is not listed (as in flops.py). The gather's
    backward is embedding_dense_backward (embedding_backward), no elementwise kernel."""
    h, T, r = spec.embed_proj_dim or spec.hidden, sh.tokens, sh.residual
    w = sh.weight
    ops = [memory("embed", T * h * w + T * INDEX, T * h * r, "modeling_llama.py:370 embed_tokens (gather)", "embed",
               saves=False, grad=False)]
    if spec.positions == "learned":
        # GPT-2 (modeling_gpt2.py:567-575): wpe gathers the [1, s] position ids' rows, then a broadcast add; the
        # add's backward passes the gradient to the tokens' rows and sums it over the batch for the positions'
        # (sum_to_size: a column sum over b rows), whose table then takes embedding_dense_backward (embedding_backward)
        s, b = sh.seq / sh.cp, sh.batch
        ops.append(memory("embed_positions", s * h * (w + r) + s * INDEX + T * h * r, (s + T) * h * r,
                       "modeling_gpt2.py:574 wpe + add", "embed", saves=False, kernels=2, bwd_ops=(
                           bwd_kernel("embed_positions.grad_sum", T * h * r, s * h * r, "reduce",
                                   column_sum_launches(b)),)))
    if spec.type_vocab:
        ops.append(memory("embed_types", T * h * (w + r), T * h * r, "modeling_bert.py token_type_embeddings + add",
                       "embed", saves=False))
    if spec.family.startswith("gemma"):
        ops.append(memory("embed_scale", T * h * r, T * h * r, "modeling_gemma.py normalizer", "embed", saves=False))
    if spec.embedding_norm:
        ops += norm_ops(spec, "embed_norm", T, sh, "embed")
    if spec.dropouts[0] > 0:
        ops += dropout("embed_dropout", T * h, sh, "embed")
    return ops


# embedding_dense_backward_cuda's direct path (aten/src/ATen/native/cuda/Embedding.cu: `if (num_indices <= 3072 &&
# !scale_grad_by_freq)`: at::zeros + one embedding_backward_feature_kernel); above it, the indices are sorted first
EMBEDDING_DIRECT_MAX = 3072


def embedding_backward(spec: ModelSpec, sh: Shape, tied: bool = False) -> list[Op]:
    """embedding_dense_backward of the token table (and of GPT-2's position table): a zeroed V/t × h gradient (a fill
    kernel), then, for up to EMBEDDING_DIRECT_MAX indices, one kernel summing the T rows of dY into it (the H200
    profiles: one fill + one embedding_backward_feature_kernel per table); above, the indices radix-sorted (cub) and
    embedding_backward_cuda_kernel's segment sums (NB: counted 3 + 1 kernels, not profiled). `tied`: the LM head
    shares the table (tied_embeddings, one stage), so its two gradients meet in autograd's InputBuffer::add
    (torch/csrc/autograd/input_buffer.cpp): one add_ over V/t × h (the H200 gpt2 profiles: add_ of [50257, 768])."""
    h, T = spec.embed_proj_dim or spec.hidden, sh.tokens
    ops = embedding_grad("embed", spec.vocab / sh.tp, T, h, sh)
    if spec.positions == "learned":
        ops += embedding_grad("embed_positions", spec.max_positions + spec.position_offset, sh.seq / sh.cp, h, sh)
    if tied:
        x = spec.vocab / sh.tp * h * sh.grad
        ops.append(memory("embed.tied_grad_sum", 2 * x, x, "autograd InputBuffer::add (tied LM head)", saves=False))
    return ops


def embedding_grad(name: str, rows: float, indices: float, h: float, sh: Shape) -> list[Op]:
    """One table's embedding_dense_backward (embedding_backward): rows × h zeroed, `indices` rows of dY summed in."""
    src = "aten embedding_dense_backward (Embedding.cu)"
    ops = [memory(f"{name}.grad_zero", 0, rows * h * sh.grad, src, saves=False)]
    if indices > EMBEDDING_DIRECT_MAX:
        ops.append(memory(f"{name}.grad_sort", 2 * indices * INDEX, 2 * indices * INDEX, src, saves=False, kernels=3))
    return ops + [memory(f"{name}.grad_scatter", indices * h * (sh.residual + sh.grad), indices * h * sh.grad, src,
                      saves=False)]
