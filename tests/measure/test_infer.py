"""The measure engine's inference ground truth (prefill + one decode step), checked by hand.

KV cache of a llama-style model (HF DynamicCache, one K and one V per layer, GQA: kv_heads heads):
    2 · layers · kv_heads · head_dim · batch · tokens · bytes
tiny-llama (catalog): 4 layers, 2 kv heads, head_dim 32.
"""
from __future__ import annotations

import pytest

from trainfit.analytic.inference import values_keep_their_dtype

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.errors import EngineUnavailableError, SetupError  # noqa: E402
from trainfit.measure import measure, measure_inference, to_estimate  # noqa: E402
from trainfit.measure.cpu_peak import cpu_peak, storage_bytes  # noqa: E402
from trainfit.measure.infer import cache_bytes, inference_step, prepare_inference  # noqa: E402
from trainfit.models.resolve import load_model  # noqa: E402
from trainfit.setup import Setup  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 32
B, S = 2, 64


def infer_setup(**kw) -> Setup:
    base = dict(batch=B, seq=S, precision="bf16", device="cpu", mode="infer")
    base.update(kw)
    return Setup(**base)


@pytest.fixture(scope="module")
def llama():
    spec = load_model("tiny-llama")
    assert (spec.layers, spec.kv_heads, spec.head_dim) == (LAYERS, KV_HEADS, HEAD_DIM)
    return spec


@pytest.fixture(scope="module")
def bf16_measured(llama):
    """`measure` of the bf16 prefill + decode with one timed run (it dispatches to measure_inference with the same
    arguments), once per module: the by-hand bf16 case and the dispatch check read the same result (not changed by
    either: to_estimate only reads it)."""
    return measure(llama, infer_setup(), steps=1)


def kv(tokens: int, nbytes: int, batch: int = B) -> int:
    return 2 * LAYERS * KV_HEADS * HEAD_DIM * batch * tokens * nbytes


# amp-bf16: K is fp32 (4 bytes), not bf16: under autocast the K/V projections return bf16, but llama's rotary
# embedding returns cos/sin in the hidden states' dtype (fp32 weights -> fp32 embeddings), so q*cos +
# rotate_half(q)*sin promotes K to fp32. V: bf16 from transformers 5.24 (DynamicLayer allocates it in its own dtype),
# K's fp32 before (cache_utils.py lazy_initialization): per K/V pair 3 bytes a value on average, or 4.
AMP_KV = 3 if values_keep_their_dtype() else 4


@pytest.mark.parametrize("precision,nbytes", [("bf16", 2), ("fp32", 4), ("fp16", 2), ("amp-bf16", AMP_KV)])
def test_kv_cache_by_hand(request, llama, precision, nbytes):
    # bf16: the timed run, measure's (the same measure_inference call: test_measure_dispatches_and_estimate)
    r = (request.getfixturevalue("bf16_measured") if precision == "bf16" else
         measure_inference(llama, infer_setup(precision=precision), steps=0))
    assert r.mode == "infer"
    assert r.kv_cache == kv(S, nbytes)  # bf16: 2·4·2·32·2·64·2 = 131072
    assert r.kv_cache_decode == kv(S + 1, nbytes)  # the decode step appends one token
    weight_bytes = 4 if precision in ("fp32", "amp-bf16") else 2  # amp-*: fp32 weights under autocast
    buffers = storage_bytes(list(prepare_inference(llama, infer_setup(precision=precision))[0].buffers()))
    assert r.weights == weight_bytes * r.params + buffers
    assert r.inputs == B * S * 8  # int64 prompt ids
    assert r.baseline == r.weights + r.inputs
    assert set(r.phase_peaks) == {"prefill", "decode"}
    assert r.peak == max(r.phase_peaks.values()) and r.peak_phase in ("prefill", "decode")
    assert r.phase_peaks["decode"] > r.baseline + r.kv_cache_decode
    assert r.gradients == 0 and r.optimizer_states == 0
    if precision == "bf16":  # timed runs (prefill and decode medians)
        assert r.step_seconds > 0 and r.decode_seconds > 0 and r.tokens_per_second > 0
    assert not any("foreign" in n for n in r.notes), r.notes


@pytest.mark.heavy  # ~4 s of real inference steps: the by-hand KV cases stay in the default run
def test_kv_cache_linear_in_batch_and_seq(llama):
    a = measure_inference(llama, infer_setup(batch=1, seq=32), steps=0)
    b = measure_inference(llama, infer_setup(batch=3, seq=96), steps=0)
    assert a.kv_cache == kv(32, 2, batch=1) and b.kv_cache == kv(96, 2, batch=3) == 9 * a.kv_cache


def test_live_bytes_at_phase_boundaries(llama):
    """At the decode boundary exactly weights + ids + the cache (seq tokens) + next_ids (batch·1 int64)
    are live: the prefill's logits and activations are gone. After decode: the cache holds seq + 1."""
    setup = infer_setup()
    torch.manual_seed(0)
    model, ids, _ = prepare_inference(llama, setup)  # (no image inputs: a text model)
    inference_step(model, ids, setup)  # warm-up
    baseline = storage_bytes(list(model.parameters()) + list(model.buffers()) + [ids])
    sizes = []
    res, cache = cpu_peak(lambda ph: inference_step(model, ids, setup, True, ph, lambda c: sizes.append(cache_bytes(c))),
                          baseline)
    next_ids = B * 1 * 8
    assert sizes == [kv(S, 2), kv(S + 1, 2)]
    assert res.live_at("prefill") == baseline
    assert res.live_at("decode") == baseline + kv(S, 2) + next_ids
    assert res.live_at("end") == baseline + kv(S + 1, 2) + next_ids
    assert res.end == baseline + kv(S + 1, 2)  # the returned cache is still referenced
    assert cache_bytes(cache) == kv(S + 1, 2)
    assert res.foreign_frees == 0


def test_measure_dispatches_and_estimate(llama, bf16_measured):
    setup = infer_setup()
    r = bf16_measured
    assert r.mode == "infer" and r.kv_cache == kv(S, 2)
    e = to_estimate(r, llama, setup)
    assert e.engine == "measure" and e.memory.peak == r.peak
    assert set(e.memory.phases) == {"prefill", "decode"} and e.memory.peak_phase in e.memory.phases
    assert e.memory.kv_cache == kv(S, 2)
    assert e.time.prefill_seconds > 0 and e.time.decode_tokens_per_second > 0
    assert e.memory.gradients == 0 and e.memory.optimizer_states == 0


def test_encoder_has_no_cache():
    spec = load_model("tiny-bert")
    r = measure_inference(spec, infer_setup(seq=32), steps=0)
    assert r.kv_cache == 0 and set(r.phase_peaks) == {"prefill"} and r.peak_phase == "prefill"


@pytest.mark.parametrize("precision", ["int8", "int4", "fp8"])
def test_quantised_refused(llama, precision):
    with pytest.raises(EngineUnavailableError, match="quantised"):
        measure_inference(llama, infer_setup(precision=precision))


def test_refusals(llama):
    with pytest.raises(EngineUnavailableError, match="kv-dtype"):
        measure_inference(llama, infer_setup(kv_dtype="fp8"))
    with pytest.raises(EngineUnavailableError, match="kv-dtype"):
        measure_inference(llama, infer_setup(kv_dtype="fp32", batch=1, seq=8))  # bf16 weights -> bf16 cache
    measure_inference(llama, infer_setup(kv_dtype="bf16", batch=1, seq=8), steps=0)  # the natural dtype is fine
    measure_inference(llama, infer_setup(precision="amp-bf16", kv_dtype="fp32", batch=1, seq=8), steps=0)
    with pytest.raises(SetupError):
        measure_inference(llama, Setup(batch=1, seq=8, precision="fp32", device="cpu"))  # train mode


def test_decode_past_learned_positions_refused():
    spec = load_model("tiny-gpt2")  # 512 learned positions: the decode token of a 512-token prompt has none
    with pytest.raises(SetupError, match="positions"):
        measure_inference(spec, infer_setup(seq=spec.max_positions))
