"""Megatron's activation CPU offloading (--offload-layers N = --cpu-offloading-num-layers): which saved bytes leave
the device, when, and what the copies cost (--stack megatron).

Megatron-Core 0.16.1 runs each TransformerLayer of a block inside Transformer Engine's offload context and passes
each layer's output through TE's group commit (transformer/transformer_block.py:303-323, :764-786): every layer is
one "group", numbered from the block's first layer. TE v2.9's AsyncDoubleBufferGroupOffloadHandler
(transformer_engine/pytorch/cpu_offload.py:303-657; the handler get_cpu_offload_context builds, :723-728):
  * what: of the tensors a layer saves for backward, those TE's modules mark `activation_offloading` (the checker,
    :718-719) — OFFLOADED below; the others stay on the device (tensor_push keeps them, :397-412);
  * which layers: the first N groups (`current_group < num_offload_group`, :403-405);
  * when (forward): group 0's copy starts at its own commit (:496-512); the copy of group g must be done, and its
    device tensors are released, at the commit of layer window[g] (layer_window_map, :343-350: the N groups spread
    over the L layers), where the next group's copy starts (:516-539) on the d2h stream;
  * when (backward): at layer window[g]'s commit backward the compute stream waits for the previous reload and
    group g's reload starts on the h2d stream into fresh device buffers (:633-651, :560-600, no double buffering);
    the block's first layer waits for the last (:654-655). So group g is back on the device from layer window[g]'s
    backward until its own.
Hence layer j's forward (and its backward) has on the device every group g <= j with window[g] >= j: its own and
those whose copy has not been waited for (forward) or that were reloaded early (backward). With N = L/2 the last
layer holds one offloaded layer beside the L - N kept: L - N + 1 layers' offloadable bytes.
"""
from __future__ import annotations

import functools
from bisect import bisect_left
from dataclasses import replace

from ..setup import Setup
from .megatron_activations import MegatronLayer

# The saved tensors Transformer Engine marks for offload (megatron_activations.layer_terms' names): _LayerNormLinear's
# inputmat, mu, rsigma and ln_out (TE v2.9 module/layernorm_linear.py:420-421: norm_inputs, norm_statistics,
# linear_inputs), Linear's saved input (module/linear.py:397-398: attention_output as linear_proj's input,
# activation_output as linear_fc2's), the fused attention's q, k, v, out and its softmax statistics
# (attention/dot_product_attention/backends.py:1295-1305: qkv, softmax_lse), Megatron's bias-SwiGLU / GeLU input
# (megatron-core fusions/fused_bias_swiglu.py:118-120, passed by transformer/mlp.py:203-210: fc1_output), and the
# shared expert's (an MLP of the same modules). Not marked, so kept: bias-dropout-add's masks (torch dropout), the
# router's tensors (torch ops), the routed experts' (GroupedLinear saves its inputs unmarked, module/
# grouped_linear.py:212-231), eager attention's scores and mask (Megatron's local DotProductAttention).
OFFLOADED = frozenset({"norm_inputs", "norm_statistics", "linear_inputs", "qkv", "attention_output", "softmax_lse",
                       "fc1_output", "activation_output", "shared_expert"})


# Each layer of an offloading stage holds its own count of offload groups (groups_on_device: the count rises and falls
# with the layer, so its layers are not runs of alike ones: layer_kinds lists them one by one), about 40 µs a layer
# per memory evaluation, and a setup that does not fit is judged dozens of times by the fit advice (10,000 layers:
# ~8 s; 10**6: minutes). Deeper than this --offload-layers is refused (79 times the deepest catalog model's 126
# layers: a bound on the work, no model's limit; zero3_replay.MAX_LAYERS is the same bound for its own walk).
MAX_LAYERS = 10_000


@functools.lru_cache(maxsize=256)
def window_map(layers: int, offloaded: int) -> tuple[int, ...]:
    """TE's layer_window_map (cpu_offload.py:341-350): for offload group g, the layer at whose commit its copy is
    waited for and its device tensors released (forward), and at whose commit backward it is reloaded."""
    out, constant = [], 0
    for i in range(offloaded):
        w = (layers // offloaded) * (i + 1) - 1
        if i < layers % offloaded:
            w += i + 1
            constant = i + 1
        else:
            w += constant
        out.append(w)
    return tuple(out)


def groups_on_device(layers: int, offloaded: int, j: int) -> int:
    """Offload groups whose offloadable bytes are on the device during layer j's forward and its backward: g <= j
    (made, or not yet consumed) and window[g] >= j (not yet released, or already reloaded): module docstring. The
    window rises with g (each group's layer_window_map entry at least layers // offloaded past the last), so those
    groups are the run from the first whose window reaches j to min(j, the last group): counted, not walked (a walk
    per layer made layer_kinds quadratic)."""
    window = window_map(layers, offloaded)
    return max(0, min(j, len(window) - 1) - bisect_left(window, j) + 1)


def parts(layer: MegatronLayer, router_input: float = 0.0) -> tuple[MegatronLayer, MegatronLayer]:
    """(kept, offloaded): the layer's saved terms that stay on the device and those TE copies to the host.
    `router_input`: a MoE layer's bytes per token of the pre-MLP norm output among its linear_inputs, which the
    router's torch linear saves unmarked (transformer/moe/router.py), so it stays."""
    rep_off = {k: v for k, v in layer.replicated.items() if k in OFFLOADED}
    rep_kept = {k: v for k, v in layer.replicated.items() if k not in OFFLOADED}
    if router_input and "linear_inputs" in rep_off:
        rep_off["linear_inputs"] -= router_input
        rep_kept["router_input"] = router_input
    kept = replace(layer, replicated=rep_kept, split={k: v for k, v in layer.split.items() if k not in OFFLOADED})
    off = MegatronLayer(rep_off, {k: v for k, v in layer.split.items() if k in OFFLOADED}, 0.0, 0.0)
    return kept, off


def copied_per_layer(layer: MegatronLayer, setup: Setup, tokens: float, keys: float, quantised: bool,
                     router_input: float = 0.0) -> float:
    """Bytes one offloaded layer copies each way on one rank: its offloadable terms, and under a 16-bit linear_proj
    the attention output once more — the fused attention and linear_proj each save that one tensor, and each save
    is its own pack-hook call, copied and reloaded on its own (cpu_offload.py:149-151 tensor_push per save; a
    --low-precision linear_proj saves its quantised copy instead: te_recipes.saved_delta).
    NB: the reloaded duplicate is counted in the copies, not on the device (under-counts a reloaded layer by its
    attention output)."""
    _, off = parts(layer, router_input)
    out = off.per_rank(setup, tokens, keys)
    if not quantised and "attention_output" in off.split:
        out += off.split["attention_output"] / setup.tp * tokens
    return out


def exposed_seconds(layers: int, offloaded: int, copy: float, forward: float, backward: float) -> float:
    """Seconds per micro-batch the compute stream waits on the copies, `copy` seconds each way per offloaded layer
    over the host link, `forward`/`backward` one layer's compute: group g's copy runs beside the layers between
    window[g-1] and window[g] (its start and the wait for it; group 0's from layer 0's commit), in the forward on the
    d2h stream and in the backward on the h2d stream (cpu_offload.py:516-539, :641-655), so each group exposes
    max(0, copy - those layers' compute), each way.
    NB: the copies' HBM traffic is not charged to the kernels beside them (optimistic); the layer time is the stage's
    mean, head and embedding included (optimistic: more compute per window)."""
    if offloaded <= 0 or copy <= 0:
        return 0.0
    out, before = 0.0, 0
    for w in window_map(layers, offloaded):
        span = w - before  # layers computed while the copy runs
        out += max(0.0, copy - span * forward) + max(0.0, copy - span * backward)
        before = w
    return out


def reload_buffers(setup: Setup, off: float) -> float:
    """Device bytes TE keeps for the reloads through the run: under double buffering two groups' worth, made at group
    0's commit and at the last layer's (cpu_offload.py:499-510, :544-551); without it (Megatron-LM's, stacks/
    megatron.toml [cpu_offloading]) none: each reload allocates its own buffers on the compute stream (:576-582),
    counted with the group on the device."""
    return 2 * off if setup.stack_facts.fact("cpu_offloading", "double_buffering") else 0.0


def layer_kinds(layers: int, offloaded: int, full: float, off: float, temps: float, kind_type) -> tuple:
    """(kinds, pattern) for phases.StepBytes: layer j keeps its non-offloadable bytes (all of them past the first
    `offloaded`), and at its forward and backward high points also the offloadable bytes of groups_on_device(j)
    layers (its own included where it is offloaded)."""
    kinds: list = []
    index: dict = {}
    pattern = []
    for j in range(layers):
        saved = full - off if j < offloaded else full
        extra = groups_on_device(layers, offloaded, j) * off
        # a kept layer's own bytes are in `saved`; an offloaded one's own are among `extra`
        key = (saved, extra)
        if key not in index:
            index[key] = len(kinds)
            kinds.append(kind_type(saved, temps + extra, 0.0, 0.0, forward=saved + extra if extra else 0.0))
        pattern.append(index[key])
    return tuple(kinds), tuple(pattern)
