"""LoRA / DoRA adapters (--lora-rank, --lora-targets, --dora) as peft 0.21 builds them (trainfit/step/lora.py):
the trainable parameters and what freezing the base and adding the adapters changes in the saved set (no torch).

Parameters (Hu et al. 2021, "LoRA", §4.1: W0 + BA with B ∈ R^{d×r}, A ∈ R^{r×k}): each adapted Linear of `in`
inputs and `out` outputs gets lora_A (r × in) and lora_B (out × r), no biases (peft lora/layer.py update_layer:
`nn.Linear(self.in_features, r, bias=False)`, `nn.Linear(r, self.out_features, bias=lora_bias)`, lora_bias False);
DoRA (Liu et al. 2024, eq. 5) adds a magnitude vector of `out` (peft lora/dora.py:130 `nn.Parameter(weight_norm)`,
the norm over dim=1 of the (out, in) weight, dora.py:90). peft keeps bf16/fp16 adapters in fp32
(mapping_func.py:110 autocast_adapter_dtype=True, tuners_utils.py:2705-2760 cast_adapter_dtype); --lora-dtype weight
keeps them (their gradients and optimizer states) in the policy's weight dtype, as torchtune does. With --quant the
base's Linear weights are bitsandbytes-quantised (analytic/quant.py).

Saved for backward (autograd saves an input of mm only when the other operand needs its gradient:
tools/autograd/derivatives.yaml `mm: self: ... mat2` with SavedVariables guarded by should_compute_output):
- a frozen Linear saves its weight (or autocast's cast of it) for the input gradient, not its input;
- a frozen norm weight: HF RMSNorm's `weight * hidden.to(dtype)` no longer saves the normalised tensor;
- the LM head and final norm are frozen: no head input, no normalised tensor;
- per adapted Linear: lora.Linear casts its input to the adapter dtype (lora/layer.py:1100 `_cast_input_dtype`),
  lora_A saves that input (under autocast: its own bf16 cast per call), lora_B saves lora_A's r outputs;
  `* scaling` (a Python float) and the add save nothing.
"""
from __future__ import annotations

from ..errors import SetupError
from ..setup import Setup, lora_target_names
from ..spec import ModelSpec
from .liger import liger_on
from . import kbit_prep, quant
from .activations import FP32, resolved_kernel
from .families import family_traits
from .precision import state_bytes
from .multi_tensor import Repeated
from .parallel.zero import shard_ranks

# the Llama-style block's Linear modules (transformers models/llama/modeling_llama.py LlamaAttention, LlamaMLP)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ADAPTER = FP32  # peft's default adapter dtype (module docstring)


def adapter_bytes(setup: Setup) -> float:
    """Bytes per adapter element: fp32 (peft's default), or --lora-dtype weight: the policy's weight dtype
    (trainfit/step/lora.py _cast_trainable), or the weight dtype where the stack casts every parameter to it
    (stacks/<stack>.toml [peft] adapter_dtype = "model": DeepSpeed's engine)."""
    return ADAPTER if (setup.lora_dtype == "fp32" and not setup.stack_facts.casts_parameters) \
        else state_bytes(setup).weight


def linears(spec: ModelSpec) -> dict[str, tuple[int, int, str]]:
    """One layer's Linear modules: name -> (in, out, input group). Inputs of the same group are one tensor (q, k, v
    read the first norm's output; gate and up the second's)."""
    traits = family_traits(spec)
    if traits["fused_qkv"] or traits["fused_gate_up"] or not spec.gated_mlp or spec.moe is not None \
            or spec.task_head != "causal-lm":
        raise SetupError(f"--lora-rank: the analytic engine models LoRA on Llama-style causal LMs (q/k/v/o_proj, "
                         f"gate/up/down_proj); {spec.name} is not one: use --engine trace or measure")
    h, q, kv, i = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
    return {"q_proj": (h, q, "norm1"), "k_proj": (h, kv, "norm1"), "v_proj": (h, kv, "norm1"),
            "o_proj": (q, h, "attn"), "gate_proj": (h, i, "norm2"), "up_proj": (h, i, "norm2"),
            "down_proj": (i, h, "act")}


def targets(spec: ModelSpec, setup: Setup) -> dict[str, tuple[int, int, str]]:
    """The adapted Linear modules of one layer (all-linear: every one; the LM head is excluded by peft,
    tuners_utils.py:2464-2469)."""
    lin = linears(spec)
    if setup.lora_targets == "all-linear":
        return lin
    names = ATTENTION if setup.lora_targets == "attention" else lora_target_names(setup.lora_targets)
    unknown = [n for n in names if n not in lin]
    if unknown:
        raise SetupError(f"--lora-targets: {', '.join(unknown)} not a Linear module of {spec.name}; its Linear "
                         f"modules: {', '.join(lin)}")
    return {n: lin[n] for n in names}


def adapter_params_per_layer(spec: ModelSpec, setup: Setup) -> int:
    """r·(in + out) per adapted Linear, + out for DoRA's magnitude (module docstring)."""
    r = setup.lora_rank
    return sum(r * (i + o) + (o if setup.dora else 0) for i, o, _ in targets(spec, setup).values())


def adapter_params(spec: ModelSpec, setup: Setup) -> int:
    return spec.layers * adapter_params_per_layer(spec, setup)


def adapter_sizes(spec: ModelSpec, setup: Setup, layers: int) -> Repeated:
    """Elements of each trainable tensor of `layers` layers in the order the optimizer steps them: the model's
    module order, and per adapted Linear peft's lora_A (r x in), lora_B (out x r) and DoRA's magnitude (out)
    (peft tuners/lora/layer.py:134-145 registers lora_A, lora_B, lora_magnitude_vector in that order)."""
    r, adapted = setup.lora_rank, targets(spec, setup)
    per_layer = []
    for name, (i, o, _) in linears(spec).items():
        if name in adapted:
            per_layer += [r * i, o * r] + ([o] if setup.dora else [])
    return Repeated(tuple(per_layer), layers)  # the layers are alike: one layer's tensors, repeated


def largest_adapter(spec: ModelSpec, setup: Setup) -> int:
    r = setup.lora_rank
    return max(r * max(i, o) for i, o, _ in targets(spec, setup).values())


def layer_saved_delta(spec: ModelSpec, setup: Setup) -> float:
    """Bytes per token one layer saves with adapters minus what it saves in full fine-tuning (the layer's input
    needing its gradient, as in every layer past the first).
    NB: without checkpointing the frozen embedding's output needs no gradient, so the first layer's frozen q/k/v
    keep nothing at all (not even their weight casts under autocast): over-estimates by about that one layer's
    share (+0.6% on a 2-layer tiny Llama under amp-bf16, 1/L of it on deeper models).
    NB: without autocast, where o_proj's input is the attention kernel's saved output (_kept_by_attention) `full`
    drops it though SDPA still saves it: under-counts a·q_dim a token and layer (32,768 B a layer on
    tests/analytic/test_lora_sharded.py's tiny Llama under FSDP2 on CPU, read off its trace: -0.71 % of the -0.72 %
    its ZeRO-3 full-recompute case reads on AVX512-BF16); without checkpointing the first layer's over-count above
    offsets it."""
    st = state_bytes(setup)
    # the adapters' dtype in the forward: FSDP2's MixedPrecisionPolicy gathers them in param_dtype like every
    # parameter of the group (torch/distributed/fsdp/_fully_shard/_fsdp_param.py init_dtype_attrs), so
    # _cast_input_dtype finds the input already in it and copies nothing
    a, res, amp, r, ad = st.act, st.residual, st.autocast, setup.lora_rank, st.param or adapter_bytes(setup)
    lin, tgt = linears(spec), targets(spec, setup)
    # full fine-tuning: every Linear's input, for its weight gradient — under autocast each call's own cast of the
    # norm outputs (activations.py "linear_inputs"), the attention output and the MLP product once each
    full = sum(((kbit_prep.input_bytes(setup, st, g) if g == "attn" else a) * i if amp or g in ("attn", "act")
                else 0) for i, _, g in lin.values())
    if not amp:
        full += a * spec.hidden * 2  # the two norm outputs, one tensor each
    # frozen norm weights: the normalised tensor the weight multiplies is no longer saved (activations._norm_saved)
    # (not Liger's: its kernel saves X and rstd whether or not the weight trains, liger.py)
    norm_fp32 = family_traits(spec)["norm_fp32"]
    if not liger_on(setup):
        full += spec.norms_per_layer * (FP32 if norm_fp32 else res) * spec.hidden
    lora = 0.0
    groups_saved = set()
    for name, (i, o, g) in tgt.items():
        group_dtype = kbit_prep.input_bytes(setup, st, g)  # norm outputs in the residual dtype; the rest in act
        if amp:
            lora += a * i  # lora_A under autocast: its own cast of the input, per call
        elif group_dtype != ad:
            lora += ad * i  # _cast_input_dtype makes a new copy in the adapter dtype per call, saved by lora_A
        elif g not in groups_saved:
            # the input itself (shared by the group's adapters; o_proj's is SDPA's saved output under the fused
            # kernels, activations._flash_saved: nothing more)
            lora += 0 if _kept_by_attention(spec, setup, g) else ad * i
            groups_saved.add(g)
        lora += (a if amp else ad) * r  # lora_B's input: lora_A's r outputs
        if setup.dora:
            # dora.py:165 `(mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * scaling`: each mul
            # keeps its activation for the magnitude's gradient — the base Linear's output (compute dtype) and
            # lora_B's output (bf16 under autocast, else the fp32 adapter dtype)
            # (a bitsandbytes base returns its input's dtype: fp32 after an fp32 norm, analytic/kbit_prep.py)
            base_out = kbit_prep.input_bytes(setup, st, g) if setup.quant else a
            lora += (base_out + (a if amp else ad)) * o
    if setup.quant == "int8":  # bnb's int8 matmul saves its input (analytic/quant.py): once per input group
        # NB: the first layer's q/k/v inputs need no gradient without checkpointing and are not saved: over-reads
        lora += int8_inputs(spec, setup, groups_saved)
    if kbit_prep.fp32_frozen_outputs(setup, amp):
        # an fp32 norm output makes gate's and up's quantised Linears return fp32 (analytic/kbit_prep.py): SiLU
        # saves gate's output, the product SiLU's and up's, all three fp32 instead of the compute dtype.
        # NB: q/k/v's fp32 outputs are saved by nothing (rotary's muls keep cos/sin; FlashAttention-2's integration
        # casts them to the target dtype); under --attention sdpa they reach the fp32 kernel: under-counted there
        lora += 3 * (FP32 - a) * spec.intermediate
    return lora - full


def compile_refusal(spec: ModelSpec, setup: Setup) -> str | None:
    """Why --lora-rank with --compile is not modelled for this setup (None: compiled_terms models it): the compiled
    LoRA block is derived and measured for plain peft adapters on the modelled Llama block (compile_effects.
    not_modelled) under autocast, without recompute."""
    if not setup.compile:
        return None
    from .compile_effects import not_modelled

    why = not_modelled(spec, setup)
    checks = [(why is None, why),
              (not (setup.dora or setup.quant), "DoRA's and bitsandbytes' kernels are not derived compiled"),
              # measured on the real compiled CPU step (tiny-llama, rank 8, bf16) against these rules with peft's
              # fp32 copy of each input group saved instead of the bf16 tensor: the saved bytes +1.2 %, but the
              # compiled forward's transients beyond them left the forward end -1.8 % and the peak -2.6 %
              (state_bytes(setup).autocast, "without autocast the compiled step's forward transients beside peft's "
                                            "fp32 input copies are not modelled (-2.6 % on a measured CPU peak)"),
              (setup.recompute == "none", f"--recompute {setup.recompute} under LoRA is not measured compiled")]
    for ok, reason in checks:
        if not ok:
            return (f"--lora-rank with --compile: {reason}; the analytic engine models torch.compile's LoRA block "
                    "under --precision amp-* with --recompute none only (analytic/lora.py compiled_terms): use "
                    "--engine measure, or drop --compile")
    return None


def compiled_terms(spec: ModelSpec, setup: Setup, st, full: dict) -> dict[str, float]:
    """Bytes per token the compiled LoRA block saves (recompute none, autocast), from the compiled full
    fine-tuning block's terms `full` (compile_effects.block_terms) and the partitioner's rules it cites:
      * the block input, the mid residual and each norm's rstd: the frozen norms' input gradients read them, as
        full fine-tuning's do (NB: the first layer's input needs no gradient, its norm saves nothing: over-reads);
      * a norm's output (in the compute dtype) where an adapter reads it: lora_A's weight gradient is a matmul
        (materialized in backward: saved). peft's fp32 copy of it (lora/layer.py `_cast_input_dtype`) and
        autocast's bf16 cast back are one no-op after inductor's joint-graph pass, run before the partitioner
        (torch 2.13 _inductor/fx_passes/joint_graph.py:779-814 pointless_convert, "Remove chain of dtype
        conversions often created by AMP"; compile_fx.py:2273-2295 partition_fn), and the q/k/v
        (gate/up) adapters read one node (CSE): one tensor per group -- where no adapter reads it, no weight
        gradient does (the base is frozen), and it is recomputed or not needed;
      * the attention's saved set as full fine-tuning's, and where o_proj is adapted a copy of SDPA's output beside
        it: that input is already in the compute dtype, so peft's fp32 copy and autocast's cast back fold into a
        same-dtype convert, which inductor's no-op removal has already run before (joint_graph.py:673-675
        remove_noop_ops, then the patterns at :698-702): a copy node, read by lora_A's weight gradient, saved (the
        norm outputs are fp32 under autocast, their one cast is the base's own; the MLP product's copy replaces it,
        nothing else reads it). Measured per layer on CPU (tiny-llama, rank 8, all-linear): exact;
      * gate's and up's outputs (SiLU·mul's backward) always; their product only where down_proj's adapter reads it;
      * each adapter's lora_A output (r wide, the compute dtype): lora_B's weight gradient reads it.
    The weights' casts (the frozen ones and the adapters') are read by the input-gradient matmuls: saved, counted
    as full fine-tuning's batch-independent `fixed` (compile_effects.compiled_layer) plus adapter_casts."""
    a, h, i = st.act, spec.hidden, spec.intermediate
    tgt = targets(spec, setup)
    groups = {g for _, _, g in tgt.values()}
    out = dict(full)
    out["linear_inputs"] = a * h * len(groups & {"norm1", "norm2"})
    out["mlp"] = (2 + ("act" in groups)) * a * i
    out["lora"] = a * setup.lora_rank * len(tgt)
    ad = st.param or adapter_bytes(setup)  # FSDP2's policy gathers the adapters in param_dtype: no copy then
    if "o_proj" in tgt and ad != a:
        out["attention"] = full["attention"] + a * spec.q_dim  # SDPA's output copied for lora_A (above)
    return out


def adapter_casts(spec: ModelSpec, setup: Setup) -> float:
    """Batch-independent bytes of one layer's adapter weight casts under autocast (each read in backward)."""
    st = state_bytes(setup)
    return st.act * adapter_params_per_layer(spec, setup) if st.autocast else 0.0


def int8_inputs(spec: ModelSpec, setup: Setup, shared: set = frozenset(), checkpointed: bool = False) -> float:
    """Bytes per token of one layer's inputs that bnb's int8 matmuls keep (ctx.A, analytic/quant.py), one per
    input group, less the groups whose adapters save that same tensor (`shared`) and, unless the attention's own
    saved set is dropped by checkpointing, o_proj's input that the attention kernel keeps anyway."""
    st = state_bytes(setup)
    groups = {g: i for i, _, g in linears(spec).values()}
    return sum(kbit_prep.input_bytes(setup, st, g) * i for g, i in groups.items()
               if g not in shared and (checkpointed or not _kept_by_attention(spec, setup, g)))


def _kept_by_attention(spec: ModelSpec, setup: Setup, group: str) -> bool:
    """Whether this input group's tensor is one the attention kernel saves anyway: o_proj's input is the fused SDPA
    kernel's saved output where that kernel writes it in (b, s, h, d) layout, so that HF's `transpose(1, 2)
    .contiguous()` copies nothing: the CPU flash kernel (aten/src/ATen/native/transformers/attention.cpp
    _scaled_dot_product_flash_attention_cpu allocates {batch, q_len, heads, head_dim} and returns its transpose) and
    CUDA's memory-efficient kernel (fp32; activations._flash_saved); CUDA's flash kernel allocates its output like
    the (b, h, s, d) query (torch/_meta_registrations.py `torch.empty_like(query)`), which the transpose copies."""
    if group != "attn" or resolved_kernel(spec, setup) != "flash" or family_traits(spec)["fused_qkv"]:
        return False
    return setup.device == "cpu" or state_bytes(setup).act == FP32


def checkpoint_held(spec: ModelSpec, setup: Setup) -> float:
    """Bytes per token a checkpointed layer keeps beside its input: bnb's int8 matmul keeps its input as a plain
    ctx attribute (autograd/_functions.py:269 `ctx.A = A`), which torch.utils.checkpoint's saved-tensor hooks never
    see, so the first forward's graph holds it until the layer's backward (measured: tests/trace/
    test_qlora_vs_real.py, int8 + full recompute)."""
    if setup.quant != "int8":
        return 0.0
    return int8_inputs(spec, setup, checkpointed=True)


def layer_fixed_delta(spec: ModelSpec, setup: Setup) -> float:
    """Batch-independent bytes one layer's adapters save: under autocast the cached bf16 casts of the adapters
    (trainable leaves: aten/src/ATen/autocast_mode.cpp cached_cast), and DoRA's per-output fp32 vectors — the
    detached weight norm kept by `magnitude / weight_norm` and mag_norm_scale − 1 and mag_norm_scale kept by the
    two multiplies (dora.py:153,165). (The frozen weights' casts are not cached but their Linear keeps them for
    the input gradient: the same bytes as full fine-tuning's cached casts, activations.py `fixed`.)"""
    st = state_bytes(setup)
    casts = st.act * adapter_params_per_layer(spec, setup) if st.autocast else 0.0
    # NB: with --lora-dtype weight DoRA's vectors follow the 16-bit magnitude: over-reads by half of them
    dora = 3 * FP32 * sum(o for _, o, _ in targets(spec, setup).values()) if setup.dora else 0.0
    return casts + dora


def head_saved_delta(spec: ModelSpec, setup: Setup) -> float:
    """Per token: the frozen final norm and LM head save neither the normalised tensor nor the head's input
    (loss.head_and_loss counts both)."""
    st = state_bytes(setup)
    norm = (FP32 if family_traits(spec)["norm_fp32"] else st.residual) * spec.hidden if spec.final_norm else 0
    if setup.compile and setup.stack_facts.fact("compile", "scope") == "model":
        # compiled, the final norm already saves only its input and rstd (compile_effects.apply), which its input
        # gradient reads whether or not its weight trains: nothing more to drop there
        norm = 0
    return -(norm + kbit_prep.head_bytes(setup, st) * spec.hidden)


def lora_layer_params(spec: ModelSpec, setup: Setup) -> int:
    """One layer's trainable parameters: its adapters."""
    return adapter_params_per_layer(spec, setup)


def _adapter_optimizer_bytes(spec: ModelSpec, setup: Setup) -> float:
    """The optimizer state of the fp32 adapters: per element as precision.state_bytes gives it for fp32 parameters;
    Adafactor (Shazeer & Stern 2018, Alg. 4) keeps row + column statistics per matrix, a full vector for DoRA's
    magnitude (as analytic/optimizer.adafactor_state does for the full model)."""
    st32 = state_bytes(setup if setup.lora_dtype == "weight" else _fp32_adapters(setup))
    if not st32.factored:
        return adapter_params(spec, setup) * st32.optimizer
    r = setup.lora_rank
    per_layer = sum((r + i) + (o + r) + (o if setup.dora else 0) for i, o, _ in targets(spec, setup).values())
    state = FP32 if st32.master else adapter_bytes(setup)  # the statistics' dtype: the parameters' it updates
    return state * spec.layers * per_layer


def lora_states(spec: ModelSpec, setup: Setup, st, n: float):
    """(ModelStates, gradient bytes per trainable element, trainable parameters, largest trainable tensor) of a
    LoRA step: the base weights (`n`) frozen in the policy's weight dtype; the fp32 adapters, their fp32 gradients,
    fp32 masters (bf16-master: trainfit.step.MasterWeightOptimizer copies every trainable parameter) and optimizer
    states; DDP's bucket buffers hold the adapters' gradients only (torch DDP buckets parameters with
    requires_grad, torch/nn/parallel/distributed.py _build_params_for_reducer).
    Under --zero (torch's ZeRO-1 and FSDP2, parallel/zero.py model_states) the frozen base is laid out as a full
    fine-tuning's weights are -- FSDP2 shards every parameter of a group, requires_grad or not (torch/distributed/
    fsdp/_fully_shard/_fsdp_param_group.py builds an FSDPParam per managed parameter) -- and the adapters as
    trainable parameters: gradients, masters and optimizer states of the adapters only (the optimizer takes the
    requires_grad parameters, trainfit.step.standard._params; ZeroRedundancyOptimizer gets those alone,
    step/strategy.py). DeepSpeed's ZeRO: parallel/deepspeed.py lora_states."""
    from dataclasses import replace

    from .parallel.zero import ModelStates, model_states

    why = compile_refusal(spec, setup)
    if why:
        raise SetupError(why)
    if setup.tp > 1 or setup.pp > 1 or setup.cp > 1:
        raise SetupError("--lora-rank: the analytic engine models LoRA over data parallelism (--dp, --zero); drop "
                         "--tp, --pp and --cp")
    n_a, ad = adapter_params(spec, setup), adapter_bytes(setup)
    frozen = model_states(n, 0.0, st, setup)  # the base's weights as full fine-tuning lays them out
    st_a = replace(st, weight=ad, grad=ad, master=FP32 if st.master else 0.0)
    trained = model_states(n_a, _adapter_optimizer_bytes(spec, setup), st_a, setup)
    weights = frozen.weights + trained.weights
    # DDP / ZeRO-1's buckets hold the adapters' gradients; FSDP2 at --zero 2 keeps every parameter's shard beside
    # the unsharded ones (model_states), the base's included
    comm = trained.comm + (frozen.comm if setup.zero == 2 else 0.0)
    if setup.quant:  # the decoder layers' Linear weights packed, with their quant state (analytic/quant.py)
        # NB: the quant state is booked as weights here; the trace and measure engines count it as buffers
        quant.check(setup)
        sharded = frozen.weights < n * st.weight  # FSDP2's weights at rest are shards (model_states)
        weights += quant_delta(spec, setup, sharded)
        if frozen.comm and setup.zero == 2 and not sharded:  # the shards kept beside the unsharded codes
            comm += (quant.codes_bytes(spec, setup) - quant.base_bytes(spec, setup)[1]) / shard_ranks(setup)
        # --kbit-prep: the unquantised parameters it upcasts, fp32 instead of the weight dtype (analytic/kbit_prep.py),
        # sharded at rest under FSDP2 like the rest of the frozen base
        quantised = quant.base_bytes(spec, setup)[2]
        weights += kbit_prep.upcast_params(spec, setup, quantised, int(n)) * (FP32 - st.weight) \
            / (shard_ranks(setup) if sharded else 1)
    states = ModelStates(weights, trained.gradients, trained.master, trained.optimizer, comm)
    return states, ad, n_a, largest_adapter(spec, setup)


def quant_delta(spec: ModelSpec, setup: Setup, sharded: bool) -> float:
    """Bytes a bitsandbytes-quantised base adds to (or takes from) the 16-bit weights on one rank. Sharded (FSDP2,
    --zero 2/3): the packed codes are sharded like any floating parameter -- the QLoRA-under-FSDP recipe stores
    them in a float dtype (transformers BitsAndBytesConfig.bnb_4bit_quant_storage = bf16, whose packed
    Params4bit is then a float tensor: bitsandbytes nn/modules.py Params4bit quant_storage; accelerate 1.15
    fsdp_utils.py:790-806 shards Params4bit only when floating) -- while the quant state (absmax, code, offset)
    is a plain attribute of the parameter (functional.QuantState), whole on every rank.
    NB: with the default uint8 storage accelerate leaves the packed weights out of FSDP (ignored_params), whole on
    every rank: under-counts such a run by (1 - 1/dp) of the codes."""
    packed, replaced, _ = quant.base_bytes(spec, setup)
    if not sharded:
        return packed - replaced
    codes = quant.codes_bytes(spec, setup)
    return (codes - replaced) / shard_ranks(setup) + (packed - codes)


def gathered_counts(spec: ModelSpec, setup: Setup, pc, st):
    """`pc` with one layer's count made what ZeRO-3 / FSDP2 gather of a LoRA layer, in elements of the gathered
    dtype (param_dtype under an FSDP2 MixedPrecisionPolicy, else the weight dtype), so that parallel/zero.py's
    gathered_params and unsharded_at read it as they read a full fine-tuning layer: the frozen base (its Linear
    weights as packed codes under --quant, in their float storage: quant_delta) and the adapters -- cast to
    param_dtype like every parameter of the group, else gathered in their own dtype."""
    from dataclasses import replace

    g = st.param or st.weight
    layer = pc.per_layer_dense * g + adapter_params_per_layer(spec, setup) * (st.param or adapter_bytes(setup))
    if setup.quant:
        _, replaced, _ = quant.base_bytes(spec, setup)
        layer += (quant.codes_bytes(spec, setup) - replaced * g / st.weight) / spec.layers
    return replace(pc, attention=layer / g - pc.mlp - pc.norms)


def embedding_grad(spec: ModelSpec, setup: Setup, st, tokens: int) -> float:
    """The embedding output's gradient at the end of backward: full fine-tuning always; with LoRA only under
    checkpointing, where transformers' enable_input_require_grads makes the frozen embedding's output require grad
    (modeling_utils.py:3181-3189); otherwise the backward stops at the first adapter."""
    if setup.lora_rank and setup.recompute == "none":
        return 0.0
    return st.residual * spec.hidden * tokens


def adapter_setup(setup: Setup, st) -> Setup:
    """The setup whose optimizer temporaries are the adapters': their state dtype is fp32 under every policy
    (module docstring); bf16-master keeps its master copies. Unchanged without LoRA."""
    if not setup.lora_rank or st.master or setup.precision in ("fp32", "amp-bf16", "amp-fp16") \
            or setup.lora_dtype == "weight":
        return setup
    return _fp32_adapters(setup)


def _fp32_adapters(setup: Setup) -> Setup:
    """The setup whose state bytes are the fp32 adapters' (their optimizer's dtypes only: this copy holds and times
    no attention, so --attention flash2, refused under fp32, goes back to auto in it, and --kbit-prep, which changes
    nothing under fp32 weights and is refused there, to the stack's default: kbit_prep.in_force)."""
    return setup.with_(precision="fp32", attention="auto" if setup.attention == "flash2" else setup.attention,
                       kbit_prep=None)


def flops_per_token(spec: ModelSpec, setup: Setup, fpt: float, attention: float) -> tuple[float, float]:
    """(forward, backward) FLOPs per token with adapters. Forward: the model's `fpt` plus 2 FLOPs per MAC of each
    adapter's two matmuls, r·(in + out) MACs (Hu et al. 2021 §4.1). Backward: the attention core twice its forward
    (both operands need gradients); every frozen Linear (LM head included) only its input gradient, once its
    forward (no weight-gradient GEMM: derivatives.yaml mm, mat2 not needing grad); the adapters twice theirs.
    NB: the first layer's frozen q/k/v compute no input gradient without checkpointing, and DoRA's
    batch-independent weight-norm pass is not counted: both small over/under-counts."""
    r = setup.lora_rank
    adapters = 2 * spec.layers * sum(r * (i + o) for i, o, _ in targets(spec, setup).values())
    forward = fpt + adapters
    backward = 2 * attention + (fpt - attention) + 2 * adapters
    return forward, backward
