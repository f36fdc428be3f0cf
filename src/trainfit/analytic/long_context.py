"""Long-sequence training on an HF model under DeepSpeed, as ArcticTraining's ALST recipes run it (Bekman et al.
2025, arXiv 2506.13996; snowflakedb/ArcticTraining b28638e, DeepSpeed 0.19.8 runtime/sequence_parallel/
ulysses_sp.py): DeepSpeed-Ulysses sequence parallelism (--ulysses), the tiled MLP (--tiled-mlp), the tiled loss
(--loss tiled) and the checkpointed inputs in host memory (--offload activations on --stack deepspeed).

Ulysses: each rank of a group of N holds seq / N tokens of the sequence everywhere but inside the attention core,
where an all-to-all trades the sequence split for a head split (UlyssesSPAttentionHF._combine_local_sequences,
ulysses_sp.py:168-206: q, k and v; _partition_global_sequence, :208-229: the output). A rank then attends its
heads / N over the whole sequence: the attention's FLOPs and saved q, k, v, output and log-sum-exp equal those of
seq / N queries of every head against seq keys, which is how the ops (ops/attention.py: queries seq / cp) and
the per-token activation terms (activations.py, at rank_tokens) price it. The all-to-alls are autograd functions
on the compute stream (deepspeed/sequence/layer.py:327-360 _dim_zero_all_to_all, its backward the reverse
exchange): exposed, 4 each way per layer. NB: the exchanges are timed at the links' bandwidth with no per-call
latency (as parallel/expert.py's all-to-all): optimistic for short slices.

The tiled loss runs the same GEMMs and loss kernels as the full loss (each slice's backward inside the forward, none
after): timed as the full loss. NB: its per-slice launches are not counted.
"""
from __future__ import annotations

import math

from ..setup import Setup
from ..spec import ModelSpec
from .parallel.collectives import Links, ranks_per_node

GiB = 2**30
# ArcticTraining sft_trainer.py:106-117: "parameterize to about 1GB fp32 logits shards"
LOSS_SHARD_BYTES = 1 * GiB


def sp_degree(setup: Setup) -> int:
    """The ranks that share each sequence: --cp (ring attention) times --ulysses (one of them is 1)."""
    return setup.cp * getattr(setup, "ulysses", 1)


def rank_tokens(setup: Setup) -> float:
    """Tokens of one micro-batch on one rank outside the attention core."""
    return setup.batch * setup.seq / sp_degree(setup)


def local_kv_heads(spec: ModelSpec, n: int) -> float:
    """KV heads a rank attends with after the all-to-all: kv_heads / N, or 1 where N > kv_heads: each kv head is
    repeated N / kv_heads times before the exchange (ulysses_sp.py:134-139, :181-182)."""
    return spec.kv_heads / n if n <= spec.kv_heads else 1.0


def a2a_bytes(spec: ModelSpec, setup: Setup, act_bytes: float) -> tuple[float, float]:
    """(q, k + v + output): the local bytes of one layer's four all-to-alls each way on a rank, before the exchange
    (seq / N tokens of every head; k and v after the repeat where N > kv_heads)."""
    n = setup.ulysses
    tokens = setup.batch * setup.seq / n
    d = spec.head_dim
    kv_local = local_kv_heads(spec, n) * n * d  # heads of k (and v) a rank sends, all seq / N tokens
    return tokens * spec.q_dim * act_bytes, tokens * (2 * kv_local + spec.q_dim) * act_bytes


def a2a_transient(spec: ModelSpec, setup: Setup, act_bytes: float) -> float:
    """The exchange's buffers beside a layer's saved tensors at its attention: the HF attention forward holds its
    local q, k, v (seq / N tokens, every head) until the attention function returns, beside the exchanged copies the
    core saves, and each exchange goes through a contiguous copy of its input (ulysses_sp.py:190-196); the
    backward exchanges the gradients the same way. NB: one copy in flight taken at q's size (an upper bound on
    each of k, v): the allocator's timing of the frees moves it by at most one tensor."""
    if setup.ulysses <= 1:
        return 0.0
    q, rest = a2a_bytes(spec, setup, act_bytes)
    return (rest - q) + 2 * q  # local q, k, v and one contiguous copy in flight


def a2a_seconds(spec: ModelSpec, setup: Setup, links: Links, act_bytes: float, layers: int, rerun: float) -> float:
    """One micro-batch's Ulysses all-to-alls on `layers` layers: q, k, v and the output each way (forward, and the
    gradients in backward), again in the re-run forward of each recomputed layer (`rerun`: the share of layers).
    Each rank keeps 1/N of its tensor and sends 1/N to each other rank of the group, the group being N consecutive
    ranks (deepspeed/runtime/sequence_parallel/parallel_state_sp.py:51-56), inside a node where N fits."""
    n = setup.ulysses
    if n <= 1:
        return 0.0
    q, rest = a2a_bytes(spec, setup, act_bytes)
    per_node = ranks_per_node(1, n, links.gpus_per_node)
    chunk = (q + rest) / n  # to each peer, per layer and direction
    one_way = max((n - per_node) * chunk / links.inter, (per_node - 1) * chunk / links.intra)
    return layers * one_way * (2 + rerun)


def tiled_mlp_shards(spec: ModelSpec, setup: Setup) -> int:
    """The tiled MLP's slices: --tiled-mlp N, or ArcticTraining's auto, ceil(seqlen / hidden) of the rank's
    sequence (arctic_training/model/tiled_compute.py:51-56)."""
    n = getattr(setup, "tiled_mlp", None)
    if not n:
        seq = setup.seq / sp_degree(setup)
        return max(1, math.ceil(seq / spec.hidden))
    return n


def tiled_mlp_on(setup: Setup) -> bool:
    return getattr(setup, "tiled_mlp", None) is not None and setup.mode == "train"


def tiled_mlp_seconds(spec: ModelSpec, setup: Setup, tokens: float, layers: int, matmul_rate: float) -> float:
    """The tiled MLP's extra forward per micro-batch: TiledMLP's backward re-runs each slice's MLP with grad
    (ulysses_sp.py:1065-1068) after its no_grad forward, so each layer's three MLP GEMMs (2·h·i FLOPs a token each)
    run once more than without it, at `matmul_rate` (the step's achieved matmul FLOP/s). NB: the slices' GEMMs are
    taken at the whole MLP's rate (a slice of ceil(seq / hidden) shards keeps ~hidden rows: large enough)."""
    if not tiled_mlp_on(setup) or matmul_rate <= 0:
        return 0.0
    return layers * 3 * 2 * tokens * spec.hidden * spec.intermediate / setup.tp / matmul_rate


def tiled_loss_shards(spec: ModelSpec, setup: Setup) -> int:
    """--loss tiled's slices: ArcticTraining's auto, ceil(fp32 logits bytes / 1 GiB) of the rank's tokens
    (sft_trainer.py:106-117)."""
    logits = rank_tokens(setup) * spec.vocab * 4
    return max(1, math.ceil(logits / LOSS_SHARD_BYTES))


def checkpoint_offload(setup: Setup) -> bool:
    """ArcticTraining's activation_checkpoint_cpu_offload (monkey_patches.py:37-164, trainer.py:205-217): the
    stack's [activation_offload] variant "checkpoint-input" under --offload activations."""
    return setup.offload_activations and \
        setup.stack_facts.facts.get("activation_offload", {}).get("variant") == "checkpoint-input"


def rerun_output(spec: ModelSpec, setup: Setup, residual_bytes: int, tokens: float) -> float:
    """Bytes beside every backward moment of a layer under ArcticTraining's checkpoint offload: its
    CheckpointFunctionWithCPUOffload is the reentrant checkpoint (it replaces torch.utils.checkpoint.
    CheckpointFunction), whose backward re-runs the layer into `outputs` (monkey_patches.py:142 at b28638e) and holds
    them through `torch.autograd.backward(outputs_with_grad, args_with_grad)` (:156): the layer's output, in the
    residual stream's dtype, live through its whole backward. (The non-reentrant checkpoint the hf stack runs drops
    the re-run forward's output: backward.py's recompute moment.)
    NB: ArcticTraining's recipes without checkpoint offload run transformers 4.x's reentrant default too
    (pyproject.toml:69): not counted there (an under-count by this term where a layer's backward sets the peak)."""
    if not checkpoint_offload(setup):
        return 0.0
    return residual_bytes * spec.hidden * tokens / (setup.tp if setup.sequence_parallel else 1)
