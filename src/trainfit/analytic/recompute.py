"""Activation recomputation: what one layer keeps until its backward, and what its backward holds at once.

none       every saved tensor of the layer (activations.py) stays until the layer's backward;
selective  Korthikanti et al. 2022 §4.2: recompute only the attention core, so no s×s tensor is stored — the
           flash kernel's saved set (q, k, v, out, logsumexp), which is what HF runs with flash SDPA;
full       torch.utils.checkpoint (torch/utils/checkpoint.py `checkpoint`) keeps each layer's input (the residual
           stream) and re-runs the layer's forward inside its backward (Chen et al. 2016, "Training Deep Nets with
           Sublinear Memory Cost", §3);
op         torchtitan's per-op selective checkpointing (torchtitan/distributed/activation_checkpoint.py:52-137
           _apply_op_sac; torch/utils/checkpoint.py create_selective_checkpoint_contexts): inside each checkpointed
           block the outputs of the stack's save-list ops (stacks/*.toml [op_sac]) are stored whether or not backward
           needs them — every aten.mm but each second one, and the SDPA kernels' outputs — everything else is
           recomputed, and the block's input is held by the checkpoint; in the block's backward its forward runs again
           (the stored outputs replayed), so all its saved tensors are live again, as under full;
layer:N    torchtitan's _apply_layer_sac (activation_checkpoint.py:27-49): every N-th block is checkpointed whole
           (as full), the others save everything (as none) — memory.py combines the two kinds.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..setup import Setup
from ..spec import ModelSpec
from . import lora, nvfp4, siglip, torchtitan_moe
from .activations import FP32, LayerActivations, checkpointed_arg_casts, layer_activations, norm_kernel, resolved_kernel
from .families import family_traits
from .gated_deltanet import linear_layers
from .backward import Moment, layer_moments
from .params import ParamCounts
from .parallel.expert_memory import moe_mlp_on_rank, sac_saved_all_to_all
from .parallel.fsdp1 import caches_weight_casts
from .parallel.tensor import layer_bytes_per_rank, term_divisors
from .precision import StateBytes


CPU_RNG_STATE = 5056  # bytes of torch.get_rng_state() (the mt19937 CPU generator)


@dataclass(frozen=True)
class LayerMemory:
    activations: LayerActivations  # of a dense layer, for the breakdown
    saved: float  # kept per layer and micro-batch until that layer's backward
    moments: list  # backward.Moment: the layer's backward high points (beside its saved tensors)
    autocast_casts: float  # weight casts autocast keeps per layer beyond `saved` (full recompute under amp)


def forward_rerun_share(setup: Setup, layers: int) -> float:
    """The share of a stage's `layers` whose forward runs again in the backward: every block under full and op,
    every N-th under layer:N, none otherwise (its communication repeats with it: parallel/tensor.py, context.py)."""
    if setup.recompute.startswith("layer:"):
        return (layers // setup.layers_every) / layers
    return {"full": 1.0, "op": 1.0}.get(setup.recompute, 0.0)


def layer_setup(setup: Setup) -> Setup:
    """Selective recompute saves what the flash kernel saves (no s×s probabilities)."""
    return setup if setup.recompute != "selective" else setup.with_(attention="flash", recompute="none")


def layer_memory(spec: ModelSpec, setup: Setup, pc: ParamCounts, st: StateBytes, tokens: int, keys: float,
                 policy: str | None = None, moe_layer: bool | None = None) -> LayerMemory:
    """One layer under `policy` (none, full, selective, op; default: the setup's — `layer:N` is combined from a
    full and a none layer by the caller). `moe_layer`: a dense (False) or MoE (True) layer of a model with both
    (memory.py's interleave pattern); None: the average of the model's layers."""
    policy = policy or setup.recompute
    if policy != setup.recompute:
        setup = setup.with_(recompute=policy)
    t = setup.tp
    ls = layer_setup(setup)
    la = layer_activations(spec, ls)
    moe = spec.moe is not None and pc.moe_layers > 0
    la_moe = layer_activations(spec, ls, moe=True) if moe else la
    frac_moe = spec.moe_share if moe_layer is None else float(moe_layer and moe)
    kinds = layer_kinds(spec, ls, frac_moe)
    one_layer = sum(w * layer_bytes_per_rank(k, setup, tokens, keys) for w, k in kinds)
    adapter_casts = 0.0
    if setup.lora_rank:  # frozen base, adapters (lora.py); autocast caches casts of trainable leaves only
        one_layer += lora.layer_saved_delta(spec, setup) * tokens
        adapter_casts = st.act * lora.adapter_params_per_layer(spec, setup) if st.autocast else 0.0
        one_layer += lora.layer_fixed_delta(spec, setup)
    one_layer += nvfp4.layer_saved_delta(spec, setup, st, tokens)  # NVFP4Linear's codes for the bf16 inputs
    casts = 0.0
    recomputed = 0.0
    moe_kind = moe and frac_moe >= 0.5
    # the layer re-run at the backward's high points: a Gated DeltaNet layer where the model has them (its chunked
    # rule's fp32 tensors make its saved set the largest: gated_deltanet.saved_terms), else rerun_layer's
    rerun = rerun_layer(spec, setup, one_layer, la_moe, tokens, keys, frac_moe)
    if linear_layers(spec):
        rerun = layer_bytes_per_rank(layer_activations(spec, ls, moe=moe_kind, linear=True), setup, tokens, keys)
    if setup.recompute == "full":
        # checkpoint keeps each layer's input (the residual stream; split t ways only under sequence parallelism)
        saved = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        saved += lora.checkpoint_held(spec, setup) * tokens  # --quant int8: inputs checkpoint cannot drop (lora.py)
        if setup.device == "cpu":
            # and the CPU generator's state, to replay dropout (torch/utils/checkpoint.py:1632
            # `torch.get_rng_state()`, a 5056-byte tensor); a CUDA step keeps the CPU state in host memory
            saved += CPU_RNG_STATE
        # in backward the layer's forward runs again (with a fresh copy of the RNG state on CPU): all its saved
        # tensors are live once more — less the checkpointed input itself where the layer saves its input
        # (the same storage)
        layer_input = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        recomputed = rerun - (layer_input if _saves_its_input(spec, setup, st) else 0) + \
            (CPU_RNG_STATE if setup.device == "cpu" else 0)
        held_args = checkpointed_arg_casts(spec, setup, st.act)  # kept with the input, not made again by the re-run
        saved += held_args
        recomputed -= held_args
        if st.autocast and caches_weight_casts(setup):
            # autocast's cache keeps every weight's cast until the autocast region exits, checkpointed or not —
            # of trainable leaves only (aten/src/ATen/autocast_mode.cpp cached_cast: arg.requires_grad() &&
            # arg.is_leaf()): with LoRA only the adapters' casts stay, the frozen weights' are freed in the forward;
            # FSDP1's forward runs on views, none of them leaves (parallel/fsdp1.py)
            casts = adapter_casts if setup.lora_rank else sum(w * k.weight_casts for w, k in kinds) / t
    elif setup.recompute == "op":
        # each kind of layer stores its own matmuls' outputs (a dense layer's MLP in a model with MoE layers)
        saved = (sum(w * op_sac_stored(spec, setup, st, tokens, moe=kind)
                     for kind, w in ((True, frac_moe), (False, 1 - frac_moe)) if w) if moe
                 else op_sac_stored(spec, setup, st, tokens))
        # the block's backward re-runs its forward first: its whole saved set is live again (the stored outputs
        # replayed into it, those no backward needs — e.g. the first projection's output — freed by then), so
        # beside the stored bytes the layer holds one_layer − stored at its high points — and the held input too
        # where no op of the layer saves it (CPU: and the RNG state)
        layer_input = st.residual * spec.hidden * tokens / (t if setup.sequence_parallel else 1)
        recomputed = one_layer - saved + (0 if _saves_its_input(spec, setup, st) else layer_input) + \
            (CPU_RNG_STATE if setup.device == "cpu" else 0)
        # torchtitan's deepseek_v3 also stores its MoE layers' all-to-all outputs (parallel/expert_memory.py)
        saved += frac_moe * sac_saved_all_to_all(spec, setup, tokens, st.act)
        if setup.device == "cpu":
            saved += CPU_RNG_STATE  # torch/utils/checkpoint.py:1632, as under full
        if st.autocast and caches_weight_casts(setup):
            # autocast's cache keeps every weight's cast until the autocast region exits, checkpointed or not
            casts = sum(w * k.weight_casts for w, k in kinds) / t
    else:
        saved = one_layer
    # with some dense and some MoE layers, the backward high points are those of the layer's kind (moe_layer: where
    # memory.interleaved_kinds places the kinds), else (NB) of the kind the rank has most of
    big = la_moe if moe and frac_moe >= 0.5 else la
    div = term_divisors(big, setup)
    mlp_saved = sum(v / div[k] for k, v in big.mlp_share.items() if k in div)
    # the moments' layer has the parameters of its kind
    moments = layer_moments(spec, ls, st, tokens, keys, moe_kind, mlp_saved, layer_params(spec, pc, setup, moe_kind),
                            recomputed)
    if setup.recompute == "op":
        # the end of the re-run forward (torchtitan's early_stop is off: job_config.py:675): the block's output
        # (residual dtype) and the replayed last projection's output it adds, beside the incoming gradient and the
        # whole saved set
        sp = t if setup.sequence_parallel else 1
        moments.append(Moment(recomputed + (2 * st.residual + st.act) * spec.hidden * tokens / sp, 0.0))
    return LayerMemory(la, saved, moments, casts)


def layer_kinds(spec: ModelSpec, setup: Setup, frac_moe: float) -> list[tuple[float, LayerActivations]]:
    """(share of the layers, saved set) of each kind of layer: dense or MoE MLP, attention or a Gated DeltaNet
    layer (gated_deltanet.py). NB: which layers are MoE and which linear is taken as independent (the shares
    multiply): exact for Qwen3-Next's published configs, where every layer is MoE."""
    frac_lin = linear_layers(spec) / spec.layers
    out = []
    for lin, w_lin in ((False, 1 - frac_lin), (True, frac_lin)):
        for moe, w_moe in ((False, 1 - frac_moe), (True, frac_moe)):
            if w_lin * w_moe > 0:
                out.append((w_lin * w_moe, layer_activations(spec, setup, moe=moe, linear=lin)))
    return out


def rerun_layer(spec: ModelSpec, setup: Setup, one_layer: float, la_moe: LayerActivations, tokens: int,
                keys: float, frac_moe: float) -> float:
    """The saved set a re-run layer makes again in its backward: the average layer's (`one_layer`), or, where every
    expert runs every token (Llama 4, moe_every_expert.py) and the moments are an MoE layer's (frac_moe >= 0.5), the
    MoE layer's own: its E copies dwarf a dense layer's (small-llama4_text full recompute: -14 % with the average);
    and torchtitan's MoE block, whose moments (torchtitan_moe.moments) are read off its own re-run.
    NB: other MoE families keep the average (DeepSeek's KNOWN_GAPS entry is priced with it)."""
    own = spec.moe is not None and (spec.moe.experts_every_token or torchtitan_moe.block_on(setup))
    if not own or frac_moe < 0.5:
        return one_layer
    extra = lora.layer_saved_delta(spec, setup) * tokens + lora.layer_fixed_delta(spec, setup) if setup.lora_rank else 0
    return layer_bytes_per_rank(la_moe, setup, tokens, keys) + extra


def block_matmuls(spec: ModelSpec, moe: bool | None = None) -> list[tuple[str, int, int, bool]]:
    """The aten.mm calls of one block's forward, in order: (name, output features, input features, column-parallel).
    nn.Linear without a bias on a 3-D input runs aten.mm (aten/src/ATen/native/Linear.cpp: matmul folds the batch
    into the rows); with a bias, addmm — not an mm (Linear.cpp's fused 3-D path). Eager attention's matmuls are bmm;
    MoE experts run grouped_mm (moe.py); the router and a shared expert are linears. Column-parallel outputs (q, k,
    v, the MLP's first matrices) are split t ways under TP; row-parallel ones (o, down) are full partial sums.
    `moe`: a block of that kind in a model with both (False: a dense layer's MLP; None: the model's MoE block where
    it has one)."""
    traits = family_traits(spec)
    h, i = spec.hidden, spec.intermediate
    mms: list[tuple[str, int, int, bool]] = []

    def linear(name: str, out: int, inp: int, bias: bool, column: bool = True) -> None:
        if not bias:
            mms.append((name, out, inp, column))

    if spec.mla is not None:
        # MLA in forward order (torchtitan 0.2.2 models/deepseek_v3/model/model.py:273-323: wq or wq_a -> q_norm ->
        # wq_b, wkv_a, kv_norm -> wkv_b, wo; transformers' DeepseekV3Attention the same). wq_a and wkv_a are
        # replicated under TP (infra/parallelize.py:271, 292 NoParallel): full outputs, like a row-parallel sum
        m, n = spec.mla, spec.heads
        if m.q_lora_rank:
            linear("q_a", m.q_lora_rank, h, False, column=False)
            linear("q_b", n * m.qk_head_dim, m.q_lora_rank, False)
        else:
            linear("q", n * m.qk_head_dim, h, False)
        linear("kv_a", m.kv_lora_rank + m.qk_rope_head_dim, h, False, column=False)
        linear("kv_b", n * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, False)
        linear("o", h, n * m.v_head_dim, False, column=False)
    elif traits["fused_qkv"]:
        linear("qkv", spec.q_dim + 2 * spec.kv_dim, h, spec.qkv_bias)
    else:
        for name, out in (("q", spec.q_dim), ("k", spec.kv_dim), ("v", spec.kv_dim)):
            linear(name, out, h, spec.qkv_bias)
    if spec.mla is None:
        linear("o", h, spec.q_dim, spec.out_bias, column=False)
    if spec.moe is not None and moe is not False:
        m = spec.moe
        linear("router", m.num_experts, h, False, column=False)
        if m.shared_intermediate:
            linear("shared_gate", m.shared_intermediate, h, False)
            linear("shared_up", m.shared_intermediate, h, False)
            linear("shared_down", h, m.shared_intermediate, False, column=False)
            if m.shared_gate:
                linear("shared_expert_gate", 1, h, False, column=False)
    elif spec.gated_mlp:
        if traits["fused_gate_up"]:
            linear("gate_up", 2 * i, h, spec.mlp_bias)
        else:
            linear("gate", i, h, spec.mlp_bias)
            linear("up", i, h, spec.mlp_bias)
        linear("down", h, i, spec.mlp_bias, column=False)
    else:
        linear("fc1", i, h, spec.mlp_bias)
        linear("fc2", h, i, spec.mlp_bias, column=False)
    return mms


def op_sac_saved_matmuls(spec: ModelSpec, setup: Setup, moe: bool | None = None) -> list[tuple[str, int, int, bool]]:
    """The matmuls whose outputs per-op SAC stores: every aten.mm of the block but each second one
    (torchtitan/distributed/activation_checkpoint.py:110-116: `mm_count % 2 == 0` -> recompute, counting from 1,
    afresh for each block's forward: the policy's `meta` is made per checkpoint call, :126-128), less those the
    stack forces to recompute before counting ([op_sac] force_recompute: torchtitan's MoE router gate)."""
    stack = setup.stack_facts
    if "mm" not in stack.fact("op_sac", "save"):
        return []
    forced = stack.facts["op_sac"].get("force_recompute", ())
    mms = [mm for mm in block_matmuls(spec, moe) if mm[0] not in forced]
    if not stack.fact("op_sac", "every_second_mm_recomputed"):
        return mms
    return [mm for n, mm in enumerate(mms, start=1) if n % 2 == 1]


def op_sac_stores_sdpa(spec: ModelSpec, setup: Setup) -> bool:
    """Whether per-op SAC stores the attention kernel's outputs: the save list names the CUDA SDPA kernels (flash,
    efficient, cuDNN, math: torchtitan/models/llama3/infra/parallelize.py:36-51); eager attention runs bmm/softmax
    and the CPU flash kernel (aten._scaled_dot_product_flash_attention_for_cpu) is not on the list. torchtitan's
    gpt_oss lists flex attention's HOP and its compiled region (models/gpt_oss/infra/parallelize.py:41-58), whose
    outputs are the same two (stacks/torchtitan.toml [moe_models] flex_sinks; the CPU step's substitute stands for
    it: step/torchtitan_moe.py)."""
    if torchtitan_moe.model_fact(spec, setup, "flex_sinks"):
        return True
    return ("sdpa" in setup.stack_facts.fact("op_sac", "save") and setup.device == "cuda"
            and resolved_kernel(spec, setup) == "flash")


def op_sac_stored(spec: ModelSpec, setup: Setup, st: StateBytes, tokens: int, moe: bool | None = None) -> float:
    """Bytes one block keeps from its forward to its backward under per-op SAC, one TP rank:
      * the block's input, which the checkpoint holds to re-run the block (torch/utils/checkpoint.py, the
        non-reentrant frame keeps its args);
      * the outputs of the saved matmuls (op_sac_saved_matmuls), in the compute dtype;
      * the SDPA kernel's outputs (op_sac_stores_sdpa): the attention output and the fp32 logsumexp, one per head
        and query (plus the 8-byte philox seed and offset: NB not counted, an under-count of 1 KiB per layer).
    _CachingTorchDispatchMode stores every MUST_SAVE output whether or not a backward reads it (checkpoint.py
    create_selective_checkpoint_contexts)."""
    from .nvfp4 import sac_mm_share  # (the NVFP4 layers' GEMMs are not on the save list)

    t, h, a = setup.tp, spec.hidden, st.act
    sp = t if setup.sequence_parallel else 1
    stored = st.residual * h / sp + a * sac_mm_share(spec, setup) * sum(
        out / (t if column else 1) for _, out, _, column in op_sac_saved_matmuls(spec, setup, moe))
    if op_sac_stores_sdpa(spec, setup):
        # the attention output is heads x the value head width: q_dim, or MLA's v_head_dim per head (torchtitan
        # models/deepseek_v3/model/model.py:322)
        out = spec.heads * spec.mla.v_head_dim if spec.mla is not None else spec.q_dim
        stored += (a * out + FP32 * spec.heads) / t
    return stored * tokens


def checkpoint_held_masks(spec: ModelSpec, setup: Setup, st: StateBytes, layers: int) -> tuple[float, float]:
    """The (b, 1, s, s) attention masks that full recomputation keeps alive: (from the forward through the last
    layer's backward, at the first layer's backward). HF's eager attention gets a mask the model builds once per
    forward in the embeddings' dtype (one per kind of layer: Gemma-2's sliding and global, modeling_gemma2.py:431-
    443); the checkpointed layer's `recompute_fn` closes over the layer's arguments, mask included
    (torch/utils/checkpoint.py:1657-1688 `fn(*args, **kwargs)`), so each mask lives until the backward of the lowest
    layer that uses it — without recomputation only the model's forward holds it, and the add that reads it saves
    nothing. By the first layer's backward only that layer's kind is left. (GPT-2's eager attention indexes a
    boolean buffer: no mask is built. SDPA gets none for a causal batch without padding.)"""
    gemma3 = siglip.checkpoint_held_masks(spec, setup, layers)  # Gemma 3's boolean image-block masks
    if gemma3 is not None:
        return gemma3
    traits = family_traits(spec)
    if (setup.recompute != "full" or not setup.stack_facts.facts.get("attention", {}).get("eager_mask")
            or setup.compile or resolved_kernel(spec, setup) != "eager" or not traits["eager_softmax_fp32"]):
        return 0.0, 0.0
    one = st.residual * setup.batch * setup.seq * setup.seq
    return min(traits["causal_masks"], layers) * one, one


def _saves_its_input(spec: ModelSpec, setup: Setup, st: StateBytes) -> bool:
    """Whether the layer's saved tensors include its input: a pre-LayerNorm saves it (aten native_layer_norm); HF's
    RMSNorm saves its fp32 upcast, which is the input itself only when that is fp32 (`x.to(torch.float32)` is a
    no-op); torch.rms_norm's CUDA kernel saves its input (activations._norm_saved), its CPU composite the fp32
    upcast; post-norm BERT's q/k/v save it without autocast (with autocast they save their casts)."""
    if family_traits(spec)["post_norm"]:
        return not st.autocast
    if spec.norm == "layernorm":
        return True
    if norm_kernel(setup) == "torch-rms-norm" and setup.device == "cuda":
        return True
    if norm_kernel(setup) == "liger-rms-norm":  # LigerRMSNormFunction saves X (liger.py)
        return True
    return st.residual == FP32


def layer_params(spec: ModelSpec, pc: ParamCounts, setup: Setup, moe: bool | None = None) -> float:
    """One (average) layer's parameters on one TP rank (norms replicated, as parallel/tensor.py:rank_params);
    `moe` True/False: a layer of that kind (DeepSeek's first_k_dense_replace dense layers come first, so the
    backward starts in an MoE layer, whose expert gradients are the ones made by its high points)."""
    # an MoE layer's MLP on the rank, in TP-shard units: its routed experts split over ep × etp under expert
    # parallelism (parallel/expert_memory.py)
    moe_mlp = pc.moe_mlp if setup.ep <= 1 else moe_mlp_on_rank(spec, pc, setup) * setup.tp
    if moe is not None and pc.dense_layers and pc.moe_layers:
        return pc.norms + (pc.attention + (moe_mlp if moe else pc.mlp)) / setup.tp
    return pc.norms + (pc.attention + (pc.mlp * pc.dense_layers + moe_mlp * pc.moe_layers) / spec.layers) / setup.tp
