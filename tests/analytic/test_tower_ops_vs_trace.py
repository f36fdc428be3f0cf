"""The vision towers' op list (analytic/ops/vision_tower.py) against the kernels the trace engine dispatches
(trace/kernel_shapes.py) for the same tower under CUDA semantics, as tests/analytic/test_ops_vs_trace.py does for
the language models' layers: Qwen2.5-VL (a windowed and a full-attention block), Gemma 3 (a SigLIP block) and Qwen3-VL
(a LayerNorm/GELU block), each with its ends (patch embedding, rotary tables or position rows, merger or pooling
projector, the scatter of the image tokens into the language model's embeddings); Qwen3-VL's deepstack level (its
merger and the add of its features into the language model's hidden states) as a tower with one less a tower
without. Llama 3.2 Vision (ops/mllama_tower.py): a local and a global encoder layer, the tower's ends and a
cross-attention layer of the language model (test_mllama_tower_and_cross_layer_kernels_match_the_op_list).

One block's kernels are the difference between a 3-block and a 2-block tower's trace (test_vlm_analytic.py's small
towers: width 64, 2 heads, one 112-pixel image per sample, batch 2). The ends are the rest of the 2-block trace's
tower region, less its two blocks: in the forward from the first kernel of the patch embedding (its casts, then the
convolution) to the masked_scatter into inputs_embeds; in the backward from the scatter's backward (masked_fill,
masked_scatter_backward) to the patch embedding's weight-gradient casts after convolution_backward (the language
model's embedding backward follows, its own). Compared per direction as test_ops_vs_trace.py does: GEMM and attention
shapes exactly (the patch convolution, a memory kernel to the trace, is the op list's one GEMM: checked present;
a biased one's bias gradient, a sum the op list lists, lies inside the trace's convolution_backward), casts in bytes
and kernels exactly, the other memory-bound bytes within TOLERANCE or at the recorded difference."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_ops_vs_trace import CASTS, _ops_keys, _trace_key  # noqa: E402
from test_vs_trace_families import CONFIGS, HIDDEN, shrink  # noqa: E402

from trainfit.analytic.ops import backward, shape_of  # noqa: E402
from trainfit.analytic.ops.vision_tower import (block_forward, block_grad_accumulations, block_kinds,  # noqa: E402
                                                ends_backward, ends_forward, tower_shape)
from trainfit.analytic.precision import state_bytes  # noqa: E402
from trainfit.analytic.timing import compute_dtype  # noqa: E402
from trainfit.analytic.vlm import language_setup  # noqa: E402
from trainfit.models.hf_config import spec_from_config  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.trace.kernel_shapes import step_kernels  # noqa: E402

PHASES = ("forward", "backward")
# the tower's casts beside the language model's (CASTS): the pixels', the image features' to the embeddings' dtype,
# the projector's type_as
TOWER_CASTS = CASTS + ("pixels_cast", "features.cast", "type_as")
CONV = ("convolution", "convolution_backward")
# The op list's approximations (the ops package docstring's, and: the rotary tables' products read each table once,
# the norm's weight multiply reads its [h] weight as the streamed tensor): within 8.8 % (Qwen2.5-VL's ends'
# backward in fp32) on the cases below but for the recorded ones (KNOWN)
TOLERANCE = 0.09
# Findings (trace − op list other bytes, per phase), each with its cause; a change on either side fails the test
KNOWN: dict = {
    # FINDING: SigLIP's block backward in fp32 runs two contiguous copies (clone) of an (n, hidden) fp32 gradient
    # before the out projection's and fc2's dgrad GEMMs (131,072 B of the +13.1 %), not listed; the same copies in
    # 16 bits stay within TOLERANCE
    ("gemma3", "fp32", "block"): {"backward": 133120},
}


def small_qwen2_5_vl(depth: int, full: list[int]):
    c = shrink(CONFIGS["qwen2_5_vl"])
    c.update(image_token_id=999, video_token_id=998, vision_start_token_id=997, vision_end_token_id=996,
             rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})
    c["vision_config"] = {**c["vision_config"], "depth": depth, "hidden_size": 64, "intermediate_size": 128,
                          "num_heads": 2, "out_hidden_size": 128, "window_size": 56, "fullatt_block_indexes": full}
    return spec_from_config(c, "small-qwen2_5_vl")


def small_gemma3(depth: int):
    c = shrink(CONFIGS["gemma3"])
    c.update(image_token_index=999, boi_token_index=998, eoi_token_index=997, mm_tokens_per_image=16)
    c["vision_config"] = {**c["vision_config"], "num_hidden_layers": depth, "hidden_size": 64,
                          "intermediate_size": 128, "num_attention_heads": 2, "image_size": 112, "patch_size": 14}
    return spec_from_config(c, "small-gemma3")


def small_qwen3_vl(depth: int, deepstack: list[int]):
    c = shrink(CONFIGS["qwen3_vl"])
    c.update(image_token_id=999, video_token_id=998, vision_start_token_id=997, vision_end_token_id=996)
    c["vision_config"] = {**c["vision_config"], "depth": depth, "hidden_size": 64, "intermediate_size": 128,
                          "num_heads": 2, "out_hidden_size": c["text_config"]["hidden_size"], "patch_size": 14,
                          "num_position_embeddings": 64, "deepstack_visual_indexes": deepstack}
    return spec_from_config(c, "small-qwen3_vl")


def _kernels(spec, setup):
    from trainfit.trace.fake import vision_constants

    with vision_constants(spec):  # the image grid's values (step/build.py vlm_batch), as the trace engine runs it
        return step_kernels(spec, setup)


def _counted(kernels) -> Counter:
    return Counter(_trace_key(k) for k in kernels if k.op not in CONV)


def _tower_region(kernels) -> list:
    """The 2-block trace's tower kernels (the module docstring's bounds)."""
    out = []
    for phase in PHASES:
        ks = [k for k in kernels if k.phase == phase]
        conv = next(i for i, k in enumerate(ks) if k.op == CONV[PHASES.index(phase)])
        if phase == "forward":
            start = conv
            while ks[start - 1].op == "_to_copy":
                start -= 1
            end = max(i for i, k in enumerate(ks) if k.op == "masked_scatter") + 1
        else:
            start = min(i for i, k in enumerate(ks) if k.op in ("masked_fill", "masked_scatter_backward"))
            end = conv + 1
            while end < len(ks) and ks[end].op == "_to_copy":
                end += 1
        out += ks[start:end]
    assert [k.phase for k in out if k.op in CONV] == list(PHASES), "one patch convolution each way"
    return out


def _traced(counter: Counter) -> dict:
    out = {}
    for phase in PHASES:
        gemms = Counter({k: c for k, c in counter.items() if k[0] == phase and k[1] not in ("cast", "memory")})
        cast = (sum(k[2] * c for k, c in counter.items() if k[:2] == (phase, "cast")),
                sum(c for k, c in counter.items() if k[:2] == (phase, "cast")))
        out[phase] = gemms, cast, sum(k[2] * c for k, c in counter.items() if k[:2] == (phase, "memory"))
    return out


def _listed(lists: dict) -> dict:
    out = {}
    for phase, ops in lists.items():
        gemms = Counter(key for op in ops for key in _ops_keys(phase, op) if not op.name.startswith("patch_embed"))
        memory = [op for op in ops if op.kind == "memory"]
        cast = [op for op in memory if any(c in op.name for c in TOWER_CASTS)]
        cast_bytes = sum(op.nbytes for op in cast)
        out[phase] = gemms, (cast_bytes, sum(op.kernels for op in cast)), sum(op.nbytes for op in memory) - cast_bytes
    return out


def _compare(case: tuple, traced: dict, listed: dict) -> None:
    known = KNOWN.get(case, {})
    for phase in PHASES:
        (tg, tc, tm), (lg, lc, lm) = traced[phase], listed[phase]
        assert tg == lg, \
            f"{case} {phase}: GEMM/attention shapes, trace only {dict(tg - lg)}, op list only {dict(lg - tg)}"
        assert tc == lc, f"{case} {phase}: casts trace {tc}, op list {lc}"
        if phase in known:
            assert tm - lm == known[phase], f"{case} {phase}: trace − op list {tm - lm:.0f}, recorded {known[phase]}"
        else:
            assert abs(tm / lm - 1) <= TOLERANCE, f"{case} {phase}: other bytes trace {tm}, op list {lm:.0f} " \
                                                  f"({tm / lm - 1:+.1%})"


def _check(family: str, precision: str, specs: dict) -> tuple:
    """specs: "base" (2 blocks) and, per kind of block, its 3-block tower (the third block of that kind). Returns the
    base trace's counted kernels, the tower's Shape and the language model's."""
    setup = Setup(batch=2, seq=128, precision=precision, device="cuda", images=1, image_size=112)
    base = specs.pop("base")
    kernels = _kernels(base, setup)
    fewer = _counted(kernels)
    lm_setup = language_setup(base, setup)
    lm = shape_of(base, lm_setup, state_bytes(lm_setup), compute_dtype(lm_setup))
    sh = tower_shape(base, lm_setup, lm)
    chunks = dict(zip(("windowed", "full") if len(block_kinds(base, lm_setup)) > 1 else ("block",),
                      (c for _, c in block_kinds(base, lm_setup))))
    blocks = Counter()
    for kind, spec in specs.items():
        more = _counted(_kernels(spec, setup))
        assert not fewer - more, f"a 2-block tower launched kernels a 3-block one did not ({kind})"
        block = more - fewer
        blocks += block
        fwd = block_forward(base, sh, chunks[kind])
        _compare((family, precision, kind), _traced(block),
                 _listed({"forward": fwd, "backward": backward(fwd) + block_grad_accumulations(base, sh)}))
    # the 2-block tower: its blocks are the two kinds (Qwen2.5-VL) or twice the one (SigLIP)
    two = blocks if len(specs) == 2 else blocks + blocks
    region = _counted(_tower_region(kernels))
    assert not two - region, "the blocks' kernels lie in the tower region"
    ends = ends_forward(base, sh, lm)
    _compare((family, precision, "ends"), _traced(region - two),
             _listed({"forward": ends, "backward": ends_backward(ends)}))
    conv = [k for k in kernels if k.op in CONV]
    assert len(conv) == 2 and any(o.name == "patch_embed" for o in ends), "the patch convolution: one GEMM"
    return fewer, sh, lm


# 2 or 3 traces each, 10-15 s on 2 cores: heavy (the default run keeps test_tower_op_flops_equal_the_tower_flops)
PRECISIONS = ["amp-bf16", "bf16", "fp32"]


@pytest.mark.heavy
@pytest.mark.parametrize("precision", PRECISIONS)
def test_qwen2_5_vl_tower_kernels_match_the_op_list(precision):
    _check("qwen2_5_vl", precision, {"base": small_qwen2_5_vl(2, [1]), "windowed": small_qwen2_5_vl(3, [1]),
                                     "full": small_qwen2_5_vl(3, [1, 2])})


@pytest.mark.heavy
@pytest.mark.parametrize("precision", PRECISIONS)
def test_gemma3_tower_kernels_match_the_op_list(precision):
    _check("gemma3", precision, {"base": small_gemma3(2), "block": small_gemma3(3)})


@pytest.mark.heavy
@pytest.mark.parametrize("precision", PRECISIONS)
def test_qwen3_vl_tower_kernels_match_the_op_list(precision):
    """Qwen3-VL's block and ends (no deepstack level in either tower), then one deepstack level: a 2-block tower with
    a deepstack merger after block 0 less one without (the merger, its features' cat, and the add into the language
    model's hidden states after decoder layer 0)."""
    from trainfit.analytic.ops.qwen3vl_tower import deepstack_level

    setup = Setup(batch=2, seq=128, precision=precision, device="cuda", images=1, image_size=112)
    fewer, sh, lm = _check("qwen3_vl", precision, {"base": small_qwen3_vl(2, []), "block": small_qwen3_vl(3, [])})
    deep = small_qwen3_vl(2, [0])
    more = _counted(_kernels(deep, setup))
    assert not fewer - more, "a tower without a deepstack level launched kernels one with it did not"
    level = deepstack_level(deep, sh, lm)
    _compare(("qwen3_vl", precision, "deepstack"), _traced(more - fewer),
             _listed({"forward": level, "backward": backward(level)}))


@pytest.mark.parametrize("images", [1, 2])
@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "qwen3_vl"])
def test_tower_op_flops_equal_the_tower_flops(family, images):
    """The op list's tower GEMMs and attention (count x FLOPs) against analytic/vlm.py's and siglip.py's tower FLOPs,
    written apart from it (the hand derivation in test_vlm_analytic.py test_tower_flops_by_hand): equal forward; the
    backward's GEMMs twice the forward's less the patch embedding's (no input gradient for the pixels)."""
    from trainfit.analytic.ops.vision_tower import tower_lists
    from trainfit.analytic.vlm import tower_forward_flops

    spec = {"qwen2_5_vl": lambda: small_qwen2_5_vl(2, [1]), "gemma3": lambda: small_gemma3(2),
            "qwen3_vl": lambda: small_qwen3_vl(2, [])}[family]()
    setup = language_setup(spec, Setup(batch=2, seq=128, precision="bf16", device="cuda", images=images,
                                       image_size=112))
    lm = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    lists = tower_lists(spec, setup, lm)
    fwd = sum(count * op.flops for count, ops, _ in lists for op in ops)
    assert fwd == pytest.approx(tower_forward_flops(spec, setup), rel=1e-12)
    gemm = sum(count * op.flops for count, ops, _ in lists for op in ops if op.kind == "gemm")
    patch = sum(op.flops for op in lists[0][1] if op.name == "patch_embed")
    assert sum(count * op.flops for count, _, ops in lists for op in ops if op.kind == "gemm") == \
        pytest.approx(2 * gemm - patch, rel=1e-12)


@pytest.mark.heavy
@pytest.mark.parametrize("precision", PRECISIONS)
def test_gemma3_language_layer_with_images_matches_the_op_list(precision):
    """Gemma 3's language-model layer in a step with images (a 3-layer less a 2-layer language model, the 2-block
    tower and one image per sample in both): every layer's SDPA gets the image-block mask, so transformers repeats k
    and v and SDPA makes the boolean mask additive (ops/layer.py chunk_mask_ops, Shape.masked); compared as
    test_ops_vs_trace.py compares a text layer."""
    from test_ops_vs_trace import _compare as compare_layer, _language_layers, listed_layer

    spec = small_gemma3(2)
    setup = Setup(batch=2, seq=128, precision=precision, device="cuda", images=1, image_size=112)

    def counted(n):
        return Counter(_trace_key(k) for k in _kernels(_language_layers(spec, n), setup))
    more, fewer = counted(3), counted(2)
    assert not fewer - more
    lm_setup = language_setup(spec, setup)
    compare_layer("gemma3", more - fewer, *listed_layer(spec, lm_setup))


def test_qwen3_vl_deepstack_levels_add_their_mergers_flops():
    """Each deepstack level adds a merger's two Linears over the merged rows, derived by hand: 2 x (n / merge^2) x
    (m^2 + m x out_hidden) FLOPs forward with m = hidden x merge^2 (its adds are memory-bound), twice that backward
    (the stream's gradient flows through it: dgrad and wgrad)."""
    from trainfit.analytic.ops.vision_tower import tower_lists

    setup = language_setup(small_qwen3_vl(2, []), Setup(batch=2, seq=128, precision="bf16", device="cuda", images=2,
                                                         image_size=112))

    def flops(deepstack):
        spec = small_qwen3_vl(2, deepstack)
        lm = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
        lists = tower_lists(spec, setup, lm)
        return (sum(c * op.flops for c, ops, _ in lists for op in ops),
                sum(c * op.flops for c, _, ops in lists for op in ops if op.kind == "gemm"))

    n, m, out = 2 * 2 * (112 // 14) ** 2, 64 * 4, HIDDEN  # patch rows: batch x images x 8 x 8; the text width
    level = 2 * (n / 4) * (m * m + m * out)
    (f0, b0), (f2, b2) = flops([]), flops([0, 1])
    assert f2 - f0 == pytest.approx(2 * level, rel=1e-12)
    assert b2 - b0 == pytest.approx(2 * 2 * level, rel=1e-12)
    # timed through analytic/tower_time.py (the CLI refuses Qwen3-VL until its memory terms exist): the levels add
    # forward and backward time, and no re-run under full recompute (they lie outside the checkpointed blocks)
    from trainfit.analytic.tower_time import tower_times
    from trainfit.hardware import get_gpu

    def times(deepstack):
        spec = small_qwen3_vl(2, deepstack)
        return tower_times(spec, replace(setup, recompute="full"), get_gpu("h100"),
                           shape_of(spec, setup, state_bytes(setup), compute_dtype(setup)))
    (tf0, tb0, tr0), (tf2, tb2, tr2) = times([]), times([0, 1])
    assert tf2.seconds > tf0.seconds > 0 and tb2.seconds > tb0.seconds > 0
    assert tr2.seconds == tr0.seconds > 0


def small_mllama(depth: int = 2, global_layers: int = 1, layers: int = 3, cross: tuple = (1,)):
    """test_mllama_analytic.py's small Llama 3.2 Vision: a tower of width 64 (2 heads) with `depth` local and
    `global_layers` gated layers over 56-pixel tiles (4 x 4 patches + the class token, padded to 24 rows; 4 tiles
    an image), its layer 0's output concatenated to the last; a language model of `layers` layers, cross-attention
    at `cross`."""
    c = shrink(CONFIGS["mllama"])
    c["text_config"] = {**c["text_config"], "num_hidden_layers": layers, "cross_attention_layers": list(cross)}
    c["vision_config"] = {**c["vision_config"], "num_hidden_layers": depth, "num_global_layers": global_layers,
                          "hidden_size": 64, "intermediate_size": 128, "attention_heads": 2, "image_size": 56,
                          "intermediate_layers_indices": [0], "vision_output_dim": 128}
    return spec_from_config(c, "small-mllama")


def _mllama_region(kernels) -> list:
    """The tower's kernels of a Llama 3.2 Vision trace: in the forward everything before the language model's
    embedding (the last embedding lookup: the pixels' casts, the tower, the projector, the cross-attention masks);
    in the backward everything after its embedding backward (autograd runs the tower's backward last)."""
    fwd = [k for k in kernels if k.phase == "forward"]
    bwd = [k for k in kernels if k.phase == "backward"]
    emb = max(i for i, k in enumerate(fwd) if k.op == "embedding")
    emb_bwd = min(i for i, k in enumerate(bwd) if k.op == "embedding_dense_backward")
    return fwd[:emb] + bwd[emb_bwd + 1:]


@pytest.mark.heavy
@pytest.mark.parametrize("precision", PRECISIONS)
def test_mllama_tower_and_cross_layer_kernels_match_the_op_list(precision):
    """Llama 3.2 Vision (ops/mllama_tower.py): a local and a global (gated) encoder layer, each a tower with one more
    less the base tower (2 local + 1 global); the tower's ends (the trace's tower region, _mllama_region, less the
    base's three layers); a cross-attention layer, a 4-layer language model with cross-attention at 1 and 2 less the
    base's (cross-attention at 1)."""
    from trainfit.analytic.ops.mllama_tower import (cross_grad_accumulations, encoder_layer, ends_after,
                                                    ends_forward, tower_shape as tiled_shape)
    from trainfit.analytic.ops.mllama_tower import block_grad_accumulations as tiled_accumulations
    from trainfit.analytic.tower_time import cross_layer_forward
    from trainfit.analytic.ops.vision_tower import ends_backward as tower_ends_backward

    setup = Setup(batch=2, seq=128, precision=precision, device="cuda", images=1, image_size=56)
    base = small_mllama()
    kernels = _kernels(base, setup)
    fewer = _counted(kernels)
    lm_setup = language_setup(base, setup)
    lm = shape_of(base, lm_setup, state_bytes(lm_setup), compute_dtype(lm_setup))
    sh = tiled_shape(base, lm_setup, lm)
    images = setup.batch * setup.images
    layers = Counter()
    for kind, spec, gated in (("local", small_mllama(depth=3), False), ("global", small_mllama(global_layers=2),
                                                                          True)):
        more = _counted(_kernels(spec, setup))
        assert not fewer - more, f"a smaller tower launched kernels a larger one did not ({kind})"
        layer = more - fewer
        layers += layer + (layer if not gated else Counter())  # the base: 2 local layers, 1 global
        fwd = encoder_layer(base, sh, images, gated)
        _compare(("mllama", precision, kind), _traced(layer),
                 _listed({"forward": fwd, "backward": backward(fwd) + tiled_accumulations(base, sh)}))
    region = _counted(_mllama_region(kernels))
    assert not layers - region, "the encoder layers' kernels lie in the tower region"
    ends = ends_forward(base, sh, lm, images) + ends_after(base, sh, lm, images)
    _compare(("mllama", precision, "ends"), _traced(region - layers),
             _listed({"forward": ends, "backward": tower_ends_backward(ends)}))
    more = _counted(_kernels(small_mllama(layers=4, cross=(1, 2)), setup))
    assert not fewer - more, "a language model with one cross-attention layer less launched kernels of its own"
    fwd = cross_layer_forward(base, lm_setup, lm)
    _compare(("mllama", precision, "cross"), _traced(more - fewer),
             _listed({"forward": fwd, "backward": backward(fwd) + cross_grad_accumulations(base, lm, setup.images)}))


@pytest.mark.parametrize("images", [1, 2])
def test_mllama_op_flops_equal_the_analytic_flops(images):
    """Llama 3.2 Vision's op lists (the tower's, ops/mllama_tower.py, and a cross-attention layer's less the
    self-attention layer's it replaces, times the cross-attention layers) against analytic/mllama.py's
    tower_forward_flops, written apart from them: equal forward, the aspect-ratio mask's outer product aside (a k = 1
    matmul analytic/mllama.py leaves out, no gradient); the tower's backward GEMMs twice its forward's less the
    patch embedding's (no input gradient for the pixels)."""
    from trainfit.analytic.mllama import tower_forward_flops
    from trainfit.analytic.ops import layer_forward
    from trainfit.analytic.ops.vision_tower import tower_lists
    from trainfit.analytic.tower_time import cross_layer_forward

    spec = small_mllama()
    setup = language_setup(spec, Setup(batch=2, seq=128, precision="bf16", device="cuda", images=images,
                                       image_size=56))
    lm = shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))
    lists = tower_lists(spec, setup, lm)
    tower = sum(count * op.flops for count, ops, _ in lists for op in ops if op.name != "vmask_outer")
    cross = sum(op.flops for op in cross_layer_forward(spec, setup, lm)) - sum(op.flops for op in
                                                                               layer_forward(spec, lm))
    assert tower + len(spec.vision.cross_layers) * cross == pytest.approx(tower_forward_flops(spec, setup),
                                                                          rel=1e-12)
    gemm = sum(count * op.flops for count, ops, _ in lists for op in ops if op.kind == "gemm" and op.grad)
    patch = sum(op.flops for op in lists[0][1] if op.name == "patch_embed")
    assert sum(count * op.flops for count, _, ops in lists for op in ops if op.kind == "gemm") == \
        pytest.approx(2 * gemm - patch, rel=1e-12)
