"""What DeepSpeed's ZeRO engine (deepspeed 0.19.8) holds on one rank: model states as its optimizers allocate
them, its gradient buckets, the fp32 gradient of the step, and what ZeRO-Offload moves to host memory.

Paths are inside the deepspeed package; the defaults are stacks/deepspeed.toml facts. Per rank, `n` parameters
(after TP/PP), `dp` data-parallel ranks, 16-bit dtype bytes `w` (4 under fp32):
  * stage 0, bf16/fp16: FP16_Optimizer (engine.py:2321 -> fused_optimizer.py): a flat 16-bit copy the params
    view (:94-97), a flat fp32 master (:100), 16-bit .grad; the step casts every .grad to fp32 and flattens the
    casts into one fp32 gradient (:283-291: casts and flat both live, then the casts go).
  * stage 0, fp32: the client optimizer alone; the gradient all-reduce flattens each bucket into a new tensor
    (engine.py:3795-3797, buckets of MEMORY_OPT_ALLREDUCE_SIZE elements, :151).
  * stages 1-2: DeepSpeedZeroOptimizer: the flat 16-bit weights (stage_1_and_2.py:509), an fp32 partition of
    them cloned even under fp32 (:556-577: `.clone().to(master_weights_and_grads_dtype)`), the optimizer state
    of that partition, and the ipg bucket: reduce_bucket_size elements allocated whole (:3265), two with
    overlap_comm (:3273-3278). Stage 2 keeps the rank's reduced gradients in grads_in_partition (n/dp in the
    model dtype, :2192); stage 1 keeps every gradient. The step flattens the partition's gradients and casts
    them to a new fp32 tensor (:3113-3118), freed after the update (:3142); the step ends with the all-gather of
    the updated partitions (:3155), into a flat buffer of the whole model under gloo (allgather_flat).
  * stage 3: DeepSpeedZeroOptimizer_Stage3: 16-bit partitions of every parameter, and beside them whole copies of
    the parameters under stage3_param_persistence_threshold elements (persistent_copies), the fp32 partition
    (stage3.py:1170-1172; cloned under fp32 too, see deepspeed_states), grad_partitions_flat_buffer (n/dp in the
    accumulation dtype, :791), one ipg bucket (:782), at the backward's end the last bucket's reduce-scatter copies
    (reduce_scatter_copies) with the embedding still gathered (backward_leftovers), and at the step, with the whole
    copies released, the largest sub-group's flat gradient and its fp32 cast (:2686-2687, sub_group_size). The
    gradient partition buffer is live through the whole step, forward included (gradient_buffer_resident).
  * offload optimizer: the fp32 partition, its optimizer state and its fp32 gradient partition live in host
    memory (stage_1_and_2.py:278 device='cpu', :937-941; stage3.py:1158-1160, :1338), plus a 16-bit host copy
    of the partition that the update is copied through (stage_1_and_2.py:563-571); ZeRO-3's
    grad_partitions_flat_buffer is made on the optimizer's device, the host (stage3.py:333, :791-795), and
    ZeRO-1/2 accumulating micro-batches keep pinned host gradient buffers (stage_1_and_2.py:1822-1825).
    offload params (stage 3) moves the 16-bit partitions to host as well (stage3.py:907).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ...setup import Setup
from ...spec import ModelSpec
from ..grad_clip import clip_work
from ..params import ParamCounts, local_experts
from ..precision import StateBytes
from ..stacks import model_for
from . import zero3_replay
from .expert import split_params
from .pipeline import Stage
from .tensor import largest_tensor
from .zero import ModelStates

FP32 = 4


def deepspeed_engine(setup: Setup) -> bool:
    """The ZeRO engine's own allocation (this module) rather than torch DDP/ZeRO's (parallel/zero.py): a training
    step on a stack that runs it (analytic/stacks)."""
    return model_for(setup).zero_engine and setup.mode == "train"


def fused_adam(setup: Setup) -> bool:
    """The client optimizer is DeepSpeed's FusedAdam (engine.py:2486, the stack's fused kernel): it needs CUDA
    (ops/adam/fused_adam.py builds a CUDA kernel), so a CPU run takes any other optimizer (torch's AdamW)."""
    return setup.device != "cpu" and setup.optimizer in ("adam", "adamw") and setup.optimizer_kernel == "fused"


def _fact(setup: Setup, key: str):
    return setup.stack_facts.fact(key)


@dataclass(frozen=True)
class DeepSpeedStates:
    states: ModelStates  # on the device, resident through the step
    step_transient: float  # bytes the optimizer step adds on the device beside the gradients
    host: float  # ZeRO-Offload's host bytes
    in_backward: float = 0.0  # buffers live from the backward's start to its end (ZeRO-1/2's ipg buckets)
    backward_end: float = 0.0  # made at the backward's end with every gradient live (ZeRO-0's all-reduce copy)
    # ZeRO-3 offload: a reduced gradient partition staged on the device on its way to the host, from the first
    # reduction (the LM head's, after the loss's backward) on
    staged: float = 0.0
    # the parameters still gathered when backward_end is made (None: as at the other backward moments)
    end_gathered: float | None = None

    def backward_moments(self, gathered: float) -> dict:
        """phases.StepBytes.gathered_at: what is live beside the states at each backward moment."""
        if not (self.in_backward or self.backward_end or self.staged):
            return {}
        held = gathered + self.in_backward
        end = (held if self.end_gathered is None else self.end_gathered + self.in_backward) + self.backward_end
        # NB (ZeRO-3): the embedding's backward temporaries, added to this moment by phases.peak, are freed by the
        # backward's end (its gradient copied into the bucket, stage3.py:1636-1640): over-counts by them there
        return {"loss_backward": held, "last_layer_backward": held + self.staged,
                "first_layer_backward": held + self.staged,
                "embedding_backward": max(held, end) + self.staged, "layer_backward": (held + self.staged, 0.0)}


def overlap_comm(setup: Setup) -> bool:
    """Whether ZeRO overlaps its gradient reduction with the backward: the stage's default (stacks/deepspeed.toml
    [overlap_comm]: config.py:384-386) or --overlap-comm at ZeRO-1/2."""
    return setup.overlap_comm or setup.zero in setup.stack_facts.fact("overlap_comm", "stages")


def grad_bytes(setup: Setup, w: float) -> float:
    """Bytes of a gradient as ZeRO accumulates and reduces it (stacks/deepspeed.toml [grad_accum_dtype]): the model
    dtype `w` by default (engine.py:1806-1807), fp32 when set so."""
    return {"model": w, "fp32": FP32}[_fact(setup, "grad_accum_dtype")]


def gradient_buffer_resident(setup: Setup) -> bool:
    """ZeRO-3 makes its gradient partition buffer whole when the optimizer is built (stage3.py:791-793, torch.zeros of
    every parameter's partition_numel, on the optimizer's device), views each parameter's partition in it
    (:797-801), and never frees it in a step: partition_grads copies each reduced partition into its view, or adds it
    when accumulating (:2022-2036); the step reads the views (:1424-1425 averaged_gradients) and zero_grad only
    drops the parameters' .grad (:2370-2392). So the rank's gradient partition is live from before the first forward
    on, not made layer by layer in the backward; on the device unless ZeRO-Offload puts the buffer on the host
    (:333, deepspeed_states)."""
    return setup.zero == 3 and setup.offload_state not in ("optimizer", "params")


def ipg_buckets(setup: Setup, w: float) -> float:
    """The contiguous_gradients bucket buffers: reduce_bucket_size elements each, allocated whole, in the
    gradient-reduction dtype (the model dtype: grad_accum_dtype defaults to it, engine.py:1806-1807)."""
    if setup.zero == 0 or not _fact(setup, "contiguous_gradients"):
        return 0.0
    # stage_1_and_2.py:3265 one buffer, :3273-3278 a second with overlap_comm; stage3.py:782 always one
    count = 2 if (setup.zero in (1, 2) and overlap_comm(setup)) else 1
    return count * _fact(setup, "reduce_bucket_size") * grad_bytes(setup, w)


def persistent_params(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage) -> float:
    """Elements ZeRO-3 leaves whole on every rank: each parameter of at most stage3_param_persistence_threshold
    elements (parameter_offload.py:187, :317-335 mark_persistent_parameters: ds_numel <= threshold). A model the
    replay lays out (zero3_replay.hf_model) is taken tensor by tensor: the norms, and in a small model its small
    projections too (tiny-llama's q/k/v/o: 65,536 and 16,384 elements). NB: biases are not in that layout (under-
    counts by their whole copies, a few hidden-sized vectors per layer); another model: its layer norms and final
    norm only. Under AutoEP the experts are the rank's w1, w2, w3 (autoep_routed), none where their expert-data-
    parallel group is one rank (its partition is the whole tensor: no copy beside it, as persistent_copies)."""
    thr = _fact(setup, "stage3_param_persistence_threshold")
    if zero3_replay.replayable(spec):
        routed = autoep_routed(spec, setup)
        model = _model(spec, pc, routed is None and spec.family in setup.stack_facts.fact("leaf_module", "families"),
                       routed)
        numel = model.numel
        in_layers = {p for m in model.layers for p in m.subtree}
        layers = sum(numel[p] for p in in_layers if numel[p] <= thr)
        # the embedding, the final norm and an untied LM head (a tied head is the embedding's parameter)
        rest = sum(numel[p] for p in set(model.root.subtree) - in_layers if numel[p] <= thr)
        return layers * stage.layers / spec.layers + (rest if stage.head else 0)
    norms = pc.norms if pc.norms <= thr else 0
    final = pc.final if (stage.head and pc.final <= thr) else 0
    return stage.layers * norms + final


def persistent_copies(persistent: float, setup: Setup, w: float) -> float:
    """Bytes of the whole copies of ZeRO-3's `persistent` parameters, beside their partitions. Every parameter is
    partitioned when the engine converts the model (parameter_offload.py:180 _convert_to_zero_parameters ->
    partition_parameters.py:1818-1846, a ds_tensor of ceil(numel / dp) elements each) before the small ones are
    marked persistent (parameter_offload.py:189-190), and the optimizer flattens every trainable parameter's
    ds_tensor into its 16-bit partition (stage3.py:944, :967-973; on the host under offload_param, :977-998): a
    persistent parameter keeps its partition there. Its whole copy is gathered beside it, by the first forward and
    again at each step's end (stage3.py:2840-2841 -> partition_parameters.py:1757 _allgather_params_coalesced,
    :2052 torch.empty of the whole numel), and never released in forward or backward (partitioned_param_coordinator.py:
    638-640: not ds_persist). On one rank the gather is the partition moved to the device (partition_parameters.py:
    2029-2030 -> :104-106 .to(device)): no copy unless offload_param holds the partition on the host."""
    if setup.dp > 1 or setup.offload_state == "params":
        return persistent * w
    return 0.0


def registration_order(spec: ModelSpec, pc: ParamCounts, setup: Setup, routed: bool = True) -> list[int] | None:
    """Elements of each parameter in the order model.parameters() yields them (the client optimizer's group, which
    ZeRO-1/2 flattens in that order: stage_1_and_2.py:428-434, :504-517), for a model zero3_replay lays out: the
    embedding, each layer's modules as transformers' decoder layer registers them (self_attn, mlp, then its two
    norms: models/llama/modeling_llama.py LlamaDecoderLayer.__init__), the final norm, an untied LM head; without the
    routed experts' tensors unless `routed` (AutoEP's dense group: the experts are a group of their own, whose
    replacement layer takes the block's place, engine.py:2330-2331 -> moe/utils.py:156-183). None for another model.
    NB: biases are not in the layout, and a family registering its layer otherwise (extra norms, norms first) is
    laid out as Llama's."""
    if not zero3_replay.replayable(spec):
        return None
    model = _model(spec, pc, spec.family in setup.stack_facts.fact("leaf_module", "families"))
    numel, root = model.numel, model.root
    keep = (lambda p: True) if routed else (lambda p: p not in model.experts)
    body, head = root.children
    out = [numel[p] for p in body.children[0].subtree]  # the embedding
    for layer in model.layers:  # box(input norm, self_attn, post norm, mlp), the forward's order
        norm_in, attn, norm_post, mlp = layer.children
        out += [numel[p] for m in (attn, mlp, norm_in, norm_post) for p in m.subtree if keep(p)]
    out += [numel[p] for p in body.children[-1].subtree]  # the final norm
    if not spec.tied_embeddings:
        out += [numel[p] for p in head.subtree]
    return out


def _kept(sizes: list[int], ranks: int) -> list[int]:
    """Per rank of `ranks`, the elements of the whole parameters its partition of the flat group `sizes` touches
    (partition_grad_elements)."""
    align = 2 * ranks
    size = -(-sum(sizes) // align) * align // ranks
    kept = []
    for r in range(ranks):
        start, end, offset, total = r * size, (r + 1) * size, 0, 0
        for x in sizes:
            if start <= offset < end or offset < start < offset + x:
                total += x
            offset += x
        kept.append(total)
    return kept


def partition_grad_elements(spec: ModelSpec, pc: ParamCounts, setup: Setup, n: float,
                            experts: float = 0.0) -> float | None:
    """ZeRO-1/2 with contiguous_gradients copy each reduced gradient of the rank's partition into grads_in_partition,
    sized as the whole parameters the partition touches (stage_1_and_2.py:2185-2194, copy_grads_in_partition,
    called for stage 2 at :2270-2271 and stage 1 at :2273-2274): a parameter cut by a partition edge is whole in
    both ranks' buffers (get_partition_info :2579-2607). The partitions are len(flat) / dp elements, the flat group
    padded to a multiple of 2·dp (:387, :441-446, :585). The most over the ranks, by registration_order; None
    where the layout is not known or is not the rank's trainable parameters (`n`, e.g. LoRA adapters). Under AutoEP
    (`experts`: the rank's routed experts, of `n`) the dense group over dp and the experts' group over the
    expert-data-parallel ranks (stage_1_and_2.py:876-881), its flat the rank's w1, w2, w3 of each MoE layer
    (expert_split), rank r in position r // ep of its expert-data-parallel group (utils/groups.py:591-603)."""
    dp = setup.dp
    sizes = registration_order(spec, pc, setup, routed=not experts)
    if sizes is None or setup.lora_rank or sum(sizes) != int(n - experts) or dp <= 1:
        return None
    dense = _kept(sizes, dp)
    if not experts:
        return float(max(dense))
    tensor = local_experts(spec, setup) * spec.moe.expert_intermediate * spec.hidden  # w1, w2, w3 alike
    moe = _kept([int(tensor)] * int(round(experts / tensor)), setup.expert_dp)
    return float(max(d + moe[r // setup.ep] for r, d in enumerate(dense)))


def deepspeed_states(n: float, optimizer_bytes: float, st: StateBytes, setup: Setup, persistent: float = 0.0,
                     largest: float = 0.0, tensors: int = 0, leftover: float = 0.0,
                     kept: float | None = None, frozen_persistent: float = 0.0,
                     experts: float = 0.0, expert_largest: float = 0.0) -> DeepSpeedStates:
    """n: parameters on this rank before ZeRO; optimizer_bytes: their unsharded optimizer state (fp32 states:
    the ZeRO optimizers hand the client optimizer the fp32 partition); persistent: ZeRO-3's whole small
    parameters; largest: the largest parameter (ZeRO-Offload stages its gradient through a buffer of it, the
    clip's norm casts it); tensors: the parameter tensors (the clip's per-tensor norms); leftover: ZeRO-3's
    parameters still gathered at the backward's end (backward_leftovers); kept: ZeRO-1/2's gradient elements
    in the rank's partition buffer (partition_grad_elements; None: n/dp); frozen_persistent: a LoRA base's whole
    small parameters (counted in lora_frozen), which ZeRO-3's step releases with the rest; experts: of `n`, the
    rank's own routed experts under AutoEP (expert_split), partitioned over the expert-data-parallel ranks, their
    largest tensor `expert_largest` (`largest` then the dense parameters')."""
    dp, z = setup.dp, setup.zero
    w = st.weight  # the model dtype: 2 under bf16/fp16-master, 4 under fp32
    low = st.master > 0  # a 16-bit model with fp32 masters
    # AutoEP: the experts' own optimizer group, partitioned over the expert-data-parallel group (Setup.expert_dp) by
    # ZeRO-1/2 (stage_1_and_2.py:876-881) and ZeRO-3 (engine.py:921-932), the dense rest over dp
    edp = setup.expert_dp if experts else 1
    part = (n - experts) / dp + experts / edp
    # the step takes one optimizer group at a time (stage_1_and_2.py:3075 `for i, group in enumerate(
    # self.bit16_groups)`, stage3.py:936-943 a group's own sub-groups): its flat gradient and cast are the larger one's
    group_part = max((n - experts) / dp, experts / edp)
    whole = max(largest, expert_largest)  # the rank's largest parameter tensor
    # the clip's norm casts one gradient piece at a time (grad_clip.zero_clip): ZeRO-1/2's pieces are cut at their
    # group's partition edges, ZeRO-3's are each parameter's partition over its group; `clip_largest` gives the
    # clip the largest piece over the two groups (min(largest, partition) / largest / dp: zero_clip's own rules).
    # NB: ZeRO-1/2's most gradient elements (kept) and this largest piece are each the most over the ranks, which
    # may be two ranks: over-counts then (tiny-deepseek --ep 2 on 4 ranks, ZeRO-2's optimizer phase: +5.3 %)
    if not experts:
        clip_largest = largest
    elif z == 3:
        clip_largest = dp * max(largest / dp, expert_largest / edp)
    else:
        clip_largest = max(min(largest, (n - experts) / dp), min(expert_largest, experts / edp))
    off_opt = setup.offload_state in ("optimizer", "params")
    host = 0.0
    if z == 0:
        weights, grads = n * w, n * w
        opt = optimizer_bytes
        master = n * FP32 if low else 0.0  # fused_optimizer.py:100
        comm = 0.0
        # FP16_Optimizer (client optimizer FusedAdam), fused_optimizer.py:283-291: per-parameter fp32 casts and
        # their flat copy, both live at the cat; FP16_UnfusedOptimizer (any other optimizer, engine.py:2564-2599)
        # keeps one fp32 .grad per parameter (unfused_optimizer.py:217-221). fp32: the all-reduce's flat bucket
        # copy (engine.py:3795), made at the backward's end with the grads live
        copies = setup.stack_facts.fact("stage0_optimizer", "fp32_grad_copies")["fused" if fused_adam(setup) else "unfused"]
        transient = max(copies * n * FP32 if low else 0.0,
                        clip_work(setup, st, n, tensors, whole).temporaries)
        # the all-reduce runs inside engine.backward at the accumulation boundary (engine.py:3073 allreduce_gradients)
        # NB: one bucket's flat copy (the largest, min(n, bucket)); buckets after it reuse the freed memory. AutoEP:
        # the dense gradients' buckets, then the experts' over their expert-data-parallel group (engine.py:3932-3935
        # -> :3898-3919 _reduce_expert_gradients), each flattened and freed in turn: the larger group's
        bucket = _fact(setup, "stage0_allreduce")
        flat = max(min(n - experts, bucket), min(experts, bucket)) * w if setup.dp > 1 else 0.0
        return DeepSpeedStates(ModelStates(weights, grads, master, opt, comm), transient, host, 0.0, flat)
    opt = optimizer_bytes * part / n if n else 0.0  # (optimizer_bytes / dp without experts)
    # every stage clones an fp32 partition, under fp32 too: stages 1-2 always (stage_1_and_2.py:556-577); stage 3
    # would reuse an fp32 partition already on its device (stage3.py:1162-1167), but compares its torch.device with
    # self.device, the accelerator's device name, a string (:333, cpu_accelerator.py:67-68 / cuda_accelerator.py:
    # 82-83), which no torch.device equals, so it takes the clone (:1169-1172)
    master = part * FP32
    comm = ipg_buckets(setup, w)
    in_backward = staged = backward_end = 0.0
    if z < 3:
        # NB: the reduction's flat copy of the bucket's gradients (stage_1_and_2.py:1707-1712 allreduce_and_scatter
        # -> :2367 allreduce_bucket, min(n, reduce_bucket_size) elements) is not added at the backward's end: there
        # the gradients are views of the bucket (:1455-1461), while the backward moments count the gradients made so
        # far beside it; the two nearly cancel (ZeRO-2 -0.3 % on tiny-llama, bench/results/deepspeed_cpu.md)
        # ZeRO-1/2 allocate the buckets at the backward's start (engine.py:3313 -> stage_1_and_2.py:3256
        # setup_buckets) and free them at its end (:1061 -> :924 _release_ipg_buffers); ZeRO-3 keeps its one
        # bucket from construction on (stage3.py:782)
        comm, in_backward = 0.0, comm
    if z == 3:
        # the 16-bit partition of every parameter, persistent ones included, and the persistent whole copies
        weights = part * w + persistent_copies(persistent, setup, w)
        gb = grad_bytes(setup, w)
        # grad_partitions_flat_buffer (stage3.py:791), live through the whole step (gradient_buffer_resident)
        grads = part * gb
        # the sub-group's gradient views flattened into a new tensor in the gradient dtype, then cast to a new fp32
        # tensor (stage3.py:2686-2687), both live at the cast; where the gradients are fp32 (fp32, grad_accum_dtype
        # fp32) the cast is the flat itself. Freed after the sub-group's update (:2927 -> :2735); under ZeRO-Offload
        # the step makes neither (:2706-2707: the fp32 gradient is already on the host), transient 0 below.
        # NB: one sub-group (sub_group_size 1e9 > n/dp in every modelled case)
        flat = min(group_part, _fact(setup, "sub_group_size"))
        transient = flat * gb + (flat * FP32 if gb < FP32 else 0.0)
        backward_end = reduce_scatter_copies(n, setup, gb)
    else:
        weights = n * w  # bit16_groups_flat (stage_1_and_2.py:509)
        kept = part if kept is None else kept  # grads_in_partition's whole parameters (partition_grad_elements)
        grads = kept * grad_bytes(setup, w) if z == 2 else n * w  # grads_in_partition (:2192) / every .grad (stage 1)
        # :3113-3118: the partition's flat gradient and its fp32 cast are both live at the cast. Under fp32
        # the cast is a copy-free .to() (same dtype) and only the flat copy exists
        transient = group_part * w + (group_part * FP32 if low else 0.0)
        if z == 1:
            # the step first frees the gradients of the parameters outside the rank's partition (:3103
            # free_grad_in_param_list); those it touches are views of grads_in_partition
            transient -= (n - kept) * w
    # the clip's norm runs before the step's flat gradient is made (grad_clip.zero_clip), beside the rank's own
    # gradients: ZeRO-1 has by then reduced every gradient into its compact partition buffer (stage_1_and_2.py:
    # 1034-1036, :1336-1340) and dropped the rest (:2395-2399 _clear_previous_reduced_grads), n - kept of `grads`.
    # NB: under ZeRO-Offload the norm is taken on the host copies (complete_grad_norm_calculation_for_cpu_offload):
    # not counted
    dropped = (n - kept) * w if z == 1 else 0.0  # (kept: set with the ZeRO-1/2 gradients above)
    transient = max(transient, clip_work(setup, st, part, tensors, clip_largest).temporaries - dropped)
    if z == 3:
        # ZeRO-3's step first releases every gathered parameter, the persistent whole copies too (stage3.py:2878
        # _partition_all_parameters -> parameter_offload.py:242 -> partitioned_param_coordinator.py:537-546
        # release_and_reset_all, :629 param.partition), before the norm (stage3.py:2886) and the sub-groups' update
        # (:2910-2927), and gathers them again in _post_step (:2931 -> :2840-2841), after the fp32 gradient is freed:
        # the norm and the cast run without them, and the step's start, with them, adds nothing to the states (0).
        # NB: the re-gather's own collective buffers (partition_parameters.py:2022-2090) are not counted: under by
        # them where they outgrow the cast's moment
        released = persistent_copies(persistent + frozen_persistent, setup, w)
        transient = max(0.0, transient - released)
    if off_opt:
        # host: fp32 partition, its optimizer state, its fp32 gradient, the 16-bit copy buffer
        host = master + opt + part * FP32 + (part * w if z < 3 else 0.0)
        if z < 3:
            # the partition's gradients go straight to the host fp32 gradient through a buffer of the largest
            # parameter on the device (stage_1_and_2.py:659 temp_grad_buffer_for_gpu_offload)
            grads = whole * w
            host += whole * w  # its pinned host twin (:653-658 temp_grad_buffer_for_cpu_offload)
            if setup.grad_accum > 1:
                # accumulating micro-batches keep each partition parameter's gradient in a pinned host buffer of
                # the model dtype (stage_1_and_2.py:1822-1825 buffer_to_accumulate_to_in_cpu, made when
                # :2166 micro_step_id > 0 or not at the boundary). NB: the parameter's whole numel for the
                # partition's parameters: a parameter cut by the partition edge under-counted by its other part
                host += part * w
        else:
            # ZeRO-3 puts its gradient partition buffer on the optimizer's device, the host under offload
            # (stage3.py:333 self.device = cpu, :791 grad_partitions_flat_buffer, pinned :794-795); at the
            # boundary each parameter's partition comes back to the device (:2028/:2034 .to(device)) and its fp32
            # cast goes to the host fp32 gradient (:1456-1457): one parameter's at a time.
            # NB: the largest parameter's partition and its fp32 cast taken live, nothing else
            host += grads
            staged = whole / dp * (grad_bytes(setup, w) + FP32)
            grads = 0.0
        master, opt, transient = 0.0, 0.0, 0.0
    if setup.offload_state == "params":
        host += part * w  # the 16-bit partitions (stage3.py:907)
        weights -= part * w
    if z in (1, 2):
        # the step's last moment, the all-gather of the updated 16-bit partitions: every gradient is freed by then
        # (per optimizer group: the experts' over their expert-data-parallel group, utils.py:1024-1032)
        gather = max(allgather_flat(n - experts, w, setup), allgather_flat(experts, w, setup, edp))
        transient = max(transient, gather - grads)
    return DeepSpeedStates(ModelStates(weights, grads, master, opt, comm), transient, host, in_backward,
                           backward_end, staged, leftover * w if z == 3 else None)


def expert_split(spec: ModelSpec, pc: ParamCounts, setup: Setup, n: float, layers: int,
                 largest: float) -> tuple[float, float, float, float]:
    """(the rank's parameters, of them its routed experts, its largest dense tensor, its largest expert tensor)
    under AutoEP (--ep > 1):
    each MoE block replaced by an AutoEPMoELayer holding num_experts / autoep_size of the experts (module_inject/
    auto_ep.py:692-730 replace_moe_layers; the router, shared experts and the rest of the layer whole), as the other
    stacks' expert parallelism splits them (parallel/expert.py split_params), in three grouped tensors w1, w3
    (E/ep, i, h) and w2 (E/ep, h, i) (auto_ep_layer.py:632-636 -> moe/ep_experts.py:423-425 GroupedExperts), not
    transformers' one (E, 2i, h) gate_up_proj. NB: the rank's parameter tensors (the clip's per-tensor norms)
    are still counted as transformers' two expert tensors a layer (one fewer than AutoEP's three: a few bytes).
    (n, 0, largest, 0) without --ep."""
    if setup.ep <= 1:
        return n, 0.0, largest, 0.0
    dense, experts = split_params(spec, pc, setup, n, layers)
    return (dense + experts, experts, largest_tensor(spec, experts=0),
            local_experts(spec, setup) * spec.moe.expert_intermediate * spec.hidden)


def backward_leftovers(pc: ParamCounts, setup: Setup, stage: Stage) -> float:
    """Elements ZeRO-3 still holds gathered when the backward's last bucket is reduced: a module's parameters are
    released by its post-backward hook, which only fires through inputs that require grad (parameter_offload.py:
    429-431 ds_grads_remaining), so the token embedding (its input the token ids) stays gathered until the
    optimizer's backward_epilogue releases such leftovers (stage3.py:3066-3068), which the engine calls after the
    reduction (engine.py:3165 allreduce_gradients -> :3086-3087 -> stage3.py:1484-1485, then :3169).
    NB: the embedding modules taken whole (ParamCounts.embedding: any position table and embedding norm with the
    word table); 0 when it is persistent
    (under stage3_param_persistence_threshold: already whole in the weights)."""
    if setup.zero < 3 or not stage.embedding:
        return 0.0
    table = pc.embedding
    return table if table >= _fact(setup, "stage3_param_persistence_threshold") else 0.0


def reduce_scatter_copies(n: float, setup: Setup, gb: float) -> float:
    """ZeRO-3's last bucket reduction, at the backward's end (independent_gradient_partition_epilogue, stage3.py:
    1407-1410): with reduce_scatter (stacks/deepspeed.toml) __avg_scatter_grads (:1678, :1931) hands the bucket's
    gradients to reduce_scatter_coalesced, which interleaves every tensor's dp partitions into one new flat tensor
    (runtime/comm/coalesced_collectives.py:109-122 torch.cat, each tensor padded to a multiple of dp), reduce-scatters
    it, and returns views of the rank's slice that partition_grads copies into the gradient partition buffer
    (stage3.py:2024-2027) while the flat still lives. gloo (the CPU backend) clones the reduce-scatter's input too
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp _reduce_scatter_base, as parallel/zero.py
    reduce_scatter_transient); NCCL reduces in place. The bucket holds every gradient not reduced yet, up to
    reduce_bucket_size elements, in the reduction dtype `gb`.
    NB: min(n, reduce_bucket_size) taken at the backward's end only: a model over the bucket reduces a full bucket
    mid-backward too, with more activations live (under-counts there), and its last bucket holds the remainder
    (over-counts here); a bucket of one tensor divisible by dp is reduced without the copy (:102-105, over-counts).
    NB (AutoEP): the bucket is reduced whenever the next gradient's partition group differs (stage3.py:1579-1582),
    so the last one holds the dense run after the first MoE layer's experts, not min(n, bucket): over-counts by the
    rest (tiny-mixtral --ep 2, 2 ranks: backward +0.62 %, bench/results/deepspeed_autoep_cpu.md)."""
    if setup.zero < 3 or not _fact(setup, "reduce_scatter"):
        return 0.0
    flat = min(n, _fact(setup, "reduce_bucket_size")) * gb
    return flat * (2 if setup.device == "cpu" and setup.dp > 1 else 1)


def gradients_leave_device(setup: Setup) -> bool:
    """Under ZeRO-Offload the gradients the backward makes pass through the ipg bucket (counted in the comm
    buffers) to the host: ZeRO-1/2 copy the reduced partition out and clear the .grad (stage_1_and_2.py:2142-2167
    copy_grads_in_partition), ZeRO-3 into its host partition buffer (stage3.py:2022-2036). So no backward moment
    holds the layers' gradients on the device. NB: the .grad autograd makes before its hook copies it into the
    bucket (one parameter's) is not counted."""
    return deepspeed_engine(setup) and setup.zero >= 1 and setup.offload_state in ("optimizer", "params")


def allgather_flat(n: float, w: float, setup: Setup, ranks: int | None = None) -> float:
    """ZeRO-1/2's step ends with all_gather_dp_groups (stage_1_and_2.py:3155) -> dist.all_gather_into_tensor of the
    rank's updated partition into bit16_groups_flat (runtime/utils.py:1016), after the step freed every gradient
    (:3103, :3128 free_grad_in_param_list, :3141 the fp32 gradient). NCCL gathers in place; gloo (the CPU backend)
    gathers into its own flat output, world x partition = n elements in the model dtype, made in its worker thread
    and freed once copied out (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp: _allgather_base -> allgather ->
    AsyncAllgatherWork::allgather, flatOutputTensor = newLikeFlat(outputs[0])).
    The allocation records show a second n x w block, born in the calling thread inside c10d::_allgather_base_
    (AsyncAllgatherWork::getOutputTensors makes one with newLikeFlat: inferred, the records name no C++ frame).
    Usually the caller frees it at once, before gloo's buffer is made (ZeRO-1/2 optimizer phases within 0.5 %,
    bench/results/deepspeed_cpu.md). NB: under-counts by that n x w on a rank where its free is made by gloo's
    thread after the work instead: a thread-timing race, seen once (ZeRO-1 fp32 optimizer phase 68,576,404 B
    measured vs 53,132,800 B, = this model + n x 4). `ranks`: the group's (dp unless given: AutoEP's expert group)."""
    if setup.device != "cpu" or (setup.dp if ranks is None else ranks) <= 1:
        return 0.0
    return n * w


def lora_frozen(spec: ModelSpec, setup: Setup, st: StateBytes, n_base: float, persistent: float) -> float:
    """Bytes of a LoRA base (`n_base` frozen parameters) under DeepSpeed's ZeRO, beside the adapters' states that
    deepspeed_states gives for the trainable parameters alone: the engine casts every parameter to the model dtype
    (engine.py:1859-1862 _cast_module_mixed_precision, frozen or not); the ZeRO-1/2 optimizer flattens and
    partitions only the optimized (requires_grad) parameters (stage_1_and_2.py:428-434, utils.py:815
    is_optimized_parameter), so the frozen base stays whole on every rank with no fp32 master; ZeRO-3 converts
    every module parameter to a partitioned one (parameter_offload.py:258-263 _convert_to_zero_parameters) but
    makes fp32 partitions of the trainable groups only (stage3.py:440-443, :726-735): the base is partitioned in
    the model dtype, its small tensors (`persistent`: stage3_param_persistence_threshold) whole beside their
    partitions (persistent_copies). A bitsandbytes base (--quant): ZeRO-3 partitions the packed codes stored in a
    float dtype (bnb_4bit_quant_storage, as HF's DeepSpeed ZeRO-3 + QLoRA recipe sets it), the quant state whole
    (analytic/lora.py quant_delta)."""
    from ..lora import quant_delta

    w, z = st.weight, setup.zero
    frozen = n_base * w / setup.dp + persistent_copies(persistent, setup, w) if z >= 3 else n_base * w
    if setup.quant:
        frozen += quant_delta(spec, setup, sharded=z >= 3)
    return frozen


def lora_persistent(spec: ModelSpec, setup: Setup) -> float:
    """The adapter elements ZeRO-3 keeps whole on every rank: each tensor under stage3_param_persistence_threshold
    elements (parameter_offload.py:187), e.g. a rank-8 lora_A of a 4096-wide input (32,768)."""
    from ..lora import adapter_sizes

    thr = _fact(setup, "stage3_param_persistence_threshold")
    sizes = adapter_sizes(spec, setup, spec.layers)
    return sum(x for x in sizes.period if x < thr) * sizes.times


def gathered(spec: ModelSpec, pc: ParamCounts, setup: Setup, st: StateBytes, layer: float) -> float:
    """ZeRO-3 in forward and backward: the most parameter bytes gathered at once, by the coordinator's own rules
    replayed over the HF model's module trace (zero3_replay.py: the module being run, its prefetch, and what the
    reuse distance keeps, as at the forward/backward turn; an MoE block's experts all at once).
    NB: the replay's high point is taken at every forward/backward moment (over-counts at the others). A model the
    replay does not lay out (hybrid, encoder-decoder, vision): one layer all-gathered whole and the prefetch of the
    modules after it, up to stage3_prefetch_bucket_size elements (config.py:222); the embedding and LM head taken as
    a layer's size (under-counts when one is larger)."""
    if setup.zero < 3:
        return 0.0
    if zero3_replay.replayable(spec):
        return gathered_numel(spec, pc, setup.recompute_policy == "full", setup.stack_facts,
                              autoep_routed(spec, setup)) * st.weight
    prefetch = min(layer, _fact(setup, "stage3_prefetch_bucket_size"))
    return (layer + prefetch) * st.weight


def gathered_numel(spec: ModelSpec, pc: ParamCounts, recompute: bool, facts, routed: tuple[int, ...] | None = None,
                   **knobs: int) -> int:
    """Elements zero3_replay.replay finds gathered at once, under the stack's ZeRO-3 settings (stacks/deepspeed.toml;
    `knobs` override them by DeepSpeed's config names, as a user's config would) and its leaf MoE blocks; `routed`:
    AutoEP's experts (autoep_routed), whose AutoEPMoELayer is no leaf class of DeepSpeed's (leaf_module_config.py:
    11-15 names transformers' blocks)."""
    leaf = spec.family in facts.fact("leaf_module", "families") and routed is None
    model = _model(spec, pc, leaf, routed)
    names = ("stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
             "stage3_max_reuse_distance")
    k = [int(knobs.get(n, facts.fact(n))) for n in names]
    return zero3_replay.replay(model, recompute, *k)


def autoep_routed(spec: ModelSpec, setup: Setup) -> tuple[int, ...] | None:
    """The expert tensors ZeRO-3 gathers in an AutoEPMoELayer (--ep > 1): the rank's w1, w2, w3 (expert_split),
    partitioned over the expert-data-parallel group (engine.py:921-932); none where that group is one rank, whose
    partition is the whole tensor, fetched without a copy (as persistent_copies). None without --ep."""
    if setup.ep <= 1 or spec.moe is None:
        return None
    if setup.expert_dp == 1:
        return ()
    return (local_experts(spec, setup) * spec.moe.expert_intermediate * spec.hidden,) * 3


@lru_cache(maxsize=64)
def _model(spec: ModelSpec, pc: ParamCounts, leaf: bool, routed: tuple[int, ...] | None = None) -> zero3_replay.Model:
    return zero3_replay.hf_model(spec, pc, leaf, routed)
