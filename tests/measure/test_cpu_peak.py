"""The measure engine's ground truth: the CPU peak reconstructed from c10's allocation records.

1. A hand derivation (Linear + sum + SGD) checked to the byte.
2. Steady-state bookkeeping on a tiny GPT-2 (weights, grads, Adam state) checked against counts.
3. Peak linear in batch; full recompute lowers it.
4. The standard step runs for gpt2 / llama / bert under fp32, amp-bf16, bf16, bf16-master, grad_accum 2,
   and under FakeTensorMode / meta (what the trace engine does).
"""
from __future__ import annotations

import math
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.errors import EngineUnavailableError  # noqa: E402
from trainfit.measure import measure, to_estimate  # noqa: E402
from trainfit.measure.cpu_peak import cpu_peak, storage_bytes  # noqa: E402
from trainfit.setup import Setup  # noqa: E402
from trainfit.spec import ModelSpec  # noqa: E402
from trainfit.step import build_model, make_batches, make_optimizer, prepare, run_step  # noqa: E402
from trainfit.step.standard import MasterWeightOptimizer  # noqa: E402

# ---------------------------------------------------------------- tiny specs

TINY = {
    "gpt2": dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128),
    "llama": dict(
        model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=1000, max_position_embeddings=128,
    ),
    "bert": dict(
        model_type="bert", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=1000, max_position_embeddings=128,
    ),
}


def tiny_spec(family: str) -> ModelSpec:
    cfg = dict(TINY[family])
    try:  # the real adapter, once it exists
        from trainfit.models.hf_config import spec_from_config

        return spec_from_config(cfg, f"tiny-{family}")
    except ImportError:
        return ModelSpec(
            name=f"tiny-{family}", family=family, causal=family != "bert", hidden=64, layers=2, heads=4,
            kv_heads=2 if family == "llama" else 4, head_dim=16, intermediate=128, vocab=1000,
            max_positions=128, gated_mlp=family == "llama", config=cfg,
        )


def cpu_setup(**kw) -> Setup:
    base = dict(batch=2, seq=32, precision="fp32", optimizer="adamw", device="cpu")
    base.update(kw)
    return Setup(**base)


# ---------------------------------------------------------------- 1. hand derivation

B, IN, OUT = 64, 32, 16
F32 = 4


class _LinearSum(torch.nn.Module):
    """model(input_ids=x).loss = Linear(x).sum(): the smallest thing run_step can drive."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(IN, OUT))

    def forward(self, input_ids):
        return types.SimpleNamespace(loss=self.net(input_ids).sum())


def test_hand_derived_peak_linear_sgd():
    torch.manual_seed(0)
    model = _LinearSum()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)  # plain SGD: no state
    batches = [{"input_ids": torch.randn(B, IN)}]
    setup = cpu_setup(batch=B, seq=IN, optimizer="sgd")
    run_step(model, opt, batches, setup)  # warm-up (steady state: grads None, nothing else resident)

    W, b, x = OUT * IN * F32, OUT * F32, B * IN * F32  # 2048, 64, 8192
    baseline = storage_bytes(list(model.parameters()) + [batches[0]["input_ids"]])
    assert baseline == W + b + x == 10304

    res, _ = cpu_peak(lambda phase: run_step(model, opt, batches, setup, phase), baseline)

    out = B * OUT * F32  # addmm output, 4096
    scalar = F32  # a 0-d fp32 tensor
    divisor = 8  # `loss / n`: n becomes a 0-d int64 tensor, saved by DivBackward0
    # forward: out (4096) + sum's scalar; then out is freed (sum saves no input, addmm saves x and W)
    fwd_peak = baseline + out + scalar
    # end of forward: sum scalar freed with the model output; alive: divisor (8) + loss (4)
    fwd_end = baseline + divisor + scalar
    # backward: grad of loss (ones_like, 4) -> DivBackward0 grad (4) [a 4-byte cast of n is freed
    # before]; divisor released; AddmmBackward0: grad W = mm(grad_out.t(), x) allocates 2048, and mm
    # clones the stride-0 expanded grad_out into a contiguous (B, OUT) buffer (4096) inside the kernel.
    # This is the peak: loss + ones + div-grad + grad W + clone.
    bwd_peak = baseline + scalar + scalar + scalar + W + out
    # optimizer: grads W + b and the loss tensor are alive; SGD updates in place
    opt_start = baseline + W + b + scalar
    # before it, the HF Trainer's clip_grad_norm_(max_norm=1.0) (torch/nn/utils/clip_grad.py): two per-tensor norms
    # and their stack (4 + 4 + 8) make the total norm (4), then freed; clip_coef = 1.0 / (total + 1e-6): the add's
    # output (4), then Tensor.__rtruediv__ = reciprocal (4) * 1.0, the Python float wrapped as a 0-d double (8) that
    # mul casts to fp32 (4) beside its output (4). Its high point: total + add + reciprocal + double + cast + mul
    clip = scalar + scalar + scalar + 8 + scalar + scalar
    assert res.phase_peaks["forward"] == fwd_peak == 14404
    assert res.live_at("backward") == fwd_end == 10316
    assert res.phase_peaks["backward"] == bwd_peak == 16460
    assert res.peak == bwd_peak and res.peak_phase == "backward"
    assert res.live_at("optimizer") == opt_start == 12420
    assert res.phase_peaks["optimizer"] == opt_start + clip == 12448
    # after zero_grad(set_to_none) only the loss (freed when run_step returns) is left
    assert res.live_at("end") == baseline + scalar
    assert res.end == baseline
    assert res.foreign_frees == 0


def test_hand_derived_adam_temporaries():
    """Adam (foreach=False, torch.optim.adam._single_tensor_adam) allocates per-parameter temporaries in
    step(): denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) -> two numel-sized tensors."""
    torch.manual_seed(0)
    model = _LinearSum()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    batches = [{"input_ids": torch.randn(B, IN)}]
    setup = cpu_setup(batch=B, seq=IN, optimizer="adam")
    run_step(model, opt, batches, setup)
    W, b = OUT * IN * F32, OUT * F32
    states = storage_bytes([t for s in opt.state.values() for t in s.values()])
    assert states == 2 * (W + b) + 2 * F32  # exp_avg + exp_avg_sq, and a 0-d fp32 `step` per param
    baseline = storage_bytes(list(model.parameters()) + [batches[0]["input_ids"]]) + states
    res, _ = cpu_peak(lambda phase: run_step(model, opt, batches, setup, phase), baseline)
    opt_start = baseline + W + b + F32  # grads + loss
    assert res.live_at("optimizer") == opt_start
    # largest transient in step(), at the weight's `exp_avg_sq.sqrt() / bias_correction2_sqrt`:
    # sqrt's output (W) + the Python float wrapped as a 0-d float64 tensor (8) + its cast to fp32 (4)
    # + div's output (W). (The weight's `denom` then lingers in the for-loop variable while the bias is
    # stepped, but W + the bias's 2*b + 12 is smaller.)
    assert res.phase_peaks["optimizer"] == opt_start + W + 8 + 4 + W == 20760
    assert res.peak == max(res.phase_peaks.values())


# ---------------------------------------------------------------- 2. bookkeeping on a real model


def test_steady_state_categories_gpt2_adamw():
    spec = tiny_spec("gpt2")
    r = measure(spec, cpu_setup(), steps=1)
    model = build_model(spec, cpu_setup())
    n_tensors = len(list(model.parameters()))  # tied embedding counted once
    n_params = sum(p.numel() for p in model.parameters())
    assert r.params == n_params
    assert r.weights == 4 * n_params + sum(b.numel() * b.element_size() for b in model.buffers())
    assert r.gradients == 4 * n_params  # every parameter has an fp32 grad at the end of backward
    assert r.optimizer_states == 8 * n_params + 4 * n_tensors  # exp_avg, exp_avg_sq, step
    assert r.inputs == 2 * 2 * 32 * 8  # input_ids + labels, int64
    assert r.baseline == r.weights + r.optimizer_states + r.inputs
    assert r.peak >= r.baseline + r.gradients
    assert r.peak == max(r.phase_peaks.values())
    assert r.activations > 0 and r.step_seconds > 0 and r.tokens_per_second > 0
    assert not any("differ" in n or "foreign" in n for n in r.notes), r.notes
    e = to_estimate(r, spec, cpu_setup())
    assert e.engine == "measure" and e.memory.peak == r.peak
    assert set(e.memory.phases) <= {"forward_end", "backward", "optimizer_step"}
    assert e.memory.peak_phase in e.memory.phases
    # the report's rows: what the records cannot separate is shown as the rest of the peak, not as 0 B temporaries
    from trainfit.report.terminal import memory_rows
    rows = dict(memory_rows(e))
    assert "temporaries at the peak" not in rows
    assert rows["gradients, activations, temporaries at the peak (not separated)"] == r.peak - r.baseline > r.gradients


def test_bf16_master_categories():
    spec = tiny_spec("llama")
    setup = cpu_setup(precision="bf16-master", optimizer="adam")
    r = measure(spec, setup, steps=1)
    n = r.params
    assert r.weights == 2 * n + _buffer_bytes(spec, setup)  # bf16 params
    assert r.master_weights == 4 * n  # fp32 master copy
    assert r.gradients == 2 * n  # bf16 grads
    assert r.optimizer_states == 8 * n + 4 * len(list(build_model(spec, setup).parameters()))
    # during step() every grad also exists as an fp32 copy (4 bytes/param) on top of the bf16 grads
    assert r.phase_peaks["optimizer"] >= r.baseline + r.gradients + 4 * n


def _buffer_bytes(spec, setup):
    m = build_model(spec, setup)
    return storage_bytes(list(m.buffers()))


# ---------------------------------------------------------------- 3. scaling


@pytest.mark.heavy  # ~5 s of real steps at several sizes
def test_peak_linear_in_batch_and_recompute_lowers_it():
    """Eager attention: every saved tensor scales with the batch, so equal steps in the peak, to the byte.
    (With SDPA and dropout > 0, CPU SDPA takes the math path whose (seq, seq) causal mask is batch
    independent, so batch 1 -> 2 differs from 2 -> 3 by that constant.)"""
    spec = tiny_spec("gpt2")
    peaks = [measure(spec, cpu_setup(batch=b, seq=64, attention="eager", optimizer="sgd"), steps=1).peak for b in (1, 2, 3)]
    assert peaks[0] < peaks[1] < peaks[2]
    assert peaks[2] - peaks[1] == peaks[1] - peaks[0]
    full = measure(spec, cpu_setup(batch=3, seq=64, attention="eager", optimizer="sgd", recompute="full"), steps=1)
    assert full.peak < peaks[2]
    assert full.activations < measure(spec, cpu_setup(batch=3, seq=64, attention="eager", optimizer="sgd"), steps=1).activations


# ---------------------------------------------------------------- 4. the step runs for each family


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16", "bf16-master"])
def test_run_step_families(family, precision):
    spec = tiny_spec(family)
    setup = cpu_setup(precision=precision, grad_accum=2, batch=1, seq=16)
    model, opt, batches = prepare(spec, setup)
    assert len(batches) == 2 and batches[0]["input_ids"].shape == (1, 16)
    want = torch.bfloat16 if precision in ("bf16", "bf16-master") else torch.float32
    assert all(p.dtype == want for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    loss = run_step(model, opt, batches, setup, seen.append)
    assert seen == ["forward", "backward", "forward", "backward", "optimizer", "end"]
    assert math.isfinite(loss) and loss > 0
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    if precision == "bf16-master":
        assert isinstance(opt, MasterWeightOptimizer)
        assert all(m.dtype == torch.float32 for m in opt.master_params)
        assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items() if k != "step")


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw", "adafactor"])
def test_optimizers(name):
    spec = tiny_spec("llama")
    setup = cpu_setup(optimizer=name, batch=1, seq=8)
    model, opt, batches = prepare(spec, setup)
    assert math.isfinite(run_step(model, opt, batches, setup))


def test_unavailable(monkeypatch):
    spec = tiny_spec("gpt2")
    model = build_model(spec, cpu_setup(batch=1, seq=8))
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim", None)  # as if bitsandbytes were not installed
    for name in ("adamw-8bit", "lion"):
        with pytest.raises(EngineUnavailableError, match=r"trainfit\[bnb\]"):
            make_optimizer(model, cpu_setup(optimizer=name))
    with pytest.raises(EngineUnavailableError, match="selective"):
        prepare(spec, cpu_setup(recompute="selective", attention="eager", batch=1, seq=8))


def test_step_under_fake_and_meta():
    """The trace engine builds and steps the same model with fake / meta tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    spec = tiny_spec("llama")
    setup = cpu_setup(precision="amp-bf16", batch=2, seq=16, grad_accum=2, recompute="full")
    with FakeTensorMode():
        model, opt, batches = prepare(spec, setup)
        assert is_fake(next(model.parameters()))
        assert math.isnan(run_step(model, opt, batches, setup))
    meta = cpu_setup(batch=1, seq=8, optimizer_impl="foreach")  # torch.optim refuses fused=True on meta tensors
    model, opt, batches = prepare(spec, meta, device="meta")
    assert next(model.parameters()).device.type == "meta"
    assert math.isnan(run_step(model, opt, batches, meta))


def test_mlm_batches_and_labels():
    spec = tiny_spec("bert")
    b = make_batches(spec, cpu_setup(batch=2, seq=8, grad_accum=3))
    assert len(b) == 3 and set(b[0]) == {"input_ids", "labels"}
    assert torch.equal(b[0]["input_ids"], b[0]["labels"]) and b[0]["labels"] is not b[0]["input_ids"]
    assert int(b[0]["input_ids"].max()) < spec.vocab
