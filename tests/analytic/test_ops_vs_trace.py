"""The analytic op list (analytic/ops/, a hand-written copy of transformers' eager kernel sequence) against the
kernels the trace engine dispatches for the same layer (trace/kernel_shapes.py): for every catalog family, one
layer's forward and backward under CUDA semantics (stack hf, SDPA's flash kernel, no recompute).

One layer's kernels are the difference between a 3-layer and a 2-layer trace of the family's smallest catalog model
(the embedding, the head and the loss cancel; the middle layer is a repeated one: DeepSeek's third, an MoE layer).
A family with two kinds of layer has each compared (layer_kinds): Qwen3-Next's third layer is a Gated DeltaNet one,
its fourth (4 layers less 3) a gated full-attention one. Nemotron-H's one-mixer blocks (Mamba-2, attention, MLP) are
each the difference between stacks of three and two blocks of that kind (hybrid_stack).
Compared per direction (forward, backward):
  * GEMMs and attention: the multisets of shapes, exactly. A GEMM is (its two output dims unordered, the contraction,
    the batch): the wgrad dW = dYᵀ·X and the op list's (k, n, m) are one product transposed. MoE experts are grouped
    GEMMs whose rows (or, for the wgrad, the contraction) total the routed tokens: compared as totals, which the op
    list's balanced routing (T·top_k/E rows per expert) matches whatever the routing. HF's eager attention (Gemma-2)
    is the op list's one `attention` op, the trace's four batched GEMMs (q·kᵀ, p·v; backward two each).
  * Casts (aten._to_copy: autocast's weight and input casts, dtype promotions' gradient casts): bytes and kernels.
  * The other memory-bound kernels (norms, rotary, activation, residual, dropout, gradient sums): their bytes.
A transformers release that changes a layer's kernels changes these numbers; so does a change of analytic/ops/.
"""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic.ops import Op, backward, grad_accumulations, layer_forward, shape_of  # noqa: E402
from trainfit.analytic.precision import state_bytes  # noqa: E402
from trainfit.analytic.timing import compute_dtype  # noqa: E402
from trainfit.analytic.unmodelled import unmodelled_features  # noqa: E402
from trainfit.errors import SetupError  # noqa: E402
from trainfit.api import catalog_models  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace.extrapolate import with_layers  # noqa: E402
from trainfit.trace.kernel_shapes import Kernel, step_kernels  # noqa: E402

# the smallest catalog model of each family (catalog_models sorts by size within a family)
SMALLEST: dict[str, str] = {}
for _m in catalog_models():
    SMALLEST.setdefault(_m["family"], _m["name"])
PHASES = ("forward", "backward")
# The op list's approximations of single kernels' bytes (the ops package docstring and its NB): it counts the streamed tensor
# of a kernel with a broadcast operand (rotary's cos/sin tables, a norm's [T, 1] factor and its weight), not the
# operand; rsqrt(x + eps)'s two kernels as one pass; an elementwise backward by the generic rule (an upper bound
# for ops with constant operands). Measured within 8.3 % (Gemma's backward) on the families below.
TOLERANCE = 0.10


def setup_for(spec) -> Setup:
    """amp-bf16, the HF Trainer's usual precision; bf16 for MoE: transformers casts the experts' input to the weight
    dtype (integrations/moe.py:379), fp32 under amp, and torch's _grouped_mm takes bf16 operands only (its meta
    check: "Expected inputs of BF16 type")."""
    return Setup(batch=2, seq=128, precision="bf16" if spec.moe is not None else "amp-bf16", device="cuda")


def traced_layer(spec, setup, layers: int = 3, block: str = "") -> dict[str, Counter]:
    """(phase, key) -> count of one layer's kernels: a `layers`-layer trace less one of a layer fewer (`block`: of
    a hybrid stack, `layers` blocks of that kind)."""
    def counted(n):
        model = hybrid_stack(spec, block, n) if block else _language_layers(spec, n)
        return Counter(_trace_key(k) for k in step_kernels(model, setup))
    more, fewer = counted(layers), counted(layers - 1)
    assert not fewer - more, f"a {layers - 1}-layer trace launched kernels a {layers}-layer one did not"
    return more - fewer


def _language_layers(spec, n: int):
    """with_layers, and for a vision-language model whose language model's depth is its text_config's (Gemma 3's
    Gemma3Config) that depth too (traced without images: the language model's layers alone)."""
    from dataclasses import replace

    out = with_layers(spec, n)
    text = out.config.get("text_config")
    if spec.vision is not None and text and "num_hidden_layers" in text:
        out = replace(out, config={**out.config, "text_config": {**text, "num_hidden_layers": n}})
    return out


def layer_kinds(spec, setup) -> list[tuple[str, int, bool, str]]:
    """(KNOWN key suffix, layers of the trace whose last layer is compared, Gated DeltaNet layer, hybrid block kind)
    per kind of layer: one kind for most families; Qwen3-Next's layer_types (read from transformers' config of the
    traced model, not from the analytic engine) mix linear_attention and full_attention layers: the first of each
    kind past the first two; Nemotron-H's three kinds of block, each in a stack of its own (hybrid_stack)."""
    if spec.hybrid is not None:
        return [("" if kind == "mamba" else f"/{kind}", 3, False, kind) for kind in HYBRID_PATTERN]
    if spec.linear_attn is None:
        return [("", 3, False, "")]
    from trainfit.step import hf_config
    types = list(hf_config(spec, setup).layer_types)
    return [(suffix, next(i for i in range(2, len(types)) if types[i] == kind) + 1, linear, "")
            for suffix, kind, linear in (("", "linear_attention", True), ("/full_attention", "full_attention", False))]


# Nemotron-H's block kinds by their hybrid_override_pattern letter (configuration_nemotron_h.py _pattern_to_list)
HYBRID_PATTERN = {"mamba": "M", "attention": "*", "mlp": "-"}


def hybrid_stack(spec, block: str, n: int):
    """The model of `spec` with n blocks, all of kind `block`: transformers' config of the pattern (its length is
    the layer count), not the analytic engine's kinds."""
    from trainfit.models.hf_config import spec_from_config

    cfg = {k: v for k, v in spec.config.items() if k not in ("layers_block_type", "layer_types")}
    return spec_from_config({**cfg, "hybrid_override_pattern": HYBRID_PATTERN[block] * n, "num_hidden_layers": n},
                            spec.name)


def _trace_key(k: Kernel) -> tuple:
    if k.kind == "memory":
        return k.phase, "cast" if k.op == "_to_copy" else "memory", k.nbytes
    if k.kind == "attention":  # the op list's k: the mean of the q·kᵀ and p·v head widths (ops/layer.py)
        return k.phase, "attention", k.batch, k.m, k.n, (k.k + k.v) / 2
    return k.phase, k.kind, *sorted((k.m, k.n)), k.k, k.batch


CASTS = ("autocast", "weight_casts", "attn_cast", "grad_cast", "to_fp32", "to_dtype", "pow_cast", "rope_fp32",
         "rope_cast")


def _ops_keys(phase: str, op: Op) -> list[tuple]:
    m, n, k, b = (int(round(x)) for x in (op.m, op.n, op.k, op.batch))
    if op.kind == "attention" and op.kernel == "eager":  # q·kᵀ (s, s, d) and p·v (s, d, s); backward two each
        qk, pv = (phase, "gemm", m, n, k, b), (phase, "gemm", *sorted((m, k)), n, b)
        return [qk, pv] if not op.backward else [qk, pv, pv, pv]
    if op.kind == "attention":
        return [(phase, "attention", b, m, n, op.k)]
    if op.kind == "gemm" and op.name.startswith("experts"):  # per expert × experts: the grouped GEMM's totals
        m, k = (m, round(op.k * op.batch)) if op.name.endswith(".wgrad") else (round(op.m * op.batch), k)
        return [(phase, "grouped_gemm", *sorted((m, n)), k, b)]
    if op.kind == "gemm":
        return [(phase, "gemm", *sorted((m, n)), k, b)]
    return []


def listed_layer(spec, setup, linear: bool = False, block: str = "") -> tuple[
        dict[str, Counter], dict[str, tuple[float, int]], dict[str, float]]:
    """The op list's layer (`linear`: a Gated DeltaNet one; `block`: a hybrid stack's block of that kind):
    GEMM/attention keys by phase, (cast bytes, cast kernels) and other bytes by phase."""
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    fwd = layer_forward(spec, sh, middle_layer_is_moe(spec), linear, block)
    lists = {"forward": fwd, "backward": backward(fwd) + grad_accumulations(spec, sh, linear, block)}
    shapes, casts, other = {}, {}, {}
    for phase, ops in lists.items():
        shapes[phase] = Counter(key for op in ops for key in _ops_keys(phase, op))
        memory = [op for op in ops if op.kind == "memory"]
        cast = [op for op in memory if any(c in op.name for c in CASTS)]
        casts[phase] = (sum(op.nbytes for op in cast), sum(op.kernels for op in cast))
        other[phase] = sum(op.nbytes for op in memory) - casts[phase][0]
    return shapes, casts, other


def middle_layer_is_moe(spec) -> bool:
    """Whether the layer a 3-layer trace adds to a 2-layer one is an MoE layer: DeepSeek's third (its dense layers
    come first); Llama 4's interleaved ones (tiny-llama4: MoE on odd layers, so the third is dense)."""
    from trainfit.models.hf_config import spec_from_config

    if spec.moe is None:
        return False
    if spec.moe.sparse_layers is None:
        return True
    sparse = [spec_from_config({**spec.config, "num_hidden_layers": n}, spec.name).moe for n in (3, 2)]
    return [m.sparse_layers if m and m.sparse_layers is not None else n if m else 0
            for m, n in zip(sparse, (3, 2))] in ([3, 2], [2, 1], [1, 0])


# Findings: where transformers' kernels and the op list differ, the exact difference (trace − op list) per phase:
# cast (bytes, kernels), other bytes. Each names its cause; a change on either side fails the test.
KNOWN: dict[str, dict] = {
    "gemma2": {  # eager attention (softcapping): its scaling, softcap, mask, fp32 softmax and their casts are
        # timed by roofline.unfused_attention, not listed as ops (its norms' `1 + weight` adds are:
        # ops/norm.py zero_centred_weight)
        "forward": {"cast": (1867776, 1), "other": 5091328},
        "backward": {"cast": (3440640, 2), "other": 4538368}},
    "gpt_neox": {  # FINDING: partial rotary (GPTNeoXConfig's default partial_rotary_factor 0.25; rotary on
        # q[..., :rotary_ndims], then a cat with the pass-through part): ops' `rotary.hf_rotary` rotates the full head width
        # (-26 % forward bytes), and the fp32 rotated part promotes the cat under autocast (the casts)
        "forward": {"cast": (589824, 2), "other": -1880064},
        "backward": {"cast": (-983040, 1), "other": 151040}},
    "nemotron": {  # FINDING: partial rotary as GPT-NeoX's (partial_rotary_factor 0.5, modeling_nemotron.py:162-169):
        # ops' `rotary.hf_rotary` rotates the full head width (-3.4 % forward bytes), the fp32 rotated halves promote
        # the cat under autocast (2 casts of (q + k rotated) × tokens, 15.3 MB), the slices' zero-filling backwards
        # and LayerNorm1P's weight + 1 (+4.9 % backward bytes). (relu2's kernels are listed: ops/activation.py relu2,
        # which closed +59.4 MB forward and +264 MB backward of this entry)
        "forward": {"cast": (15335424, 2), "other": -16121856},
        "backward": {"cast": (-15335424, 2), "other": 41680896}},
    "phi3": {  # FINDING: Phi-3's apply_rotary_pos_emb (modeling_phi3.py:181-186) splits q and k into rotated and
        # pass-through parts and cats them back even at partial_rotary_factor 1.0 (a copy each; zero-filling
        # slice_backwards in backward), and gate_up_proj's chunk (:61) concatenates its gradients in backward; the op list
        # lists none of these (+13 % forward, +36 % backward bytes)
        "forward": {"cast": (0, 2), "other": 1382400},
        "backward": {"cast": (0, 2), "other": 7512064}},
    "qwen3": {  # FINDING: q_norm / k_norm read the 16-bit projections (listed with their casts to fp32 and back), but
        # `self.weight * hidden_states.to(input_dtype)` promotes to fp32 under autocast (the fp32 weight), which the op
        # list writes in the activation dtype: its fp32 passes are timed on bf16-sized tensors (+14 % / +22 % bytes),
        # and the backward lists 2 gradient casts (4.7 MB) that the promotion's backward does not launch
        "forward": {"cast": (0, 0), "other": 9761792},
        "backward": {"cast": (-4718592, -2), "other": 34971648}},
    "gpt_oss": {  # FINDING: gpt-oss's eager attention (modeling_gpt_oss.py:239-252): its scaling, mask add and softmax
        # are timed by roofline.unfused_attention, not listed as ops (the sink column's cat, max, subtraction and slice
        # are: ops/sinks.py); its rotary (:207-215, chunked halves: 4 muls, a sub, an add, a cat) is listed as
        # rotate_half's; and the MoE routing's histc on a float copy of the expert ids (the one forward cast), as in
        # the MoE families below
        "forward": {"cast": (6144, 1), "other": 1696048},
        "backward": {"cast": (768, 2), "other": 2681744}},
    # MoE routing: transformers' grouped-mm path (integrations/moe.py) sorts, counts (histc, cumsum), gathers and
    # scatters the routed tokens and casts the router's fp32 weights, kernels ops' `moe.moe_block` folds into its router,
    # dispatch and combine ops (and, for DeepSeek, MLA's kv expansion: ops/mla.py counts one k_build copy, transformers runs
    # new_empty + two copy_ and pads/cats the rope part)
    "deepseek_v2": {"forward": {"cast": (325632, 7), "other": 612720},
                    "backward": {"cast": (516096, 7), "other": 3047424}},
    "deepseek_v3": {"forward": {"cast": (207872, 4), "other": 805344},
                    "backward": {"cast": (393216, 3), "other": 3191808}},
    "mixtral": {"forward": {"cast": (405504, 3), "other": 1684528},
                "backward": {"cast": (1185792, 3), "other": 9769984}},
    "qwen2_moe": {"forward": {"cast": (110592, 3), "other": 7629008},
                  "backward": {"cast": (98304, 2), "other": 82645504}},
    "qwen3_moe": {"forward": {"cast": (233472, 3), "other": 9990144},
                  "backward": {"cast": (208896, 2), "other": 106480640}},
    # Qwen3-Next (bf16, tiny-qwen3-next at 2 x 128: two chunks of the delta rule): the casts are the MoE routing's as
    # above (the router's fp32 softmax input and weights: 3 forward, 2 backward); the other bytes of its Gated
    # DeltaNet layer within +2.7 % forward, +4.9 % backward (ops/gated_deltanet.py: the routing's gathers and
    # scatters, and the scan's CopySlices backward counted by the generic rule). The same under transformers 5.24
    # and 5.25, whose split of the rule's inputs and cat of its output the op list follows
    # (gated_deltanet.splits_at_kept_states)
    "qwen3_next": {"forward": {"cast": (15360, 3), "other": 240704},
                   "backward": {"cast": (9216, 2), "other": 1250416}},
    # FINDING: its gated full-attention layer: the same routing casts; partial rotary (partial_rotary_factor 0.25,
    # modeling_qwen3_next.py apply_rotary_pos_emb: rotary on q[..., :rotary_dim], a cat with the pass-through part)
    # rotated by ops' `rotary.hf_rotary` over the full head width, as GPT-NeoX's entry: the slices' zero-filling
    # backwards (8 slice_backward, 0.18 MB) and the cats are not listed (+18.1 % backward bytes, +1.6 % forward)
    "qwen3_next/full_attention": {"forward": {"cast": (15360, 3), "other": 52400},
                                  "backward": {"cast": (9216, 2), "other": 1389696}},
}


# a vision-language model's language model (Qwen2.5-VL, Gemma 3: ~15 s each on 2 cores, heavy); its tower's kernels
# are test_tower_ops_vs_trace.py's
FAMILIES = [pytest.param(f, marks=pytest.mark.heavy)
            if load_model(SMALLEST[f]).vision is not None and not unmodelled_features(load_model(SMALLEST[f])) else f
            for f in sorted(SMALLEST)]


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_kernels_match_the_op_list(family):
    spec = load_model(SMALLEST[family])
    setup = setup_for(spec)
    if spec.encdec is not None and not unmodelled_features(spec):
        pytest.skip("an encoder-decoder's two stacks: block by block in test_encdec_ops_vs_trace.py")
    if unmodelled_features(spec):  # the analytic engine refuses it (Llama 4): the op list says so in one line
        with pytest.raises(SetupError, match="analytic engine does not model"):
            listed_layer(spec, setup)
        return
    for suffix, layers, linear, block in layer_kinds(spec, setup):
        _compare(family + suffix, traced_layer(spec, setup, layers, block), *listed_layer(spec, setup, linear, block))


def _compare(family: str, traced: dict, shapes: dict, casts: dict, other: dict) -> None:
    known = KNOWN.get(family, {})
    for phase in PHASES:
        gemms = Counter({key: c for key, c in traced.items() if key[0] == phase and key[1] not in ("cast", "memory")})
        assert gemms == shapes[phase], (
            f"{family} {phase}: GEMM/attention shapes, trace only {dict(gemms - shapes[phase])}, "
            f"op list only {dict(shapes[phase] - gemms)}")
        cast = (sum(key[2] * c for key, c in traced.items() if key[:2] == (phase, "cast")),
                sum(c for key, c in traced.items() if key[:2] == (phase, "cast")))
        mem = sum(key[2] * c for key, c in traced.items() if key[:2] == (phase, "memory"))
        got = {"cast": (cast[0] - casts[phase][0], cast[1] - casts[phase][1]), "other": mem - other[phase]}
        want = known.get(phase)
        if want is not None:
            assert got == want, f"{family} {phase}: trace − op list {got}, recorded {want}"
            continue
        assert got["cast"] == (0, 0), f"{family} {phase}: casts trace {cast}, op list {casts[phase]}"
        assert abs(mem / other[phase] - 1) <= TOLERANCE, (
            f"{family} {phase}: other memory-bound bytes trace {mem}, op list {other[phase]:.0f} "
            f"({mem / other[phase] - 1:+.1%})")


def test_every_expert_moe_layer_gemms():
    """Llama 4's MoE layer (tiny-llama4's fourth: MoE, NoPE): the op list's all-experts block (ops/moe.py
    every_expert_ops: two torch.bmm of every expert over all T tokens, batch E; the router; the shared expert's three
    linears) has the trace's GEMM shapes exactly, forward and backward. (Its memory-bound bytes differ by the op list's
    RoPE-layer choice, ops/layer.py rope_shape's NB: the NoPE layer has no rotary, L2 norm or chunk mask.)"""
    spec = load_model("tiny-llama4")
    setup = setup_for(spec)
    traced = Counter(_trace_key(k) for k in step_kernels(with_layers(spec, 4), setup)) - \
        Counter(_trace_key(k) for k in step_kernels(with_layers(spec, 3), setup))
    sh = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    fwd = layer_forward(spec, sh, True)
    lists = {"forward": fwd, "backward": backward(fwd) + grad_accumulations(spec, sh)}
    for phase in PHASES:
        gemms = Counter({key: c for key, c in traced.items() if key[0] == phase and key[1] not in ("cast", "memory")})
        listed = Counter(key for op in lists[phase] for key in _ops_keys(phase, op))
        assert gemms == listed, f"{phase}: trace only {dict(gemms - listed)}, op list only {dict(listed - gemms)}"
        assert any(key[1] == "gemm" and key[-1] == spec.moe.num_experts for key in gemms), "no all-experts bmm"
