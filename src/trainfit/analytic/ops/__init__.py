"""The kernels one training step runs on one pipeline-stage rank, as an op list the roofline times.

One list, parameterised by the spec and the setup (not one per stack): a layer's forward, its backward derived
from it, and the embedding / head / loss around the layers. Each op is a GEMM (m, n, k, batch), an attention core
(batch·heads, s_q, s_kv, head_dim) or a memory-bound kernel (bytes read and written). The rank holds
T = b·s/cp tokens (context parallelism), 1/t of every projection's columns (Megatron column/row parallel, Shoeybi
et al. 2019 §3) and, with sequence parallelism, 1/t of the tokens in the norm / residual / dropout region
(Korthikanti et al. 2022 §4.2.2).

Sources, transformers 5.x in the venv (models/<family>/modeling_<family>.py):
  llama  modeling_llama.py: RMSNorm :61-66 (fp32 upcast, pow, mean, rsqrt, mul, cast back, weight mul), q/k/v
         :243, rotary :127-148 (q·cos + rotate_half(q)·sin; rotate_half = neg + cat :119-123), repeat_kv :168 (eager
         with GQA), o_proj :269, residual adds :306/:312, MLP :164 (down(act(gate(x))·up(x))), embed :370, final
         norm :402, lm_head :468; loss/loss_utils.py:61 `logits.float()` then cross_entropy (log_softmax + nll).
  gpt2   modeling_gpt2.py: fused c_attn :185, c_proj :223 + resid_dropout :224, MLP c_fc/act/c_proj/dropout
         :239-242, ln_1 :273 / ln_2 :304, wte/wpe :567/:574 (biased Conv1D: addmm, bias in the GEMM epilogue).
  neox   modeling_gpt_neox.py: fused query_key_value :195, dense_h_to_4h + GeLU :45; parallel residual (two norms of
         one input, two adds: the same op count as sequential). bert/opt/phi3/gemma/qwen: the same blocks with
         their families.json facts (fused projections, dropout, post-norm).
  MoE    integrations/moe.py grouped_mm experts (:355-412), router modeling_mixtral.py:105-107 (linear, fp32
         softmax, topk); experts are grouped GEMMs of T·top_k/E tokens each (balanced routing: NB the busiest
         expert sets a real kernel's time).
  torchtitan llama3 (models/llama3/model/model.py): nn.RMSNorm (fused torch.rms_norm on CUDA), rotary in fp32
         complex arithmetic :164-169 (cast up, complex mul, cast back), w2(silu(w1 x)·w3 x) :343; loss
         components/loss.py:20-27 (`pred.float()`, cross_entropy). Megatron-core: fused rotary and fused
         vocab-parallel cross-entropy — NB timed with the HF kernel counts (over-reads Megatron's memory ops).
Backward of a GEMM (m, n, k): dgrad (m, k, n) + wgrad (k, n, m) — 2× the forward FLOPs (Narayanan et al. 2021
§5.1); biased linears add the bias-gradient reduction (a read of dY). Backward of an elementwise kernel reads dY

Layout (one cost function per kind, as torch/utils/flop_counter.py keeps one per op): op.py (Op, Shape, builders),
shape.py (a setup's Shape), and per kind gemm.py, attention.py, norm.py, rotary.py, activation.py, residual.py,
cast.py, loss.py, with the blocks mla.py, moe.py, gated_deltanet.py (Qwen3-Next's linear-attention mixer) and
mamba2.py (Nemotron-H's Mamba-2 mixer and block norm); layer.py composes a layer from a family's LayerRecipe (its
mixer: attention or Gated DeltaNet), or a hybrid stack's one-mixer block by kind (Mamba-2, attention, MLP);
embedding.py and head.py the first and last stage; derived.py the backward, compiled and recomputed lists;
vision_tower.py a vision-language model's image encoder (Qwen2.5-VL's tower, Gemma 3's SigLIP tower and projector);
encoder_decoder.py T5's two stacks (its blocks, relative bias, head and loss; timed by analytic/encoder_decoder_time.py).
encdec_absolute.py BART's and Whisper's two stacks (front-ends, LayerNorm blocks, head; timed by encoder_decoder_time.py).
tests/analytic/test_ops_vs_trace.py checks every family's layer against the kernels the trace engine dispatches,
tests/analytic/test_tower_ops_vs_trace.py the towers'.
"""
from .activation import activation_out_bytes
from .attention import ATTENTION_BWD_KERNELS, SOFTMAX_BWD_KERNELS, eager_kernels, math_kernels
from .derived import WHOLE_LAYER, backward, checkpointed_layers, compiled, grad_accumulations, recomputed
from .embedding import EMBEDDING_DIRECT_MAX, embedding_backward, embedding_forward
from .gemm import fp8_backward_extra
from .head import head_backward_extra, head_forward
from .layer import LayerRecipe, layer_forward, recipe
from .norm import norm_ops
from .op import (QUANTISED_GEMMS, SIZE, Op, Shape, attention_dtype, bwd_kernel, column_sum_launches, gemm,
                 memory)
from .shape import shape_of

__all__ = ["ATTENTION_BWD_KERNELS", "EMBEDDING_DIRECT_MAX", "QUANTISED_GEMMS", "SIZE", "SOFTMAX_BWD_KERNELS",
           "LayerRecipe", "Op", "Shape", "activation_out_bytes", "attention_dtype", "backward", "bwd_kernel",
           "checkpointed_layers", "column_sum_launches", "compiled", "eager_kernels", "embedding_backward",
           "embedding_forward", "fp8_backward_extra", "gemm", "grad_accumulations", "head_backward_extra",
           "head_forward", "layer_forward", "math_kernels", "memory", "norm_ops", "recipe", "recomputed", "shape_of"]
