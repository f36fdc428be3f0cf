"""DeepSpeed ZeRO-3's parameter coordinator replayed over an HF causal LM's module trace: the most parameters the rank
holds gathered (all-gathered whole or in flight) at once during the forward and backward.

Paths are inside deepspeed 0.19.8 (runtime/zero/). ZeRO-3 hooks every module but the inside of a leaf
(parameter_offload.py:350-356) and, once a step has recorded the order the modules ran in (the trace,
partitioned_param_coordinator.py:251-273), at each module's pre-hook (fetch_sub_module, :310):
  * gathers the module's own parameters (its subtree's for a leaf; iter_params recurse=z3_leaf_module, :399);
  * pops them off the parameter queue (:430-444), then prefetches the next queued parameters not yet gathered until
    the prefetched elements reach min(stage3_max_live_parameters - elements gathered, stage3_prefetch_bucket_size)
    (:452-476: the check is before each parameter, so the last one may overshoot);
and at its post-hook (release_sub_module, :494) frees those of its parameters that are not persistent (ds_persist:
numel <= stage3_param_persistence_threshold, parameter_offload.py:317-329) unless a prefetch already claimed them
for a later use (:646-648) or a module within stage3_max_reuse_distance elements of the trace ahead uses them again
(:650-660). That traversal counts each module ahead by iter_params(module, recurse=<the RELEASED module is a leaf>):
a leaf MoE block ahead, whose parameters are its children's, counts 0 when a Linear is released.

In forward and backward this keeps a model's tail gathered at the turn (its modules are used again within the reuse
distance: a small model stays gathered whole) and gathers an MoE block's experts all at once: DeepSpeed makes
transformers' Mixtral / Qwen2-MoE / Qwen3-MoE blocks leaves by default (runtime/zero/leaf_module_config.py:11-15,
applied at engine.py:2076), and transformers 5.24 holds every expert of a block in two 3-D parameters
(models/mixtral/modeling_mixtral.py:57-66 MixtralExperts.gate_up_proj (E, 2I, H), down_proj (E, H, I); the same in
qwen3_moe :211-220, deepseek_v3 :162-171, gpt_oss :69-78), so without a leaf the experts module is gathered whole too
(not only the routed experts, as with transformers 4's per-expert ModuleList).

NB: each projection's weight is a parameter; biases, the q/k norms and position tables are left out (persistent on
every model: they only shorten the reuse traversal, by a few hidden-sized vectors a layer). Gated-output attention
(Qwen3-Next) is one module of the layer's attention parameters (over-counts the gather at an attention module).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict, deque
from dataclasses import dataclass
from functools import cached_property, lru_cache

from ...errors import SetupError
from ...spec import ModelSpec
from ..families import family_traits
from ..params import ParamCounts


# MoE blocks whose __init__ makes the experts before the router (transformers 5.24 models/qwen3_moe/
# modeling_qwen3_moe.py:274-275, deepseek_v3/modeling_deepseek_v3.py:209-210, deepseek_v2/modeling_deepseek_v2.py:
# 124-125); Mixtral's (modeling_mixtral.py:119-120), Qwen2-MoE's (:335-336) and gpt-oss's (:137-138) make the router first
EXPERTS_FIRST = ("qwen3_moe", "deepseek_v2", "deepseek_v3")


@dataclass(frozen=True)
class Module:
    direct: tuple[int, ...]  # its own parameters (ids into Model.numel)
    children: tuple["Module", ...] = ()  # in the order its forward calls them
    leaf: bool = False  # a ZeRO-3 leaf: gathered whole, its children carry no hooks

    @cached_property
    def subtree(self) -> tuple[int, ...]:
        return self.direct + tuple(p for c in self.children for p in c.subtree)

    @property
    def gathers(self) -> tuple[int, ...]:
        """iter_params(module, recurse=z3_leaf_module(module)) (:241, :399)."""
        return self.subtree if self.leaf else self.direct

    def forward(self) -> list["Module"]:
        """Pre-forward hooks: the module, then its children's (a leaf's children have none)."""
        return [self] + ([] if self.leaf else [m for c in self.children for m in c.forward()])

    def backward(self, recompute: "frozenset[int]") -> list["Module"]:
        """Pre-backward hooks: a module's wrapper on its output runs before its children's, the children in reverse;
        a checkpointed module (id in `recompute`) runs its forward again first (torch.utils.checkpoint)."""
        again = self.forward() if id(self) in recompute else []
        return [self] + again + ([] if self.leaf else [m for c in reversed(self.children) for m in c.backward(recompute)])


@dataclass(frozen=True, eq=False)
class Model:
    numel: tuple[int, ...]  # elements of each parameter
    root: Module  # the causal LM
    layers: tuple[Module, ...]  # the decoder layers (what gradient checkpointing wraps)
    experts: frozenset[int] = frozenset()  # the routed experts' parameters (ids into numel)


def replayable(spec: ModelSpec) -> bool:
    """A decoder of transformer layers this module lays out (not a hybrid, encoder-decoder or vision model)."""
    return spec.hybrid is None and spec.encdec is None and spec.vision is None and spec.linear_attn is None


# The replay follows the coordinator module by module, as DeepSpeed's hooks run (linear in the modules: about 0.2 ms a
# layer); deeper than this it is refused rather than run for minutes (10**9 layers: days). 79 times the deepest
# catalog model's layers (Llama 3.1 405B: 126): a bound on the work, no model's limit.
MAX_LAYERS = 10_000


def hf_model(spec: ModelSpec, pc: ParamCounts, leaf_moe: bool, routed: tuple[int, ...] | None = None) -> Model:
    """The module tree of transformers' causal LM: model (embed_tokens, layers, norm), lm_head (the embedding's
    parameter when tied); a layer: input norm, self_attn (q/k/v/o, fused where the family fuses them), post norm,
    mlp (gate, up, down) or the MoE block (router, experts, shared expert; one leaf when `leaf_moe`). `routed`: the
    elements of the experts' tensors where a replacement layer holds them otherwise (DeepSpeed's AutoEP: analytic/
    parallel/deepspeed.py autoep_routed); None: transformers' gate_up_proj and down_proj of every expert."""
    if spec.layers > MAX_LAYERS:
        raise SetupError(f"{spec.name}: {spec.layers:,} layers; DeepSpeed ZeRO's parameter layout is replayed module "
                         f"by module (analytic/parallel/zero3_replay.py), up to {MAX_LAYERS:,} layers: check the "
                         "config's layer count, or use --stack hf or torchtitan")
    h, traits = spec.hidden, family_traits(spec)
    numel: list[int] = []
    expert_ids: list[int] = []  # the routed experts' parameters (Model.experts)

    def leaf(*sizes: int) -> Module:
        ids = []
        for n in sizes:
            if n:
                numel.append(int(n))
                ids.append(len(numel) - 1)
        return Module(tuple(ids))

    def box(*children: Module, is_leaf: bool = False) -> Module:
        if is_leaf:
            return Module((), children, True)
        return Module((), children)

    embed = leaf(spec.vocab * (spec.embed_proj_dim or h))
    m = spec.moe
    moe_layers = min(spec.layers, m.sparse_layers or spec.layers) if m is not None else 0
    step = m.layer_step if m is not None else 0
    norm = pc.norms // max(spec.norms_per_layer, 1)
    layers = []
    for j in range(spec.layers):
        q, kv = spec.q_dim, spec.kv_dim
        if spec.mla is not None:  # params.mla_params: DeepseekV3Attention's modules in its forward's order
            a, n = spec.mla, spec.heads
            qs = ([leaf(h * a.q_lora_rank), leaf(a.q_lora_rank), leaf(a.q_lora_rank * n * a.qk_head_dim)]
                  if a.q_lora_rank else [leaf(h * n * a.qk_head_dim)])
            attn = box(*qs, leaf(h * (a.kv_lora_rank + a.qk_rope_head_dim)), leaf(a.kv_lora_rank),
                       leaf(a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)), leaf(n * a.v_head_dim * h))
        elif spec.attn_output_gate:
            attn = box(leaf(pc.attention))
        elif traits["fused_qkv"]:
            attn = box(leaf(h * (q + 2 * kv)), leaf(q * h))
        else:
            attn = box(leaf(h * q), leaf(h * kv), leaf(h * kv), leaf(q * h))
        if m is not None and (j % step == step - 1 if step else j >= spec.layers - moe_layers):
            ei, e = m.expert_intermediate, m.num_experts
            gated = 2 if spec.gated_mlp else 1
            def experts() -> Module:  # gpt-oss: gate_up_proj_bias and down_proj_bias are parameters (:76-78)
                made = leaf(*routed) if routed is not None else leaf(
                    e * gated * ei * h, e * gated * ei if m.expert_bias else 0, e * ei * h, e * h if m.expert_bias else 0)
                expert_ids.extend(made.direct)
                return made

            # the block's parameters in the order its __init__ makes them (ds_id: a leaf gathers and prefetches them
            # in that order); its forward calls the router first
            if spec.family in EXPERTS_FIRST:
                made = experts()
                parts = [leaf(e * h), made]
            else:
                router = leaf(e * h)
                parts = [router, experts()]
            if m.shared_intermediate:
                parts.append(box(*(leaf(h * m.shared_intermediate) for _ in range(3))))
                if m.shared_gate:
                    parts.append(leaf(h))
            mlp = box(*parts, is_leaf=leaf_moe)
        else:
            i = spec.intermediate
            mats = [2 * i * h] if (traits["fused_gate_up"] and spec.gated_mlp) else [i * h] * (1 + spec.gated_mlp)
            mlp = box(*(leaf(n) for n in mats + [i * h]))
        layers.append(box(leaf(norm), attn, leaf(norm), mlp))
    head = Module(embed.direct) if spec.tied_embeddings else leaf(spec.vocab * h)
    root = box(box(embed, *layers, leaf(pc.final)), head)
    return Model(tuple(numel), root, tuple(layers), frozenset(expert_ids))


def trace(model: Model, recompute: bool) -> tuple[Module, ...]:
    """The modules in the order their fetch hooks run: the forward, then the backward."""
    again = frozenset(id(x) for x in model.layers) if recompute else frozenset()
    return tuple(model.root.forward() + model.root.backward(again))


@lru_cache(maxsize=256)
def replay(model: Model, recompute: bool, persistence: int, prefetch: int, max_live: int, reuse: int) -> int:
    """The most elements gathered at once over one step whose trace is complete (the steps after the first)."""
    numel = model.numel
    order = trace(model, recompute)
    persist = [n <= persistence for n in numel]
    gathered = [False] * len(numel)
    queue = deque((p, s) for s, m in enumerate(order) for p in sorted(set(m.gathers)))  # :241-242 record_parameters
    recent: dict[int, int] = defaultdict(lambda: -10**18)  # __most_recent_step_id_param_fetched_for
    live = peak = 0
    walks = {True: _Walk(order, numel, lambda u: u.subtree), False: _Walk(order, numel, lambda u: u.direct)}

    def gather(p: int) -> None:
        nonlocal live
        if not gathered[p] and not persist[p]:
            gathered[p] = True
            live += numel[p]

    for s, m in enumerate(order):
        own = set(m.gathers)
        for p in own:
            gather(p)
        unclaimed = {p for p in own if recent[p] < s}  # :430-444
        popped: set[int] = set()
        while queue and len(popped) < len(unclaimed):
            p, used = queue.popleft()
            recent[p] = used
            popped.add(p)
        budget, taken, fetch = min(max_live - live, prefetch), 0, set()  # :452-476
        while queue and taken < budget:
            p, used = queue.popleft()
            recent[p] = max(recent[p], used)
            if not gathered[p] and not persist[p] and p not in fetch:
                fetch.add(p)
                taken += numel[p]
        for p in fetch:
            gather(p)
        peak = max(peak, live)
        # release_sub_module after the step id moved on (:489); __params_to_release (:640-662)
        free = {p for p in own if not persist[p] and recent[p] <= s + 1}
        ahead = walks[m.leaf]  # recurse=z3_leaf_module(the released module), :658
        for p in free:
            if gathered[p] and not ahead.reused(p, s, reuse):
                gathered[p] = False
                live -= numel[p]
    return peak


class _Walk:
    """The coordinator's walk ahead of a released module (:650-660), over the trace `order` with each module counted
    as `ahead(module)` (its subtree or its own parameters): from the next module on, it adds each one's parameters'
    elements and stops once they reach the reuse distance, and a parameter met before that is kept. The elements
    before position t sum to prefix[t] - prefix[s + 1], so a parameter is kept iff its first use after s lies where
    that sum is still under the distance: found by bisection instead of walked (the walk is quadratic in the depth
    where the distance spans the model: a tiny model of 1,000 layers took 110 s)."""

    def __init__(self, order, numel, ahead):
        self.prefix = [0]
        self.uses: dict[int, list[int]] = defaultdict(list)
        for t, u in enumerate(order):
            params = ahead(u)
            self.prefix.append(self.prefix[-1] + sum(numel[p] for p in params))
            for p in params:
                if not self.uses[p] or self.uses[p][-1] != t:
                    self.uses[p].append(t)

    def reused(self, p: int, s: int, reuse: int) -> bool:
        """Whether the walk from module s meets parameter p before the reuse distance."""
        uses = self.uses.get(p, ())
        i = bisect_right(uses, s)
        return i < len(uses) and self.prefix[uses[i]] - self.prefix[s + 1] < reuse
