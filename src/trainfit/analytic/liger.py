"""--liger: Liger's kernels for the model's family (RMSNorm, SwiGLU, RoPE, and the fused linear cross-entropy), as
TRL's use_liger_kernel and ArcticTraining's `model.type: liger` apply them. Which families, and the facts the memory
and time models read off Liger's source (liger-kernel 0.8.5, the PyPI wheel; src/liger_kernel/...):

  * transformers/monkey_patch.py:259-323 apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True,
    fused_linear_cross_entropy=True): `apply_rotary_pos_emb = liger_rotary_pos_emb` (:290-291), `LlamaRMSNorm =
    LigerRMSNorm` (:292-293; the final norm and both layer norms of a built model, :315-323), `LlamaMLP =
    LigerSwiGLUMLP` (:294-295). mistral (:723), qwen2 (:1750) and qwen3 (:1817, its q_norm and k_norm too) patch
    the same three kernels. MODEL_TYPE_TO_APPLY_LIGER_FN (:3904-3958) lists the model types Liger patches at all.
  * ops/rms_norm.py: LigerRMSNormFunction.forward (:653, casting_mode "llama", in_place=True by default) saves X and
    RSTD (:674-676; W is the parameter), RSTD one fp32 per row in the llama and gemma casting modes (:465); the
    kernel upcasts inside (:107-108) and writes Y in X's dtype (:462). Backward: one kernel writing dX into dY in
    place (:555-556) and per-SM fp32 partial weight gradients (:544), then their sum (:622).
  * ops/swiglu.py: LigerSiLUMulFunction (:240-272) saves the gate and up projections' outputs a and b only (:272);
    the forward kernel writes c = silu(a)·b (:165); the backward kernel recomputes silu(a) and stores da and db over
    a and b (:104-105).
  * ops/rope.py: LigerRopeFunction saves cos and sin only (:289); the kernel rotates q and k in place (:97-111),
    `q.contiguous()` a no-op on the (b, s, h, d) projection output (:151-170); backward the same kernel on dq, dk.
  * transformers/swiglu.py:34-35 LigerSwiGLUMLP: down_proj(LigerSiLUMulFunction(gate_proj(x), up_proj(x))).
ArcticTraining (snowflakedb/ArcticTraining b28638e arctic_training/model/liger_factory.py:25-62) builds the model
with liger_kernel's AutoLigerKernelForCausalLM (transformers/auto_model.py:33-47: _apply_liger_kernel for the model
type, every kernel on by default) but passes swiglu=False under tiled_mlp_compute (:42): the tiled MLP replaces
the MLP's forward instead. The same holds here: under --tiled-mlp the MLP is DeepSpeed's TiledMLP over HF's.
"""
from __future__ import annotations

from ..errors import SetupError

SRC = "liger-kernel 0.8.5"
# transformers/monkey_patch.py:3904-3958 MODEL_TYPE_TO_APPLY_LIGER_FN: the model types Liger patches
PATCHED = ("deepseek_v2", "deepseek_v3", "deepseek_v4", "gemma", "gemma2", "gemma3_text", "gemma3", "gemma4_text",
           "gemma4", "glm4", "glm4v", "glm4v_moe", "gpt_oss", "internvl", "llama", "llama4_text", "llama4", "llava",
           "granite", "mllama", "mllama_text_model", "ministral", "mistral", "mixtral", "muse_glimmer", "nemotron",
           "olmo2", "pixtral", "olmo3", "qwen2", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl",
           "qwen2_5_vl_text", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_vl",
           "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "smollm3", "phi3", "paligemma", "falcon_h1",
           "smolvlm", "hunyuan_v1_dense", "hunyuan_v1_moe", "exaone4")
# the families whose patch is Llama's three kernels (LigerRMSNorm in llama casting mode, LigerSwiGLUMLP, Liger RoPE)
MODELLED = ("llama", "mistral", "qwen2", "qwen3")


def liger_on(setup) -> bool:
    return bool(getattr(setup, "liger", False)) and getattr(setup, "mode", "train") == "train"


def swiglu_on(setup) -> bool:
    """Liger's SwiGLU runs the MLP: --liger without --tiled-mlp (liger_factory.py:42)."""
    return liger_on(setup) and getattr(setup, "tiled_mlp", None) is None


def check_family(spec) -> None:
    """--liger on a family Liger does not patch, or patches with kernels not modelled here: one line, refused."""
    if spec.family in MODELLED and spec.moe is None and spec.vision is None:
        return
    if spec.family not in PATCHED:
        raise SetupError(f"--liger: Liger has no kernels for {spec.name} ({spec.family}; {SRC} "
                         "transformers/monkey_patch.py:3904 MODEL_TYPE_TO_APPLY_LIGER_FN): drop --liger (--loss "
                         "fused-linear alone is Liger's fused loss)")
    raise SetupError(f"--liger is modelled for dense {', '.join(MODELLED)} models (Liger's RMSNorm, SwiGLU and RoPE); "
                     f"{spec.name} ({spec.family}) takes other Liger kernels: drop --liger (--loss fused-linear "
                     "models the fused loss alone)")


def norm_saved(hidden: int, in_bytes: int) -> int:
    """Per token and norm: X in its dtype and RSTD, one fp32 (ops/rms_norm.py:465, :674-676)."""
    return in_bytes * hidden + 4
