"""The op list's vocabulary: one kernel call (Op), what a micro-batch's shapes depend on (Shape), and the builders
every cost function uses (a GEMM, a memory-bound kernel, one kernel of a backward)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...low_precision import RECIPES
from ..roofline import attention_pairs

SIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 1}
# weight formats whose GEMMs run quantised while attention runs on the 16-bit activations: bitsandbytes' LLM.int8
# (int8 matmuls inside Linear8bitLt, fp16 everywhere else) and fp8 weights (vLLM's fp8 linear methods; attention in
# the model dtype unless the KV cache is fp8). NB: timed at the fp16 rate, the bf16 one on every GPU with bf16 cores.
QUANTISED_GEMMS = ("int8", "fp8")


def attention_dtype(sh: "Shape") -> str:
    """The dtype attention's matmuls run in: the step's matmul dtype, or fp16 beside quantised GEMMs."""
    return "fp16" if sh.dtype in QUANTISED_GEMMS else sh.dtype


class Op(NamedTuple):
    """One kernel call. gemm: C[m,n] = A[m,k]·B[k,n], `batch` of them; attention: batch = b·heads, m = s_q,
    n = s_kv, k = head_dim; memory: `reads` + `writes` bytes over `kernels` launches. (A NamedTuple: the planner
    builds thousands, and dataclasses.replace is ~20× slower than _replace.)"""

    name: str
    kind: str  # "gemm" | "attention" | "memory"
    dtype: str
    m: float = 0.0
    n: float = 0.0
    k: float = 0.0
    batch: float = 1.0
    causal: bool = False
    kernel: str = ""  # attention kernel: flash, efficient, eager
    reads: float = 0.0
    writes: float = 0.0
    kernels: int = 1
    saves_input: bool = True  # memory: its backward reads its input
    wgrad: bool = True  # gemm: B is a trained weight
    bias: bool = False  # gemm: a bias added in the epilogue (its gradient is a reduction of dY)
    group: str = ""  # memory: the fusion group under torch.compile
    fused_reads: float = 0.0  # memory: bytes that still cross HBM when its group is one kernel
    fused_writes: float = 0.0
    backward: bool = False  # attention: the backward kernel
    grad: bool = True  # memory: has a backward kernel (False: fp8 casts, whose backward fp8_backward_extra lists)
    source: str = ""
    bwd_kernels: int = -1  # memory: kernels its autograd backward launches (-1: as many as the forward)
    # memory: how the kernel reaches memory (roofline.memory_seconds): "vector" (contiguous, vectorised loads),
    # "upcast" (16 -> 32-bit conversion), "strided" (a broadcast or gathered operand), "transpose" (a layout copy)
    access: str = "vector"
    bwd_access: str = ""  # its backward kernel's access ("" = the same)
    mask: int = 0  # attention, HF eager: bytes per element of its additive causal mask (0: none; roofline.unfused_attention)
    dropout: bool = False  # attention: dropout on the probabilities inside the fused kernel (roofline.fused_dropout_seconds)
    gqa: bool = False  # attention: k and v shared by groups of query heads (fewer kv heads)
    # memory: its backward's kernels spelled out (derivatives.yaml), where the generic rule (`backward`: read the
    # output's gradient and the saved input, write the input's gradient, once) under-counts a multi-kernel formula
    bwd_ops: tuple = ()
    # gemm: its `batch` GEMMs launched one by one, round-robin over this many streams (a grouped GEMM of separate
    # cuBLAS calls: compute_time.time_ops); 0: one batched launch
    streams: int = 0
    # gemm: its tensor-parallel split, "col" (output columns over tp: the block's input gathered before it) or "row"
    # (input rows over tp: its output reduce-scattered after it); "" without TP
    tp_split: str = ""
    # attention: a causal sliding window the fused kernel skips the key blocks outside of (Shape.window; 0: none)
    window: int = 0
    # gemm: the dimensions that are a stored operand's row, whose 16-byte alignment roofline.gemm_seconds reads: n
    # and k of a forward or dgrad, m and n of a wgrad (derived.backward)
    rows: str = "nk"

    @property
    def flops(self) -> float:
        if self.kind == "gemm":
            return 2 * self.m * self.n * self.k * self.batch
        if self.kind == "attention":
            # q·kᵀ and p·v, 2 FLOPs per MAC each; causal: the (s+1)/2 keys a query sees on average (flops.py); under
            # a sliding window, its pairs per query (roofline.attention_pairs)
            keys = (self.n + 1) / 2 if self.causal else self.n
            if self.causal and 0 < self.window < self.n:
                keys = attention_pairs(int(self.m), int(self.n), True, self.window) / self.m
            return 4 * self.batch * self.m * keys * self.k * (2.5 if self.backward else 1.0)
        return 0.0

    @property
    def nbytes(self) -> float:
        return self.reads + self.writes


@dataclass(frozen=True)
class Shape:
    """What the op shapes of one micro-batch on one rank depend on (hashable: the planner caches on it)."""

    batch: int
    seq: int
    cp: int = 1
    tp: int = 1
    sp: bool = False
    dtype: str = "bf16"  # the matmuls' dtype (timing.compute_dtype)
    act: int = 2  # bytes of an activation (StateBytes.act)
    residual: int = 2  # bytes of the residual stream (fp32 under autocast)
    weight: int = 2  # bytes of a weight as stored (autocast casts it per forward)
    grad: int = 2  # bytes of a weight gradient
    autocast: bool = False
    attention: str = "flash"  # resolved kernel: flash, efficient, eager
    norm: str = "hf-rmsnorm-fp32"  # stacks/*.toml [norm]
    rope: str = "cos-sin"  # stacks/*.toml [rotary]: "cos-sin" (HF), "complex-buffer" (torchtitan), "fused" (Megatron)
    loss_upcast: bool = True
    ep: int = 1
    compile: bool = False
    float8: bool = False
    fused_elementwise: bool = False  # fused bias-GeLU and bias-dropout-add kernels (stacks/*.toml [fused_elementwise])
    sdpa: bool = False  # the stack calls torch's scaled_dot_product_attention (stacks/*.toml [attention])
    # HF's eager_attention_forward adds a float causal mask made in the embeddings' output dtype, the parameters'
    # (stacks/*.toml [attention] eager_mask: transformers masking_utils.py:965, :615-617): its bytes; 0 else
    eager_mask: int = 0
    # transformers' own eager_attention_forward (attention="eager", or a family without SDPA), not SDPA's math path
    hf_eager: bool = False
    # the loss pads and shifts its labels itself (stacks/*.toml [loss] labels = "shifted-copy": ForCausalLMLoss)
    shifted_labels: bool = False
    # an inference step of one new token per sequence against a cache (infer_time's decode): a Gated DeltaNet layer
    # then runs its recurrent rule, not the chunked one (ops/gated_deltanet.py)
    decode: bool = False
    # the causal sliding window of this kind of layer where the stack's fused attention skips the key blocks
    # outside it (analytic/windowed.py); 0: every layer attends over the whole causal prefix
    window: int = 0
    # every layer's SDPA gets an explicit mask: Gemma 3 with images, whose image blocks attend both ways
    # (analytic/siglip.py image_block_masks; ops/layer.py masked_sdpa, chunk_mask_ops)
    masked: bool = False
    # --low-precision run by Transformer Engine (stacks/*.toml [low_precision] library): the recipe's name, its
    # GEMMs at the recipe's peak and TE's casts around them (ops/te_casts.py); "" otherwise
    te: str = ""
    te_weight_share: float = 1.0  # of a weight's once-per-step quantisation, the part one micro-batch carries
    # the --low-precision recipe of the float8 projections (low_precision.RECIPES; analytic/torchao_recipes.py), "" off
    lp: str = ""
    # torchao's MX cast kernels, (dim0, dim1): their access kinds (roofline.memory_seconds; stacks/*.toml
    # [low_precision] mx_cast_kernels for the setup's --mx-scale); () off or unknown (streaming)
    mx_casts: tuple = ()
    # the sparse MoE block's op list (stacks/*.toml [moe] block: ops/layer.py MOE_BLOCKS) and whether the stack's
    # router adds its load-balancing loss in training ([moe] aux_loss)
    moe_block: str = "transformers"
    moe_aux_loss: bool = False
    # torchtitan's block: the model's MoEArgs multiply the routed input by its score before the experts (llama4:
    # analytic/torchtitan_moe.py model_fact; ops/torchtitan_moe.py)
    moe_scored: bool = False
    # the busiest expert-parallel rank's routed copies over the balanced mean (analytic/moe_imbalance.py): its
    # expert GEMMs and expert-side elementwise ops run on that many (ops/moe.py)
    moe_load: float = 1.0
    # --moe-force-balance: the router's logits replaced by noise before its top-k (ops/megatron_moe.py router_ops)
    moe_force_balance: bool = False
    # the streams a grouped expert GEMM's per-expert calls are spread over (stacks/*.toml [moe] gemm_streams); 0: one
    # batched launch
    moe_gemm_streams: int = 0
    # Megatron's expert tensor-parallel degree where it is not tp (--etp; 0: tp's): its alltoall dispatcher gathers
    # the etp group's received copies and each expert runs 1/etp of its width (ops/megatron_moe.py)
    expert_tp: int = 0
    # --ulysses (of `cp`, the ranks sharing a sequence): the attention core runs heads / ulysses over the sequence
    # (analytic/long_context.py)
    ulysses: int = 1
    # --doc-len: sequences packed from documents of that (token-weighted mean) length, each attending within its own
    # (analytic/packing.py); 0: one document per sequence
    doc_len: float = 0
    # --cp under a ring that merges its steps' outputs in fp32 (stacks/*.toml [context_parallel] merge: torch's, on
    # torchtitan): the merge kernels around the attention core (ops/ring_merge.py)
    cp_merge: bool = False
    # --liger: Liger's Triton RoPE in place of the stack's rotary (ops/rotary.py liger_rotary) and, without the
    # tiled MLP, its SwiGLU in place of the MLP's activation and product (ops/activation.py liger_swiglu); its
    # RMSNorm is `norm` (analytic/liger.py)
    liger: bool = False
    liger_swiglu: bool = False
    # the fused cross-entropy kernels: Megatron's --loss-fusion "native" or "te" (ops/loss.py megatron_fused_ce),
    # flash-attn's --loss xentropy "xentropy" (ops/loss.py xentropy_ce); "" the loss's own log_softmax + nll_loss
    # (shape.loss_kernel)
    loss_fusion: str = ""

    @property
    def tokens(self) -> float:
        return self.batch * self.seq / self.cp

    @property
    def norm_tokens(self) -> float:
        return self.tokens / (self.tp if self.sp else 1)



_FIELD = {name: i for i, name in enumerate(Op._fields)}


def replaced(op: Op, **changes) -> Op:
    """op._replace(**changes) without namedtuple's keyword round trip (its _make over a map of dict.pop calls, ~1.6×
    slower): the backward lists derive one op from each forward op, thousands per search (ops/derived.py backward)."""
    values = list(op)
    for name, value in changes.items():
        values[_FIELD[name]] = value
    return tuple.__new__(Op, values)


# --- builders ----------------------------------------------------------------------------------------------------

def gemm(name: str, m: float, n: float, k: float, sh: Shape, src: str, bias: bool = False, batch: float = 1,
          wgrad: bool = True, fp8: bool = False) -> Op:
    dtype = (RECIPES[sh.te].peak if sh.te else "fp8") if fp8 else sh.dtype  # TE: the recipe's peak key
    return Op(name, "gemm", dtype, m, n, k, batch, wgrad=wgrad, bias=bias, source=src)


def memory(name: str, reads: float, writes: float, src: str, group: str = "",
           fused: tuple[float, float] | None = None, saves: bool = True, kernels: int = 1, grad: bool = True,
           bwd: int = -1, access: str = "vector", bwd_access: str = "", bwd_ops: tuple = ()) -> Op:
    """A memory-bound kernel: `reads` + `writes` bytes; `fused`: its bytes inside a compiled fusion `group`;
    `saves`: its backward reads its input; `bwd` / `bwd_ops`: its backward's launches / kernels spelled out."""
    fr, fw = (reads, writes) if fused is None else fused
    return Op(name, "memory", "", reads=reads, writes=writes, kernels=kernels, saves_input=saves, group=group,
              fused_reads=fr, fused_writes=fw, grad=grad, source=src, bwd_kernels=bwd, access=access,
              bwd_access=bwd_access, bwd_ops=bwd_ops)


def bwd_kernel(name: str, reads: float, writes: float, access: str = "vector", kernels: int = 1) -> Op:
    """One backward kernel of an op's bwd_ops (its fused bytes: the op's, set by `backward`)."""
    return Op(name, "memory", "", reads=reads, writes=writes, access=access, kernels=kernels)


def no_kernel(name: str) -> Op:
    """A backward that launches nothing and moves nothing: an add passes its gradient on to both operands
    (tools/autograd/derivatives.yaml add: `self: grad`, `other: maybe_multiply(grad, alpha)`)."""
    return Op(name, "memory", "", kernels=0)


def grad_cast(name: str, x: float, src_bytes: int, dst_bytes: int) -> tuple[Op, ...]:
    """Autograd casts a gradient to its input's dtype when an op's output dtype differs from that input's (type
    promotion, e.g. a 16-bit tensor times an fp32 one): torch/csrc/autograd/engine.cpp validate_outputs
    `grad = grad.to(metadata.dtype)`, one copy of x elements; none when the dtypes agree."""
    if src_bytes == dst_bytes:
        return ()
    return (bwd_kernel(name, x * src_bytes, x * dst_bytes, "vector" if dst_bytes < src_bytes else "upcast"),)


def add_backward(name: str, x: float, sum_bytes: int, operand_bytes: int) -> tuple[Op, ...]:
    """An add's backward toward one operand: nothing (the gradient is passed on, _no_kernel) or, when the operand is
    narrower than the sum (type promotion), the cast of the gradient to it (grad_cast)."""
    return grad_cast(f"{name}.grad_cast", x, sum_bytes, operand_bytes) or (no_kernel(f"{name}.backward"),)


def column_sum_launches(rows: float) -> int:
    """Launches of a sum over `rows` rows of a row-major tensor (a weight's or bias's gradient summed over the
    tokens): its reduce_kernel, and a cudaMemsetAsync of the semaphores when the rows are split across thread blocks
    (torch aten/src/ATen/native/cuda/Reduce.cuh gpu_reduce_kernel: `if (config.should_global_reduce())
    ... cudaMemsetAsync(semaphores...)`; the profiler counts the memset beside the kernels). setReduceConfig, for a
    reduction over a non-contiguous dimension: 4-wide output vectors, 512 / 4 = 128 threads, 32 lanes along the
    outputs and block_height 4 along the rows, which split across the warps (rows >= 64); the rows go to several
    blocks (a global reduction) when each thread is still left >= max_values_per_thread = 256 of them.
    NB: assumes >= 128 outputs (a full 32-lane block of 4-wide vectors) and an output grid within the GPU's resident
    blocks (true for any width below ~10^5 on a GPU with >= 80 SMs)."""
    return 2 if -(-rows // 4) >= 256 else 1


# Access classes of casts: torch converts fp32 -> bf16 in a vectorised kernel (bfloat16_copy_kernel_cuda) but a
# 16 -> 32-bit upcast in the generic dynamic-cast loop (unrolled_elementwise_kernel<direct_copy_kernel_cuda>, no
# vector loads): aten/src/ATen/native/cuda/Copy.cu, CUDALoops.cuh; both names in the H200 profiles. A cast's
# backward is the cast the other way, of its output's gradient alone (saves=False: it never reads its input).
DOWNCAST = {"access": "vector", "bwd_access": "upcast"}
UPCAST = {"access": "upcast", "bwd_access": "vector"}
# A broadcast operand (a [T, 1] or [h] factor) has a zero stride, so TensorIterator runs the strided
# elementwise_kernel with per-element offsets instead of a vectorised one (CUDALoops.cuh gpu_kernel_impl)
BROADCAST = {"access": "strided"}
# a row reduction (mean, softmax): reduce_kernel / the softmax kernels, below streaming bandwidth
REDUCE = {"access": "reduce"}
