"""Tensor (and sequence) parallelism: which parameters and activations one TP rank holds.

Megatron's TP (Shoeybi et al. 2019, "Megatron-LM", §3, Fig. 3): q/k/v and the MLP's first matrices are split by
columns, the attention output and the MLP's second matrix by rows, the vocabulary of the embedding and LM head
across ranks; norms are replicated. Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation",
eq. 2-4): the attention and MLP interiors are split t ways (eq. 2, the 24/t and 5as/(ht) terms); the norms',
dropouts' and linear inputs' activations are replicated unless sequence parallelism splits them too (eq. 4).
Communication (Shoeybi et al. 2019 §3, Fig. 4): 2 all-reduces of b·s·h activations per layer in the forward and 2 in
the backward; full recompute repeats the forward's 2 (Korthikanti et al. 2022 §4.1). With sequence parallelism they
become all-gather + reduce-scatter pairs of the same volume (ibid. §4.2.2).
"""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from ..activations import LayerActivations
from ..families import family_traits
from ..params import ParamCounts, hybrid_layers_params
from .collectives import Links, ranks_per_node
from .expert import dense_mlp_share
from .pipeline import Stage

# LayerActivations.terms split t ways by TP alone (Korthikanti eq. 2); the rest need sequence parallelism (eq. 4)
TP_SPLIT_TERMS = ("attention", "mlp")


def rank_params(spec: ModelSpec, pc: ParamCounts, setup: Setup, stage: Stage) -> tuple[int, int]:
    """(parameters held by this rank, largest single parameter tensor) under TP and PP.
    NB: TP shards the matmul weights and the vocab; norms and row-parallel biases are replicated — we shard
    the whole attention/MLP count, under-counting by those biases (< 0.01% for LLMs)."""
    t = setup.tp
    layer_norms = pc.norms
    layer_rest = pc.attention + (pc.mlp * pc.dense_layers + pc.moe_mlp * pc.moe_layers) / spec.layers
    # Qwen3-Next: a Gated DeltaNet in place of the attention of its linear_attention layers (Qwen3NextDecoderLayer,
    # modeling_qwen3_next.py:877-880), as count_params' total counts them
    layer_rest += pc.linear_layers * (pc.linear_attention - pc.attention) / spec.layers
    if spec.hybrid is not None:
        # Mamba-2, attention and MLP blocks (ParamCounts holds one block of each kind): their mean per block
        # NB: a pipeline stage is taken to hold the mean block (stages of a pattern differ by their mix of kinds)
        layer_rest = (hybrid_layers_params(spec, pc.attention, pc.mlp, pc.norms) - spec.layers * pc.norms) / spec.layers
    n = stage.layers * (layer_norms + layer_rest / t)
    if stage.embedding:
        n += pc.embedding / t
        # a VLM's image encoder runs before the embedding's scatter of its tokens (Qwen2_5_VLModel.forward): the
        # first stage's, trained with the rest as the HF Trainer trains every parameter. NB: not split by TP (the
        # stacks run a VLM's tower on one rank)
        n += pc.vision
        n += pc.cross_extras  # NB: Mllama's cross-attention norms and gates, on the first stage (a few KB)
    if stage.head:
        n += pc.final + pc.lm_head / t
        if spec.tied_embeddings and not stage.embedding:
            n += pc.embedding / t  # Megatron keeps a copy of the tied embedding on the last stage
    return int(n), int(largest_tensor(spec) // t)


def largest_tensor(spec: ModelSpec, experts: int | None = None) -> int:
    """Elements of the model's largest parameter tensor: the embedding, an MLP matrix (Phi-3's fused gate_up_proj
    is one 2·i×h tensor), the fused qkv projection, or a MoE layer's grouped experts (transformers keeps all
    experts' gate_up_proj in one (E, 2·i, h) parameter: modeling_mixtral.py MixtralExperts). `experts`: the
    largest expert tensor where a stack lays the experts out otherwise (None: transformers' gate_up_proj)."""
    h, traits = spec.hidden, family_traits(spec)
    sizes = [spec.vocab * (spec.embed_proj_dim or h),
             (2 if traits["fused_gate_up"] else 1) * h * spec.intermediate]
    if traits["fused_qkv"]:
        sizes.append(h * (spec.q_dim + 2 * spec.kv_dim))
    if spec.moe is not None:
        sizes.append(spec.moe.num_experts * 2 * spec.moe.expert_intermediate * h if experts is None else experts)
    return max(sizes)


def term_divisors(la: LayerActivations, setup: Setup) -> dict:
    """How many ways each activation term of a layer is split across the TP group (Korthikanti eq. 2 and 4)."""
    t = setup.tp
    return {k: (t if (k in TP_SPLIT_TERMS or setup.sequence_parallel) else 1) for k in la.terms}


def layer_bytes_per_rank(la: LayerActivations, setup: Setup, tokens: int, keys: float) -> float:
    """One layer's saved bytes on one TP rank: per-token terms split per `term_divisors`, the s×s attention
    scores split by heads (t ways) and autocast's weight casts by the weight shards (t ways)."""
    t = setup.tp
    div = term_divisors(la, setup)
    per_tok = sum(v / div[k] for k, v in la.terms.items())
    return per_tok * tokens + la.per_token_key * tokens * keys / t + la.fixed / t


def tp_comm_seconds(spec: ModelSpec, setup: Setup, links: Links, tokens: float, act_bytes: float, layers: int,
                    rerun: float, gpu=None) -> float:
    """One micro-batch's tensor-parallel all-reduces on a stage of `layers` layers, `tokens` per rank, inside a node,
    on the critical path. `rerun`: the share of layers whose forward runs again in the backward (full recompute,
    per-op SAC, whose re-run forward all-reduces again: the functional all_reduce is not on torchtitan's save list;
    reduce_scatter, sequence parallelism's, is: NB counted as re-run too; layer:N's re-run layers). With
    --tp-comm-overlap (`gpu` given) what stays exposed beside the GEMMs: tp_overlap.py."""
    t = setup.tp
    if t <= 1:
        return 0.0
    x = tokens * spec.hidden * act_bytes  # one b·s·h activation
    n_ar = 4 + 2 * rerun
    from ..te_recipes import runs_te, te_gather_saving  # (te_recipes imports parallel/)

    gathers = (act_bytes, act_bytes)  # bytes per element of the forward's and the backward's all-gathers
    if getattr(setup, "low_precision", "none") == "tensorwise" and not runs_te(setup):
        # torchtitan's tensorwise Float8 TP gathers in fp8 both ways: each block input is cast before its
        # sequence-parallel all-gather (torchtitan models/llama3/infra/parallelize.py:83-86, 191-203
        # PrepareFloat8ModuleInput; torchao float8/float8_tensor_parallel.py:176-177 "the float8 cast happens before
        # the all-gather"), and the row-parallel outputs' gradients before the backward's all-gather (:138-152
        # Float8RowwiseParallel._prepare_output_fn: NoopFwToFloat8BwDynamic after the reduce-scatter, so its backward
        # cast runs first); the reduce-scatters keep act_bytes. Each all-reduce's all-gather half moves 1 byte.
        n_ar -= (2 + 2 * rerun + 2) * 0.5 * (1 - 1 / act_bytes)
        gathers = (1.0, 1.0)
    n_ar -= te_gather_saving(setup, act_bytes, rerun)
    # the MLP's collectives where a dense MLP runs them (a MoE layer's are its dispatcher's: parallel/expert.py)
    mlp = dense_mlp_share(spec, setup)
    if getattr(setup, "tp_comm_overlap", False) and gpu is not None:
        from ...low_precision import recipe
        from .tp_overlap import layer_seconds

        if runs_te(setup):  # TE's quantised forward all-gather (te_recipes.te_gather_saving)
            gathers = (recipe(setup).per_element, act_bytes)
        return layers * layer_seconds(spec, setup, gpu, links, tokens, act_bytes, gathers, rerun, mlp)
    # the tp ranks are innermost: all on one node. Sequence parallelism runs each all-reduce as an all-gather and a
    # reduce-scatter (Korthikanti et al. 2022 §4.2.2, g and g-bar), which NVLS does not speed up (tuning.cc:272).
    # n_ar counts the attention's and the MLP's collectives alike: half each.
    pairs = layers * n_ar * (1 + mlp) / 2
    node = ranks_per_node(1, t, links.gpus_per_node)  # (a group wider than a node: its rings cross the network)
    if setup.sequence_parallel:
        return pairs * (links.all_gather(t, node, x) + links.reduce_scatter(t, node, x))
    return pairs * links.allreduce(t, node, x)
