"""Compute time of one micro-batch on the slowest pipeline stage, and of the optimizer step: the op list
(analytic/ops/) timed kernel by kernel by the roofline (analytic/roofline.py) — no global efficiency factor.

forward  = embedding (first stage; a VLM's image encoder too, tower_time.py) + layers × one layer's forward + head
           and loss (last stage);
backward = the same lists' backward (ops.backward) — GEMM dgrad + wgrad, attention's backward kernel, the
           elementwise rule; + Float8Linear's backward casts;
recompute = the layers the policy checkpoints × what each re-runs (ops.recomputed, ops.checkpointed_layers).
torch.compile: the lists pass through ops.compiled (fused elementwise chains) where compile_effects models the
block; otherwise eager's kernels.
MoE: dense and MoE layers in their proportion on the stage (NB: an uneven mix per stage is averaged); Qwen3-Next's
Gated DeltaNet and attention layers the same, and Nemotron-H's Mamba-2, attention and MLP blocks (layer_kinds). An
encoder-decoder (T5): its two stacks' lists (encoder_decoder_time.stage_compute).
"""
from __future__ import annotations

import math
from itertools import product

from dataclasses import dataclass, replace
from typing import NamedTuple
from functools import lru_cache

from ..hardware import GPU
from ..heads import CLASSIFIERS, layout
from ..setup import Setup
from ..spec import ModelSpec
from . import lora_ops, memo, multi_tensor, roofline, torchao_optim, windowed
from .gated_deltanet import linear_layers
from .host_queue import combined_1f1b, combined_phases, combined_stall, has_sync, sync_stall, waits
from .grad_clip import clip_work, pass_seconds
from .liger_ops import fused_linear_loss
from .ops import (Op, Shape, backward, checkpointed_layers, compiled, embedding_backward, embedding_forward,
                  grad_accumulations, head_backward_extra, head_forward, layer_forward,
                  norm_ops, recomputed, shape_of)
from .ops.loss import metric_losses
from .ops.shape import without_moe
from .params import ParamCounts
from .precision import StateBytes
from .stacks import model_for
from .timing import compute_dtype
from .ops.torchao_casts import backward_extra, backward_gemms
from .ops.cuda_graphs import graphed_lists
from ..setup.parsers import parse_cuda_graph_scope
from .torchao_recipes import bf16_layers, layer_shapes
from .te_recipes import runs_te

TERMS = ("gemm", "attention", "memory", "launches")


class ListTime(NamedTuple):
    """Seconds of an op list by term (launches: kernels × the GPU's launch cost, taken out of the others). A tuple
    (made far more often than read: the op lists' sums), with + and × by a number termwise, not a sequence's."""

    gemm: float = 0.0
    attention: float = 0.0
    memory: float = 0.0
    launches: float = 0.0
    flops: float = 0.0  # GEMM + attention FLOPs
    kernels: float = 0.0  # kernels launched (the host issues each one: step_time's host-issue bound)

    @property
    def seconds(self) -> float:
        return self.gemm + self.attention + self.memory + self.launches

    def __add__(self, o: "ListTime") -> "ListTime":
        return ListTime(self.gemm + o.gemm, self.attention + o.attention, self.memory + o.memory,
                        self.launches + o.launches, self.flops + o.flops, self.kernels + o.kernels)

    def __mul__(self, c: float) -> "ListTime":
        return ListTime(self.gemm * c, self.attention * c, self.memory * c, self.launches * c, self.flops * c,
                        self.kernels * c)

    def __eq__(self, o: object) -> bool:  # (a ListTime equals only a ListTime, as the dataclass it was)
        return isinstance(o, ListTime) and tuple.__eq__(self, o)

    def __ne__(self, o: object) -> bool:
        return not self == o

    __hash__ = tuple.__hash__

    __rmul__ = __mul__


@lru_cache(maxsize=8192)
def _gemm_seconds(gpu: GPU, m: float, n: float, k: float, dtype: str, batch: float, rows: str = "nk") -> float:
    """(a backward's dgrad/wgrad and a recompute repeat the forward's shapes)"""
    return roofline.gemm_seconds(gpu, m, n, k, dtype, batch, rows)


memo.also_clear(_gemm_seconds.cache_clear)


def _gemm_calls(op: Op) -> int:
    """The timed calls of a GEMM op (each _gemm_seconds carries one launch): one batched launch, or the rounds of
    `streams` concurrent GEMMs a per-call grouped GEMM runs in (_grouped_gemm_seconds)."""
    return math.ceil(op.batch / op.streams) if op.streams and op.batch > op.streams else 1


def _grouped_gemm_seconds(gpu: GPU, op: Op) -> float:
    """A GEMM op's time. A grouped GEMM of separate calls round-robin over `op.streams` streams (TE's
    multi_stream_cublas_gemm: GEMM i on compute stream i mod streams, each stream in order, te:transformer_engine/
    common/gemm/cublaslt_gemm.cu:941-966) runs as rounds of `streams` concurrent GEMMs, each round's tiles in waves
    over the SMs, and a last round of the remainder: not one batch whose tiles pack every wave. NB: a stream's next
    GEMM starts when its own previous one ends, so rounds overlap at their tails: pessimistic by up to a wave per
    round."""
    if not op.streams or op.batch <= op.streams:
        return _gemm_seconds(gpu, op.m, op.n, op.k, op.dtype, op.batch, op.rows)
    full, rest = divmod(math.ceil(op.batch), op.streams)
    t = full * _gemm_seconds(gpu, op.m, op.n, op.k, op.dtype, op.streams, op.rows)
    return t + (_gemm_seconds(gpu, op.m, op.n, op.k, op.dtype, rest, op.rows) if rest else 0.0)


def _op_terms(gpu: GPU, kn, launch: float, op: Op) -> tuple:
    """One op's share of time_ops' sums: (GEMM seconds, attention seconds, unfused attention's elementwise seconds,
    kernels launched, launches timed, FLOPs) less its launches, which the launches term carries; a memory op's bytes
    are summed by access class by the caller (its seconds: roofline.memory_seconds over them)."""
    if op.kind == "gemm":
        return _grouped_gemm_seconds(gpu, op) - launch * _gemm_calls(op), 0.0, 0.0, op.kernels, op.kernels, op.flops
    kernel = roofline.runnable(kn, op.kernel)
    g = at = unfused = 0.0
    if kernel == "eager":  # cuBLAS's batched GEMMs and PyTorch's elementwise kernels, as a profile sorts them
        g, unfused = roofline.unfused_attention(
            gpu, *(math.ceil(x) for x in (op.batch, op.m, op.n, op.k)), op.causal, op.dtype, op.backward, op.mask)
    else:
        at = roofline.attention_seconds(gpu, op.kernel, op.batch, op.m, op.n, op.k, op.causal, op.dtype, op.backward,
                                        op.mask, op.dropout, op.window) - launch
    if op.backward:
        k = kn.attention_bwd_launches.get(kernel, op.kernels) + \
            (kn.attention_gqa_bwd_launches.get(kernel, 0) if op.gqa else 0)
    else:
        k = op.kernels + (kn.attention_dropout_launches.get(kernel, 0) if op.dropout else 0)
    # a measured kernel's time per call includes its own launches (roofline._fitted_seconds): one is timed
    return g, at, unfused, k, 1 if kernel in kn.fitted else k, op.flops


def time_ops(gpu: GPU, ops: list[Op]) -> ListTime:
    kn = roofline.kernels_for(gpu)
    launch = kn.launch_seconds
    g = at = fl = unfused = 0.0
    n = timed = 0  # kernels launched (the host issues each); launches whose time is the launches term's
    nbytes: dict[str, float] = {}  # memory ops' bytes by access class (roofline.memory_seconds)
    for op in ops:
        if op.kind == "gemm" or op.kind == "attention":
            dg, dat, du, k, kt, f = _op_terms(gpu, kn, launch, op)
            g, at, unfused, n, timed, fl = g + dg, at + dat, unfused + du, n + k, timed + kt, fl + f
        else:
            nbytes[op.access] = nbytes.get(op.access, 0.0) + op.nbytes
            n += op.kernels
            timed += op.kernels
    # memory_seconds is bytes / achieved bandwidth + launches (roofline API): one call per access class
    mem = unfused + sum(roofline.memory_seconds(gpu, b, 0, access) for access, b in nbytes.items())
    return ListTime(g, at, mem, timed * launch, fl, n)


def op_seconds(gpu: GPU, ops: list[Op]) -> list[float]:
    """time_ops(gpu, [op]).seconds of each of `ops`, to the bit, without a ListTime and a dict per op (host_queue's
    kernel-by-kernel stream times every op of a MoE layer's lists alone)."""
    kn = roofline.kernels_for(gpu)
    launch = kn.launch_seconds
    out = []
    for op in ops:
        if op.kind == "gemm" or op.kind == "attention":
            g, at, unfused, _, timed, _ = _op_terms(gpu, kn, launch, op)
            out.append(g + at + unfused + timed * launch)
        else:  # (time_ops' memory term of one op: its bytes at its access class's bandwidth)
            out.append(roofline.memory_seconds(gpu, op.nbytes, 0, op.access) + op.kernels * launch)
    return out


@dataclass(frozen=True)
class StageCompute:
    """One micro-batch on the slowest stage."""

    forward: ListTime
    backward: ListTime
    recompute: ListTime
    attention_forward: float  # seconds of one layer's attention core forward (ring attention overlaps it)
    sync_stall: float = 0.0  # seconds the GPU idles in the forward between the host's syncs (host_queue.py)
    combined_stall: float = 0.0  # the same with another micro-batch's backward in each stretch (combined 1F1B)
    # the compute beside each of the four EP exchanges of the stage's MoE layers under combined 1F1B (summed over them:
    # host_queue.combined_phases); () otherwise
    combined_phases: tuple[float, ...] = ()

    @property
    def total(self) -> ListTime:
        return self.forward + self.backward + self.recompute


def _lists(spec: ModelSpec, setup: Setup, sh: Shape, moe: bool, linear: bool = False, block: str = ""):
    """One layer's forward, backward and recompute op lists."""
    fwd, bwd, eager = _layer_lists(spec, setup, sh, moe, linear, block)
    return fwd, bwd, recomputed(spec, setup, eager)


def _layer_lists(spec: ModelSpec, setup: Setup, sh: Shape, moe: bool, linear: bool = False, block: str = ""):
    """One layer's forward and backward op lists (neither reads the recompute policy: recomputed does), and the
    eager forward the recompute re-runs (the forward itself unless Megatron graphs parts of it)."""
    fwd = layer_forward(spec, sh, moe, linear, block)
    if setup.lora_rank:  # frozen base, adapters, DoRA's norm, QLoRA's dequantisation (lora_ops.py)
        fwd = lora_ops.layer_forward(spec, setup, sh, fwd)
    dequant = lora_ops.dequant_backward(setup, sh, fwd) if setup.lora_rank else []
    # torchao's recipes: high-precision GEMMs of the backward, the operands' casts (torchao_recipes.py)
    bwd = backward_gemms(backward(fwd), sh) + grad_accumulations(spec, sh, linear, block) + backward_extra(fwd, sh) \
        + dequant
    if getattr(setup, "cuda_graph_scope", None):  # Megatron's TE CUDA graphs of parts of the layer (ops/cuda_graphs.py)
        graphed, bwd = graphed_lists(fwd, bwd, parse_cuda_graph_scope(setup.cuda_graph_scope), moe)
        return graphed, bwd, fwd
    return fwd, bwd, fwd


_LAYERS = memo.table()


def _prepared(sh: Shape):
    """What the op lists go through before they are timed: inductor's fusion under --compile (ops.compiled)."""
    return compiled if sh.compile else (lambda ops: ops)


def _timed_layer(spec: ModelSpec, setup: Setup, gpu: GPU, sh: Shape, moe: bool, linear: bool, block: str):
    """(forward list, its time, the backward's time, the attention core's forward seconds, the forward's stall
    between the dispatcher's syncs, the same under combined 1F1B, the compute beside each of its EP exchanges there
    (host_queue.combined_phases), the eager forward the recompute re-runs) of one layer of a kind: memoised on what
    the lists read — the layer's Shape (micro-batch, sequence, tp, sp, cp, ep, dtypes, kernels, recipe:
    ops/shape.py), the kind, the combined 1F1B schedule, Megatron's CUDA graph scope, and with LoRA the setup's
    adapters (the setup itself) — so one entry serves every recompute policy (only stage_compute's recompute list
    reads it), ZeRO stage, dp and pipeline layout of a shape."""
    if not moe:  # (a dense layer's lists read no MoE field: ops/shape.py without_moe)
        sh = without_moe(sh)
    key = ("layer", spec, gpu, sh, moe, linear, block, combined_1f1b(setup), getattr(setup, "cuda_graph_scope", None),
           op_list_setup(setup, recompute=True) if setup.lora_rank else None)
    return memo.remember(_LAYERS, key, lambda: _time_layer(spec, setup, gpu, sh, moe, linear, block))


def _time_layer(spec: ModelSpec, setup: Setup, gpu: GPU, sh: Shape, moe: bool, linear: bool, block: str):
    """_timed_layer's tuple, computed."""
    prep = _prepared(sh)
    fwd, bwd, eager = _layer_lists(spec, setup, sh, moe, linear, block)
    tf, tb = time_ops(gpu, prep(fwd)), time_ops(gpu, prep(bwd))
    attn = time_ops(gpu, [o for o in fwd if o.kind == "attention"]).seconds
    stall = both = 0.0
    phases = ()
    if moe and not sh.compile and waits(fwd):  # the forward's stretches between the host's syncs
        fs, h = op_seconds(gpu, fwd), roofline.host_seconds_per_kernel()
        stall = sync_stall(fwd, fs, h)
        if combined_1f1b(setup) and has_sync(fwd):
            bs = op_seconds(gpu, bwd)
            both = combined_stall(fwd, fs, bwd, bs, h)
            phases = combined_phases(fwd, fs, bwd, bs)
    return fwd, tf, tb, attn, stall, both, phases, eager


def _timed_ends(spec: ModelSpec, setup: Setup, gpu: GPU, sh: Shape) -> tuple[ListTime, ListTime, ListTime, ListTime]:
    """(embedding forward, its backward, head and loss forward, their backward) of one micro-batch: memoised as
    _timed_layer is, on what they read (the Shape without the MoE block's fields, which only that block reads:
    ops/shape.py MOE_ONLY; a head tied on the embedding's stage, LoRA's frozen weights, the loss), so the expert
    layouts of one shape share them."""
    sh = without_moe(sh)
    key = ("ends", spec, gpu, sh, setup.pp == 1, setup.lora_rank, getattr(setup, "loss", "full"),
           metric_passes(setup))
    return memo.remember(_LAYERS, key, lambda: _time_ends(spec, setup, gpu, sh))


def _time_ends(spec: ModelSpec, setup: Setup, gpu: GPU, sh: Shape) -> tuple[ListTime, ListTime, ListTime, ListTime]:
    """_timed_ends' tuple, computed."""
    prep = _prepared(sh)
    ef = embedding_forward(spec, sh)
    # a tied LM head on the same stage sends the table a second gradient (ops.embedding_backward `tied`)
    tied = spec.tied_embeddings and setup.pp == 1
    emb_f, emb_b = time_ops(gpu, prep(ef)), time_ops(gpu, prep(backward(ef)) + embedding_backward(spec, sh, tied))
    if setup.lora_rank:  # frozen embedding: no gradient scatter
        emb_b = ListTime()
    if getattr(setup, "loss", "full") == "fused-linear":  # Liger's head + loss replaces the LM head and loss
        norm = norm_ops(spec, "final_norm", sh.norm_tokens, sh, "final") if spec.final_norm else []
        flce_f, flce_b = fused_linear_loss(spec, sh, trains_head=not setup.lora_rank)
        head_f, head_b = time_ops(gpu, prep(norm) + flce_f), time_ops(gpu, prep(backward(norm)) + flce_b)
    else:
        hf = head_forward(spec, sh)
        if setup.lora_rank:  # a frozen LM head: no weight gradient
            hf = lora_ops.frozen(hf)
        head_f, head_b = time_ops(gpu, prep(hf)), time_ops(gpu, prep(backward(hf) + head_backward_extra(spec, sh)))
        if metric_passes(setup) and layout(spec).kind not in CLASSIFIERS:  # the loop's train metrics (no grad)
            x = sh.tokens * spec.vocab / sh.tp
            head_f = head_f + time_ops(gpu, prep(metric_losses(sh.tokens, x, sh, metric_passes(setup))))
    return emb_f, emb_b, head_f, head_b


def metric_passes(setup: Setup) -> int:
    """The cross-entropy passes the stack's loop runs over each micro-batch's logits for its train metrics ([loss]
    metric_passes: Composer's, stacks/hf.toml [releases."2024-01-llm-foundry"]); 0 for none."""
    return int(setup.stack_facts.facts.get("loss", {}).get("metric_passes", 0)) if setup.mode == "train" else 0


def layer_kinds(spec: ModelSpec) -> list[tuple[float, bool, bool, str]]:
    """(share of the layers, sparse MLP, Gated DeltaNet mixer, hybrid block kind) of each kind of layer. NB: the two
    splits are taken as independent (Qwen3-Next's every layer is an MoE one, so its shares are exact). A hybrid
    stack (spec.hybrid: Nemotron-H) has its Mamba, attention and MLP blocks in their proportion (exact over the
    model; NB: per pipeline stage, averaged)."""
    if spec.hybrid is not None:
        hb = spec.hybrid
        return [(n / spec.layers, False, False, kind) for n, kind in (
            (hb.mamba_layers, "mamba"), (hb.attention_layers, "attention"), (hb.mlp_layers, "mlp")) if n]
    frac_moe = spec.moe_share
    frac_linear = linear_layers(spec) / spec.layers
    return [(wm * wl, moe, linear, "") for wm, moe in ((1.0 - frac_moe, False), (frac_moe, True))
            for wl, linear in ((1.0 - frac_linear, False), (frac_linear, True)) if wm * wl > 0]


def stage_compute(spec: ModelSpec, setup: Setup, gpu: GPU, st: StateBytes, pc: ParamCounts,
                  layers: tuple[int, int, int]) -> StageCompute:
    """Forward, backward and recompute time of one micro-batch on the slowest of the (first, middle, last) stages."""
    if spec.encdec is not None:  # two stacks, their own lists (encoder_decoder_time.py)
        from .encoder_decoder_time import stage_compute as encdec_stage_compute
        return encdec_stage_compute(spec, setup, gpu, st)
    sh, layer, sixteen = memo.remember(_LISTS, (spec, op_list_setup(setup, recompute=True), gpu, st),
                               lambda: _stage_lists(spec, setup, gpu, st, pc))
    prep = _prepared(sh)
    lf, lb, attn, stall, both, phases, reruns = layer
    lr = _rerun_time(spec, setup, gpu, prep, reruns)
    # Transformer Engine's --bf16-first/last-layers: those layers' lists without the recipe (te_recipes.py)
    bf16_first, bf16_last = (setup.bf16_first_layers, setup.bf16_last_layers) if sh.te else (0, 0)
    lf16, lb16, lr16 = (sixteen[0], sixteen[1], _rerun_time(spec, setup, gpu, prep, sixteen[-1])) \
        if bf16_first or bf16_last else (lf, lb, lr)
    # Llama 3.2 Vision's cross-attention layers, their share of the layers (NB: `attn` stays the self-attention's)
    from .tower_time import cross_layer_times, cross_share
    share = cross_share(spec)
    if share:
        cf, cb, cr = cross_layer_times(spec, setup, gpu, sh, prep)
        lf, lb, lr = (1 - share) * lf + share * cf, (1 - share) * lb + share * cb, (1 - share) * lr + share * cr
    emb_f, emb_b, head_f, head_b = _timed_ends(spec, setup, gpu, sh)
    first, middle, last = layers
    zero = ListTime()
    # multi-token prediction (mtp.py): its decoder layers where they are built (as the stage's average layer, NB),
    # and the LM head and loss once more per MTP layer on the last stage (gpt_model.py:611-660)
    from .mtp import mtp_layers, stage_mtp
    n_mtp, at = mtp_layers(spec, setup), stage_mtp(spec, setup)
    head_f, head_b = head_f + n_mtp * head_f, head_b + n_mtp * head_b
    from .tower_time import tower_times  # a VLM's image encoder runs on the first stage (tower_time.py)
    tower_f, tower_b, tower_r = tower_times(spec, setup, gpu, sh)
    emb_f, emb_b = emb_f + tower_f, emb_b + tower_b
    if setup.pp == 1:
        stages = [(first, bf16_first + bf16_last, emb_f + head_f, emb_b + head_b, tower_r)]
    else:
        stages = [(first, bf16_first, emb_f, emb_b, tower_r), (middle, 0, zero, zero, zero),
                  (last, bf16_last, head_f, head_b, zero)]
    stages = [(n + m, *rest) for (n, *rest), m in zip(stages, at)]
    best = None
    for n, b16, extra_f, extra_b, extra_r in stages:
        b16 = min(b16, n)
        rec = checkpointed_layers(setup, n) / max(n, 1)  # NB: the bf16 layers' share of the re-run, as of the layers
        cand = StageCompute((n - b16) * lf + b16 * lf16 + extra_f, (n - b16) * lb + b16 * lb16 + extra_b,
                            rec * ((n - b16) * lr + b16 * lr16) + extra_r, attn,
                            n * stall, n * both,  # NB: the bf16 layers' stretches as the quantised ones'
                            tuple(n * p for p in phases))
        if best is None or cand.total.seconds > best.total.seconds:
            best = cand
    return best


_LISTS = memo.table()  # _stage_lists' memo: the layers' lists of a setup, whatever its recompute policy


def _stage_lists(spec: ModelSpec, setup: Setup, gpu: GPU, st: StateBytes, pc: ParamCounts):
    """(the Shape, _layer_times of it, _layer_times without TE's recipe where --bf16-first/last-layers run some
    layers outside it, else None): what stage_compute's layers run but their recompute, which neither reads (the
    Shape: ops/shape.py; the layers' lists: _timed_layer), memoised by stage_compute on the setup with the recompute
    policy fixed (op_list_setup(recompute=True)) — one entry for every policy and module set of a layout."""
    sh = shape_of(spec, setup, st, compute_dtype(setup))
    bf16 = bool(setup.bf16_first_layers or setup.bf16_last_layers) if sh.te else False
    # memoised again on what the layers' lists read (_layer_times_key), which the layouts of one Shape share: they
    # differ in the pipeline (pp, its split, vpp), which the Shape and the lists never read
    key = ("lists", spec, gpu, sh, bf16, _layer_times_key(spec, setup, sh))
    return sh, *memo.remember(_SHAPED, key, lambda: (_layer_times(spec, setup, gpu, pc, sh), _layer_times(
        spec, setup, gpu, pc, replace(sh, te="")) if bf16 else None))


_SHAPED = memo.table()  # _stage_lists' layers' times, keyed on the Shape and _layer_times_key


def _layer_times_key(spec: ModelSpec, setup: Setup, sh: Shape) -> tuple:
    """What _layer_times reads of the setup beyond the Shape `sh`: its layers' own key (_timed_layer: the combined
    1F1B schedule, Megatron's CUDA graph scope, LoRA's adapters), torchao's bf16 layers (torchao_recipes.layer_shapes)
    and the windowed layers' share (windowed.split); the layer kinds read the spec alone (layer_kinds)."""
    return (combined_1f1b(setup), getattr(setup, "cuda_graph_scope", None),
            op_list_setup(setup, recompute=True) if setup.lora_rank else None,
            bf16_layers(setup, spec.layers) if sh.float8 else 0, windowed.windowed_share(spec, setup))


def _layer_times(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, sh: Shape):
    """(forward, backward, attention core forward, sync stall, combined stall, combined phases, and per layer kind
    (its weight, forward list, forward time, the eager forward its recompute re-runs)) of the stage's average layer:
    every layer kind's lists in their proportion, under torchao's recipe its converted and its --bf16-*-layers
    layers, and its sliding-window layers where the stack skips the blocks outside the window (windowed.split).
    The recompute's time: _rerun_time of the kinds."""
    lf = lb = ListTime()
    attn = stall = both = 0.0
    phases = ()
    reruns = []
    for (w, moe, linear, block), (q, lsh) in product(layer_kinds(spec),
                                                     windowed.split(spec, setup, layer_shapes(spec, setup, sh))):
        w *= q
        fwd, tf, tb, a, s1, s2, ph, eager = _timed_layer(spec, setup, gpu, lsh, moe, linear, block)
        reruns.append((w, fwd, tf, eager))
        lf, lb = lf + w * tf, lb + w * tb
        attn += w * a
        stall += w * s1
        both += w * s2
        if ph:
            phases = tuple(p + w * x for p, x in zip(phases or (0.0,) * 4, ph))
    return lf, lb, attn, stall, both, phases, tuple(reruns)


def _rerun_time(spec: ModelSpec, setup: Setup, gpu: GPU, prep, reruns: tuple) -> ListTime:
    """The average layer's recompute under the setup's policy: what each kind's checkpointed layer re-runs
    (ops.recomputed), in the kinds' proportion (_layer_times' order)."""
    lr = ListTime()
    for w, fwd, tf, eager in reruns:
        rec = recomputed(spec, setup, eager)
        tr = tf if len(rec) == len(fwd) else time_ops(gpu, prep(rec))  # (full-layer policies re-run all of it)
        lr = lr + w * tr
    return lr


def pipeline_free(spec: ModelSpec, setup: Setup) -> Setup | None:
    """`setup` as a memo key for what one layer and the model's ends cost whatever the pipeline (layer_times), with
    the settings the op lists never read fixed (op_list_setup, the recompute policy among them) and the pipeline's
    (--pp, its split, --vpp, the accumulation) but whether there is one (a head tied on the embedding's stage:
    _timed_ends); the accumulation reaches the lists only through combined_1f1b (> 1), which the layers' forward
    and backward times do not read (their stalls and phases do), and Transformer Engine's weight casts, once per
    step (ops/shape.py te_weight_share), under which it is kept. None where a stage's time is not its layers × the
    average layer, its ends and terms >= 0 (MTP's layers, a VLM's tower, the recompute): an encoder-decoder, Llama
    3.2 Vision's cross-attention layers, Transformer Engine's bf16 first/last layers, LoRA's adapters (whose lists
    are keyed on the whole setup: _layer_times_key). Never run."""
    from .tower_time import cross_share  # (as stage_compute imports it)
    if (spec.encdec is not None or setup.lora_rank or setup.bf16_first_layers or setup.bf16_last_layers
            or cross_share(spec)):
        return None
    # (the accumulation stays where Transformer Engine casts the weights once per step: Shape.te_weight_share)
    accum = setup.grad_accum if runs_te(setup) else 1
    return op_list_setup(setup, recompute=True).keyed(
        (("pp", min(setup.pp, 2)), ("pp_split", "even"), ("vpp", 1), ("grad_accum", accum)))


def layer_times(spec: ModelSpec, key: Setup, gpu: GPU, st: StateBytes, pc: ParamCounts) -> tuple:
    """(the average layer's forward + backward, the embedding's forward + backward, the LM head and loss's, the
    average layer's re-run under a policy that re-runs its whole forward: ops.WHOLE_LAYER's) ListTimes of a
    pipeline_free key: the lf + lb stage_compute multiplies by each stage's layers (_stage_lists), its ends
    (_timed_ends), and the re-run it multiplies by each stage's checkpointed layers under those policies
    (_rerun_time)."""
    sh, (lf, lb, *_, reruns), _ = _stage_lists(spec, key, gpu, st, pc)
    emb_f, emb_b, head_f, head_b = _timed_ends(spec, key, gpu, sh)
    whole = _rerun_time(spec, key.keyed((("recompute", "full"),)), gpu, _prepared(sh), reruns)
    return lf + lb, emb_f + emb_b, head_f + head_b, whole


_CACHE = memo.table()
# Settings the op lists never read beyond what `st` (the state bytes, part of the key) already says: the data-parallel
# degree and the ZeRO stage only reach stage_compute through state_bytes (precision.fsdp2_mixed_precision, which sets
# st.param / st.reduce) and the attention kernel's choice (activations.resolved_kernel: st.act, the precision's).
# Megatron's --overlap-param-gather schedules the distributed optimizer's gathers (parallel/zero.py dp_comm) and
# nothing else. The MoE token dispatcher (and its SMs) moves the tokens between ranks: its exchanges are step_time's
# (parallel/expert.py ep_comm_seconds, exposed_ep_seconds), never an op of the lists. Keyed at fixed values, so the
# planner's ZeRO stages and dispatchers of one layout share their lists' times (tests/analytic/
# test_stage_compute_key.py runs stage_compute itself at every value of them).
NOT_IN_OP_LISTS = (("dp", 1), ("zero", 0), ("overlap_param_gather", False), ("moe_dispatcher", None),
                   ("moe_dispatcher_sms", None))
# --vpp: the op lists are one micro-batch's through the stage's layers, whatever chunks interleave them; it is read
# only by block:N's count of the checkpointed layers (ops/derived.py checkpointed_layers), so it is keyed at 1 under
# every other policy (Megatron's layouts that differ only in --vpp share their lists' times).


def op_list_setup(setup: Setup, recompute: bool = False) -> Setup:
    """`setup` with the settings the op lists never read (NOT_IN_OP_LISTS) at fixed values: the memo's key. With
    `recompute`, the policy too (--recompute none): the key of what the policy does not change (a layer's forward
    and backward lists)."""
    fixed = NOT_IN_OP_LISTS + ((("recompute", "none"), ("recompute_modules", None)) if recompute else ()) + \
        ((("vpp", 1),) if setup.recompute_policy != "block" else ())
    return setup.keyed(fixed)


def clear_memos() -> None:
    """Forget every memoised op-list time (stage_compute's, a layer's and the ends' lists', the GEMMs'): after a change
    to the kernel data, or to time a search from a cold start."""
    memo.clear()  # (stage_compute's, the lists', the GEMMs', Links.of's, tp_overlap's, the memory terms')


def cached_stage_compute(spec: ModelSpec, setup: Setup, gpu: GPU, st: StateBytes, pc: ParamCounts,
                         layers: tuple[int, int, int]) -> StageCompute:
    """stage_compute, memoised on its inputs (`pc` is the spec's own count): the planner's inner loop and repeated
    estimates re-use the lists' times. The spec's equality covers every model fact the op lists read (its fields:
    the formulas never read the raw config) and the setup's every setting but NOT_IN_OP_LISTS, so no input is left
    out of the key."""
    key = (spec, op_list_setup(setup), gpu, st, layers)
    return memo.remember(_CACHE, key, lambda: stage_compute(spec, setup, gpu, st, pc, layers))


# torch/optim/adam.py _multi_tensor_adam with capturable off (torch 2.13's lines): each op one multi_tensor_apply
# pass — (op, list depth, a scalar per tensor, bytes per element read + written as multiples of (param, one Adam
# state, grad)). 4p + 12s + 2g over the eight.
FOREACH_ADAM = (
    ("mul_", 1, False, (2, 0, 0)),  # :691 decoupled weight decay: param *= 1 - lr * wd
    ("lerp_", 2, False, (0, 2, 1)),  # :704 exp_avg toward grad
    ("mul_", 1, False, (0, 2, 0)),  # :708 exp_avg_sq *= beta2
    ("addcmul_", 3, False, (0, 2, 1)),  # :721 exp_avg_sq += (1 - beta2) grad * grad (NB: grad's second read cached)
    ("sqrt", 2, False, (0, 2, 0)),  # :790 into a new state-sized tensor
    ("div_", 1, True, (0, 2, 0)),  # :792 by each tensor's bias_correction2_sqrt
    ("add_", 1, False, (0, 2, 0)),  # :793 + eps
    ("addcdiv_", 3, True, (2, 2, 0)),  # :794 param += step_size * exp_avg / denom
)
def optimizer_seconds(gpu: GPU, setup: Setup, st: StateBytes, shard: float, tensors: int,
                      grads: float | None = None, sizes: tuple[int, ...] | None = None) -> tuple[float, float]:
    """(kernel seconds, launch seconds) of optimizer.step() over this rank's `shard` parameters in `tensors`
    tensors (`sizes`: each tensor's elements where known, in the optimizer's order, else `tensors` equal ones;
    `grads`: the parameters whose gradients the rank holds and clips, default `shard`; ZeRO-1 keeps them all), per
    kernel (Setup.optimizer_kernel):
      fused     one pass: read weight (or fp32 master), gradient and states, write weight/master and states
                (torch/optim/adam.py _fused_adam: aten._fused_adamw_, one depth-4 multi_tensor_apply pass); with a
                master, the update writes the fp32 master and one cast writes the 16-bit weight; the _foreach_add_ of
                the per-tensor step counts before it (adam.py:876) counts its launches (step_count_launches), its
                ~1.5 us kernels' time left to the launch term;
      foreach   torch/optim/adam.py _multi_tensor_adam (capturable off): FOREACH_ADAM's 8 passes (its step counts
                stay on the CPU, adam.py:681-684); other optimizers one fused-like pass per state (NB);
      for-loop  torch/optim/adam.py _single_tensor_adam: the same 8 ops per tensor, one launch each;
      torchao   --optimizer adamw-torchao-*: one compiled kernel per parameter over the quantised states
                (analytic/torchao_optim.py step_bytes, KERNELS_PER_PARAM);
    after the gradient clipping the setup's stack runs (grad_clip.clip_work: its passes and launches). The gradients
    the update reads, and any copy that makes them, are the stack's (StackModel.stepped_grad_bytes: Megatron's fp32
    main grads, a .float() copy of a 16-bit grad buffer). Each
    multi_tensor_apply pass is timed launch by launch (analytic/multi_tensor.py): its bytes at the streaming
    bandwidth, or the latency floor of a launch with few chunks (LoRA's adapters: 224 tensors of under 2 chunks
    each on llama-3.2-1b)."""
    w, mast, o = st.weight, st.master, st.optimizer
    # the gradients the update reads and the copy that makes them, as the stack steps (StackModel.stepped_grad_bytes)
    g, grad_copy = model_for(setup).stepped_grad_bytes(setup, st)
    p = mast or w  # the tensor the update reads and writes: the fp32 master when there is one
    kernel = setup.optimizer_kernel
    casts = master_cast_seconds(gpu, setup, st, shard)
    # the master's casts: in the pass (flat buffers) or apart, where the update then reads fp32 gradient copies
    g, cast_bytes = (mast, 0) if casts else (g, (mast + w) if mast else 0)
    # multi_tensor_apply kernels load kILP = 4 elements per thread per access (aten/src/ATen/native/cuda/
    # ForeachFunctors.cuh, fused_adam_utils.cuh): 16-byte accesses on fp32 weights, 8-byte on 16-bit ones, which
    # keep half the bytes in flight (kernels.toml access mta32 / mta16); foreach's kernels, a multiply or add per
    # element between their loads and stores, keep more in flight than the fused kernel's Adam arithmetic
    # (foreach32 / foreach16). NB: the for-loop path's per-tensor kernels are TensorIterator's vectorised ones,
    # timed as mta too
    wide = p >= 4
    access = "mta32" if wide else "mta16"
    adam = setup.optimizer in ("adam", "adamw")
    if torchao_optim.torchao_optimizer(setup):  # one compiled kernel per parameter over the quantised states
        seconds = roofline.memory_seconds(gpu, shard * (torchao_optim.step_bytes(setup, p, g) + cast_bytes), 0, access)
        launches = torchao_optim.KERNELS_PER_PARAM * tensors
    elif kernel == "for-loop":  # a kernel per op per tensor (TensorIterator's), each the op's bytes
        nbytes = (4 * p + 6 * o + 2 * g) if adam else (2 * p + g + 2 * o)
        seconds = roofline.memory_seconds(gpu, shard * (nbytes + cast_bytes), 0, access)
        launches = (len(FOREACH_ADAM) if adam else 1) * tensors
    else:
        foreach = kernel == "foreach" and adam
        seconds, launches = _step_passes(gpu, multi_tensor.runs_of(shard, tensors, sizes), (p, o, g), cast_bytes,
                                         ("foreach32" if wide else "foreach16") if foreach else access, foreach)
    # fp32 masters: over torch.optim, trainfit's step casts each gradient up and copies each master back, per tensor
    # (step/standard.py MasterWeightOptimizer.step); the other stacks keep flat master buffers (NB: one launch)
    launches += (2 * tensors if model_for(setup).torch_optimizer else 1) if mast else 0
    launches += tensors if grad_copy else 0
    # a 16-bit buffer's up-cast copy, per tensor: TensorIterator's dynamic-cast loop, as master_cast_seconds' up-cast
    seconds += casts + roofline.memory_seconds(gpu, shard * grad_copy, 0, "upcast")
    # the clip first, as the stack runs it (grad_clip.clip_work), on the model's own gradients (st.grad: a master's
    # fp32 copies are made after it); a clip reads them all below ZeRO-2
    clip = clip_work(setup, st, shard if grads is None else grads, tensors, sizes=sizes)
    seconds, launches = seconds + pass_seconds(gpu, clip), launches + clip.kernels
    return seconds, (launches + step_count_launches(setup, tensors)) * roofline.kernels_for(gpu).launch_seconds


def _step_passes(gpu: GPU, runs, pog: tuple[float, float, float], cast_bytes: float, access: str,
                 foreach: bool) -> tuple[float, int]:
    """(seconds, launches) of the step's multi_tensor_apply passes over `runs` (multi_tensor.runs_of), with
    (param, all states, grad) bytes per element and a master's cast bytes where the pass writes them: foreach Adam
    FOREACH_ADAM's eight (the cast after the last, which writes the parameter); otherwise one depth-4 pass reading
    and writing param and states and reading grad (fused_adam_impl.cu: params, grads, exp_avgs, exp_avg_sqs;
    NB: every non-Adam optimizer as one such pass)."""
    p, o, g = pog
    if not foreach:
        return multi_tensor.pass_seconds(gpu, runs, 4, 2 * p + g + 2 * o + cast_bytes, access)
    seconds, launches = 0.0, 0
    for i, (_, depth, scalar_list, (np_, ns, ng)) in enumerate(FOREACH_ADAM):
        bpe = np_ * p + ns * o / 2 + ng * g + (cast_bytes if i == len(FOREACH_ADAM) - 1 else 0)
        t, n = multi_tensor.pass_seconds(gpu, runs, depth, bpe, access, scalar_list)
        seconds, launches = seconds + t, launches + n
    return seconds, launches


def step_count_launches(setup: Setup, tensors: int) -> int:
    """The fused Adam(W) keeps each parameter's step count on the GPU (torch/optim/adam.py: state["step"] on
    p.device when fused) and increments them before the update (_fused_adam `torch._foreach_add_(device_state_steps,
    1)`): a one-list foreach op, a launch per multi_tensor.tensor_limit(1) tensors (the H200 profiles: 2 for 146-201
    tensors). The foreach and for-loop paths keep the counts on the CPU (no kernel)."""
    if setup.optimizer_kernel != "fused" or setup.optimizer not in ("adam", "adamw") \
            or not model_for(setup).torch_optimizer:  # DeepSpeed's engine and Megatron: their own kernels
        return 0
    return -(-tensors // multi_tensor.tensor_limit(1))


def master_cast_seconds(gpu: GPU, setup: Setup, st: StateBytes, shard: float, tensors: int = 0) -> float:
    """Seconds of the fp32 master's casts where they are their own kernels: over torch.optim (the hf stack) trainfit's
    step casts each 16-bit
    gradient up into an fp32 copy and, after the update, each master down into its weight, per tensor (step/
    standard.py MasterWeightOptimizer.step). TensorIterator runs the up-cast as its unvectorised dynamic-cast loop and
    the down-cast vectorised (kernels.toml access upcast / vector; the H200 profile: direct_copy_kernel_cuda 3.9 ms
    and bfloat16_copy_kernel_cuda 1.9 ms over 1.24 B parameters). 0 where there is no master, or where the stack
    casts flat buffers inside its optimizer pass (optimizer_seconds keeps those bytes in the pass). With `tensors`,
    their two launches per tensor too (which optimizer_seconds counts among its launches)."""
    if not st.master or not model_for(setup).torch_optimizer:
        return 0.0
    return (roofline.memory_seconds(gpu, shard * (st.grad + st.master), tensors, "upcast")
            + roofline.memory_seconds(gpu, shard * (st.master + st.weight), tensors, "vector"))


def tensors_per_rank(spec: ModelSpec, layers: int, embedding: bool, head: bool) -> int:
    """Parameter tensors of a stage (each a separate optimizer operand): per layer its linear weights and biases and
    its norms' weights (+ biases); the embedding and the final norm and head. MoE: the router and the experts'
    two stacked 3-D weights (transformers 5 gate_up_proj / down_proj). NB: fused qkv / gate_up counted as
    separate tensors (launch counts only: over-reads by a few launches per layer)."""
    lin = 4 + ((3 if spec.gated_mlp else 2) if spec.moe is None else 3)
    biases = (3 if spec.qkv_bias else 0) + int(spec.out_bias) + (3 if spec.mlp_bias else 0)
    norms = spec.norms_per_layer * (2 if spec.norm_bias and spec.norm != "rmsnorm" else 1)
    n = layers * (lin + biases + norms)
    if embedding:
        n += 1 + (spec.positions == "learned")
    if head:
        n += 2 + int(spec.lm_head_bias)
    return n
