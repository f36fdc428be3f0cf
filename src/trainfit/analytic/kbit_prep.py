"""--kbit-prep: how the parameters a bitsandbytes-quantised base (--quant) leaves unquantised are prepared (no torch).

peft 0.21.2 prepare_model_for_kbit_training (utils/other.py:158-259) casts every fp16/bf16 parameter that is not a
Params4bit to fp32 (:204-209): the embedding, the LM head and the norm weights ("peft"); TRL's SFTTrainer with
bf16=True leaves a 4-bit model with the norm weights alone in fp32 ("norms": trl v0.21.0 trainer/utils.py:582-589
peft_module_casting_to_bf16 puts the embedding and head back in bf16 after peft's; v0.25.0 models/utils.py:488-497
upcasts the norms only; stacks/hf.toml [kbit_prep]). What that changes in the step:
- the parameters themselves: 4 bytes instead of the policy's weight dtype (nothing under amp-*, whose weights are
  fp32 already);
- the residual stream: an fp32 embedding returns fp32 hidden states ("peft"); an fp32 norm weight times the bf16
  normalised tensor (transformers 5.24 modeling_llama.py:67 `self.weight * hidden_states.to(input_dtype)`) is fp32,
  so the quantised Linears downstream return fp32 (bitsandbytes 0.50.2 nn/modules.py:626 `inp_dtype = x.dtype`,
  :637 `.to(inp_dtype)`): the first fp32 down_proj output makes the residual fp32 from the first layer on ("norms");
- the frozen quantised Linears fed by a norm (q/k/v, gate/up) return fp32 whenever the norm's output is fp32 (any
  preparation, and amp-*, whose norm weights are fp32): gate's and up's outputs, which SiLU and the product save, their gradients in backward, and down's
  input are fp32 (lora.layer_saved_delta, backward.layer_moments, quant.dequant_transient for int8);
- the LM head ("peft", no autocast): an fp32 weight times the fp32 final-norm output is an fp32 matmul, so the
  logits are fp32 and the loss's `logits.float()` (transformers loss/loss_utils.py:61) copies nothing (loss.py).
"""
from __future__ import annotations

from ..setup import Setup
from ..setup.rules import inert_preparation
from ..setup.vocab import QUANTS
from ..spec import ModelSpec


def preparation(setup: Setup) -> str:
    """The preparation in force: --kbit-prep, else the stack's recipe ([kbit_prep] of stacks/<stack>.toml) with a
    bitsandbytes base; "none" without one."""
    if setup.quant not in QUANTS or setup.mode == "serve":
        return "none"
    return setup.kbit_prep or setup.stack_facts.fact("kbit_prep")


def in_force(setup: Setup) -> str:
    """The preparation whose dtypes the step runs with: "none" where it changes no parameter's dtype
    (setup/rules.py inert_preparation: under fp32 weights, amp-* or fp32, it has nothing to upcast, so the stream is
    the policy's — fp32 under autocast, the gathered param_dtype under an FSDP mixed-precision policy:
    analytic/precision.py; on DeepSpeed the engine casts its upcasts back), else preparation's."""
    return "none" if inert_preparation(setup, setup.stack_facts) else preparation(setup)


def upcast_params(spec: ModelSpec, setup: Setup, quantised: int, total: int) -> int:
    """Parameters the preparation moves to fp32 (`quantised` of `total` are bitsandbytes-packed): every other one for
    peft, the norm weights for norms."""
    prep = in_force(setup)
    if prep == "peft":
        return total - quantised
    if prep == "norms":
        return norm_params(spec)
    return 0


def norm_params(spec: ModelSpec) -> int:
    """The RMSNorm weights of a Llama-style decoder: `norms_per_layer` per layer plus the final norm.
    NB: Qwen3's per-head q/k norms (head_dim each) left out: under by 2·head_dim per layer."""
    return spec.layers * spec.norms_per_layer * spec.hidden + (spec.hidden if spec.final_norm else 0)


def fp32_stream(setup: Setup) -> bool:
    """Whether the preparation makes the residual stream fp32 (module docstring).
    NB: "norms": the first layer's attention half is still bf16 (its residual add): over by half a layer."""
    return in_force(setup) != "none"


def fp32_frozen_outputs(setup: Setup, autocast: bool) -> bool:
    """Whether the quantised Linears fed by a norm return fp32 (the norm's output is fp32: an fp32 norm weight, from
    any preparation or amp-*'s fp32 weights; autocast leaves bitsandbytes' explicit `.to(inp_dtype)` alone)."""
    return setup.quant in QUANTS and (autocast or in_force(setup) != "none")


def head_bytes(setup: Setup, st) -> float:
    """Bytes per element of the LM head's input and logits (st: precision.StateBytes): the compute dtype; fp32 for
    peft's fp32 head outside autocast, whose matmul runs on the fp32 final-norm output.
    NB: the fp32 matmul's time is not modelled (the op list keeps the compute dtype): under."""
    return 4 if not st.autocast and in_force(setup) == "peft" else st.act


def fp32_attention(setup: Setup, autocast: bool) -> bool:
    """Whether the attention runs on fp32 q, k, v: q/k/v_proj return fp32 (fp32_frozen_outputs) and only HF's
    FlashAttention-2 integration casts them back to the model's dtype (transformers 5.24
    modeling_flash_attention_utils.py:595-597, target dtype from integrations/flash_attention.py:12); SDPA and eager
    take them as they are (integrations/sdpa_attention.py: no cast) — on CUDA the memory-efficient kernel, or for a
    GQA model the math path with its s×s probabilities (activations.resolved_kernel). Under autocast SDPA is on the
    lower-precision list (aten/src/ATen/autocast_mode.cpp): cast to the compute dtype."""
    return fp32_frozen_outputs(setup, autocast) and not autocast and setup.attention != "flash2"


def input_bytes(setup: Setup, st, group: str) -> float:
    """Bytes per element of a decoder layer's Linear input group (analytic/lora.py linears: norm1, norm2, attn,
    act): a norm's output in the residual stream's dtype; the MLP product (act) fp32 where gate and up return fp32
    (fp32_frozen_outputs); the attention's output (attn) in its inputs' dtype (fp32_attention), else the compute
    dtype."""
    if group.startswith("norm"):
        return st.residual
    if group == "act" and fp32_frozen_outputs(setup, st.autocast) or group == "attn" and fp32_attention(setup,
                                                                                                      st.autocast):
        return 4
    return st.act
