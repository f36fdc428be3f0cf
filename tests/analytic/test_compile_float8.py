"""--compile and --float8 (analytic/compile_effects.py, analytic/float8.py) against independent sources:
  * real CPU steps compiled by inductor (torch.compile works on CPU with a C++ compiler): torchtitan's own Llama block
    (per-layer saved bytes at the forward's end, from PyTorch's allocation records) with no recompute and op SAC,
    with torchao's Float8Linear (real fp8 GEMMs on CPU); the compiled cross-entropy; the HF model through the measure
    engine (whole-step peak);
  * hand derivations: the fp8 FSDP all-gather's bytes, the fp8 GEMM time;
  * torchtitan's published direction (calibration C2, Llama-3.1-8B FSDP 8 op SAC): compile reduces memory and
    compile + Float8 takes no more than compile; Float8 raises throughput.
"""
import json
import shutil

import pytest

from trainfit.analytic import compile_effects, float8
from trainfit.analytic.engine import estimate
from trainfit.analytic.precision import state_bytes
from trainfit.analytic.step_time import layout_step_time
from trainfit.errors import EngineUnavailableError, SetupError
from trainfit.hardware import get_gpu
from trainfit.models.resolve import load_model
from trainfit.setup import Setup
from trainfit.spec import ModelSpec

GIB = 2**30


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3.1-8b")


def c2(**kw) -> Setup:
    """Calibration C2: Llama-3.1-8B on 8 H100s, FSDP 8, seq 8192, local batch 2, op SAC (shared/calibration.md)."""
    return Setup(batch=2, seq=8192, stack="torchtitan", recompute="op", dp=8, zero=3, **kw)


# -- settings: declared once, refused in one line where the stack or GPU cannot run them -------------------------
def test_float8_is_refused_for_the_hf_stack_in_one_line():
    with pytest.raises(SetupError) as e:
        Setup(low_precision="tensorwise")
    assert "--low-precision" in str(e.value) and "--stack torchtitan" in str(e.value) and "\n" not in str(e.value)


def test_float8_is_refused_on_a_gpu_without_fp8_tensor_cores(llama8b):
    with pytest.raises(SetupError) as e:
        estimate(llama8b, c2(low_precision="tensorwise", fp8_all_gather=True), get_gpu("A100-80GB"))
    assert "fp8 tensor cores" in str(e.value) and "\n" not in str(e.value)
    estimate(llama8b, c2(low_precision="tensorwise", fp8_all_gather=True), get_gpu("L40S"))  # Ada has them


def test_the_flags_reach_the_json_and_the_notes_say_what_was_modelled(cli):
    code, out, _ = cli("estimate", "llama-3.1-8b", "--stack", "torchtitan", "--recompute", "op", "--dp", "8",
                       "--zero", "3", "--compile", "--low-precision", "tensorwise", "--fp8-all-gather", "--gpu", "H100", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["setup"]["compile"] is True and d["setup"]["low_precision"] == "tensorwise"
    notes = " ".join(d["notes"])
    assert "compile:" in notes and "float8:" in notes and notes.count("NB") >= 3


def test_engines_that_cannot_run_them_refuse():
    from trainfit import engines

    spec = load_model("tiny-llama")
    with pytest.raises(SetupError, match="--compile is modelled"):
        engines.trace(spec, Setup(compile=True, device="cpu"))
    # --low-precision runs in both (torchao's Float8Linear on CPU): tests/stacks/test_torchtitan_float8_engines.py
    with pytest.raises((SetupError, EngineUnavailableError), match="--low-precision mxfp8"):
        engines.measure(spec, Setup(low_precision="mxfp8", stack="torchtitan", device="cpu"))


def test_a_block_the_model_does_not_cover_keeps_eager_and_says_so():
    spec = load_model("gpt2")
    eager, compiled = estimate(spec, Setup(seq=1024)), estimate(spec, Setup(seq=1024, compile=True))
    assert compiled.memory.peak == eager.memory.peak
    assert any("not modelled" in n and "over-reads" in n for n in compiled.notes)


# -- hand derivations ---------------------------------------------------------------------------------------------
def test_fp8_all_gather_halves_the_gathered_projection_weights(llama8b):
    """FSDP2 gathers the current and the prefetched block (parallel/zero.py); with the fp8 all-gather each of the
    seven projections arrives in fp8 (1 byte) instead of bf16 (2), plus an fp32 scale each (torchao fsdp_utils.py
    fsdp_pre_all_gather). Llama-3.1-8B per block: q, o 4096² each, k, v 4096×1024 each, gate, up, down 4096×14336."""
    per_block = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert per_block == 218_103_808
    by_hand = 2 * (per_block * (2 - 1) - 7 * 4)
    base = estimate(llama8b, c2(compile=True)).detail.records["zero3_gathered_params"]
    fp8 = estimate(llama8b, c2(compile=True, low_precision="tensorwise", fp8_all_gather=True)).detail.records["zero3_gathered_params"]
    assert base - fp8 == by_hand
    # without FSDP sharding torchtitan does not enable the fp8 all-gather (float8.py:87-90)
    assert float8.gathered_saving(llama8b, Setup(stack="torchtitan", low_precision="tensorwise"), None) == 0


def test_float8_matmuls_run_at_the_fp8_peak(llama8b):
    """The projections' three GEMMs each (forward, dgrad, wgrad) run in fp8: at H100's fp8 dense peak (1978.9 vs
    989.4 TFLOP/s bf16, data/gpus.json) times the measured fp8 / bf16 fractions (MAMF, data/kernels.toml); the LM
    head and attention stay bf16. All of C2's GEMMs are compute-bound with the same tiles in both dtypes, so the GEMM
    time shrinks to f/r + 1 - f, f the projections' share of the step's GEMM FLOPs: per token 3 × (forward) for the
    32 layers' projections and the LM head, plus the op-SAC re-run of wk, wo, w3 (every second mm; fp8 too)."""
    from trainfit.analytic.roofline import kernels_for

    gpu = get_gpu("H100")
    s, s8 = c2(compile=True), c2(compile=True, low_precision="tensorwise", fp8_all_gather=True)
    proj = 32 * 2 * 218_103_808
    rerun = 32 * 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)
    head = 2 * 128256 * 4096
    f = (3 * proj + rerun) / (3 * proj + rerun + 3 * head)
    kn = kernels_for(gpu)
    r = (1978.9 * kn.matmul("fp8")) / (989.4 * kn.matmul("bf16"))
    a, b = layout_step_time(llama8b, s, gpu), layout_step_time(llama8b, s8, gpu)
    # (f is a FLOP share; wave quantisation gives each GEMM shape a slightly different time per FLOP: < 0.1%)
    assert b.compute_terms["gemm"] / a.compute_terms["gemm"] == pytest.approx(f / r + 1 - f, rel=1e-3)
    assert b.compute_terms["attention"] == pytest.approx(a.compute_terms["attention"], rel=1e-12)
    assert b.compute_terms["memory"] > a.compute_terms["memory"]  # amax and cast passes over every fp8 operand
    assert 0.9 < f < 0.95


# -- C2's published direction (torchtitan benchmarks, H100, max_reserved 82.4 -> 77.0 -> 76.8 GiB) -----------------
def test_c2_compile_reduces_memory_and_float8_adds_none(llama8b):
    gpu = get_gpu("H100")
    eager, comp, fp8 = (estimate(llama8b, c2(**kw), gpu) for kw in ({}, {"compile": True},
                                                                        {"compile": True, "low_precision": "tensorwise", "fp8_all_gather": True}))
    assert comp.memory.peak < eager.memory.peak
    assert fp8.memory.peak <= comp.memory.peak
    assert fp8.time.tokens_per_second > comp.time.tokens_per_second  # 6667 -> 8532 published


def test_compiled_op_sac_drops_only_the_down_projection_output(llama8b):
    """Under op SAC the compiled backward reads every MUST_SAVE output except the down projection's (7th mm): the
    gain is h bf16 bytes per token and layer (measured on CPU below)."""
    s = c2(compile=True)
    st = state_bytes(s)
    terms = compile_effects.op_sac_terms(llama8b, s, st)
    h, q, kv, i = 4096, 4096, 1024, 14336
    eager_op = st.residual * h + 2 * (q + kv + q + i + h) + 4 * 32  # input, wq, wv, sdpa out, w1, w2 out, lse
    assert eager_op - sum(terms.values()) == 2 * h


# -- real CPU steps, inductor ---------------------------------------------------------------------------------------
needs_inductor = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="inductor on CPU needs a C++ compiler")
B, S = 2, 64


def _titan(layers: int, policy: str, compiled: bool, fp8: bool, sdpa_listed: bool = True):
    """torchtitan's Llama (dim 256, 4 heads / 2 KV, FFN 704, vocab 1024) in bf16, with its own SAC and per-block
    compile, as models/llama3/infra/parallelize.py applies them. On CPU the flash SDPA op is
    aten._scaled_dot_product_flash_attention_for_cpu: added to the save list as torchtitan lists the CUDA ones
    (sdpa_listed; False: left off, as a release's list left off the cuDNN kernel its B200 runs ran)."""
    import torch
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import _apply_op_sac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    torch.manual_seed(0)
    m = Transformer(TransformerModelArgs(dim=256, n_layers=layers, n_heads=4, n_kv_heads=2, vocab_size=1024,
                                         multiple_of=64, max_seq_len=S))
    with torch.no_grad():
        m.init_weights()
    for part in (m.tok_embeddings, m.layers, m.norm, m.output):  # bf16 weights; the rotary table stays complex64
        part.to(torch.bfloat16)
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        # fp8: True (tensorwise, the default config) or a torchao recipe name (Float8LinearConfig.from_recipe_name;
        # torchtitan sets emulate_precision_casts for rowwise: components/quantization/float8.py:80-83)
        config = Float8LinearConfig.from_recipe_name(fp8) if isinstance(fp8, str) else Float8LinearConfig()
        torch._inductor.config.emulate_precision_casts = fp8 == "rowwise"
        convert_to_float8_training(m.layers, config=config)
    save = set(_op_sac_save_list) | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    if not sdpa_listed:
        save -= {op for op in save if "scaled_dot_product" in str(op)}
    for lid, block in m.layers.named_children():
        if policy == "op":
            block = _apply_op_sac(block, ActivationCheckpoint(mode="selective", selective_ac_option="op"),
                                  base_fqn=f"layers.{lid}", op_sac_save_list=save)
        if compiled:
            block = torch.compile(block, fullgraph=True)
        m.layers.register_module(lid, block)
    return m


def _saved_at_forward_end(model, loss_fn=None, batch: int = B) -> int:
    import torch

    from trainfit.measure.cpu_peak import cpu_peak

    tok, lab = torch.randint(0, 1024, (batch, S)), torch.randint(0, 1024, (batch, S))
    loss_fn = loss_fn or (lambda out, lab: out.float().sum())
    for _ in range(2):  # compile, then warm
        loss_fn(model(tok), lab).backward()

    def step(phase):
        phase("forward")
        loss = loss_fn(model(tok), lab)
        phase("forward_end")
        loss.backward()

    peak, _ = cpu_peak(step, 0)
    return peak.live_at("forward_end") - peak.live_at("forward")


def _titan_spec() -> ModelSpec:
    return ModelSpec(name="titan-tiny", family="llama", causal=True, hidden=256, layers=2, heads=4, kv_heads=2,
                     head_dim=64, intermediate=704, vocab=1024, max_positions=S, gated_mlp=True, activation="silu",
                     norm="rmsnorm", norm_bias=False)


@pytest.mark.slow
@needs_inductor
@pytest.mark.parametrize("policy,fp8", [("none", False), pytest.param("op", False, marks=pytest.mark.heavy),
                                        pytest.param("none", True, marks=pytest.mark.heavy),
                                        pytest.param("none", "rowwise", marks=pytest.mark.heavy),
                                        pytest.param("none", "rowwise_with_gw_hp", marks=pytest.mark.heavy)])
def test_compiled_torchtitan_block_saves_what_the_partitioner_model_says(policy, fp8):
    """One layer's saved bytes = forward-end bytes of 2 layers minus 1 layer's, compiled with inductor on CPU. Per
    token: none 7832 (eager 12312), op 3216 (eager 3767.5), none + Float8Linear 5400 (tensorwise and rowwise; 7832
    with rowwise_with_gw_hp, whose wgrad reads the bf16 input) — exact up to float8's scales (a few bytes per
    layer). The op case's terms are the CUDA step's (the save list here names the CPU flash kernel as torchtitan's
    names the CUDA ones)."""
    pytest.importorskip("torchtitan")
    if fp8:
        pytest.importorskip("torchao.float8")
    per_layer = _saved_at_forward_end(_titan(2, policy, True, fp8)) - _saved_at_forward_end(_titan(1, policy, True, fp8))
    setup = Setup(batch=B, seq=S, stack="torchtitan", precision="bf16", recompute=policy, compile=True,
                  low_precision=(fp8 if isinstance(fp8, str) else "tensorwise") if fp8 else "none",
                  device="cuda" if policy == "op" else "cpu")
    spec = _titan_spec()
    terms = (compile_effects.op_sac_terms if policy == "op" else compile_effects.block_terms)(
        spec, setup, state_bytes(setup))
    predicted = sum(terms.values()) * B * S
    assert predicted == pytest.approx(per_layer, rel=0.001), (predicted, per_layer)


@pytest.mark.slow
@needs_inductor
@pytest.mark.heavy  # ~60 s: four compiled steps
def test_compiled_op_sac_without_the_sdpa_kernel_on_its_list_recomputes_attention():
    """torchtitan's 2025-08 release on B200 (stacks/torchtitan.toml [releases."2025-08-sm100"]): SDPA ran cuDNN's
    kernel, which its op-SAC save list did not name, so the compiled block recomputes the attention in backward and
    saves neither its output nor its log-sum-exp. One layer's saved bytes per token, as the slope over two batch
    sizes (compiled with inductor on CPU, the CPU flash kernel left off the list as cuDNN's was): 2688 = the
    formula's, exact. NB: beside it a fixed 5,056 B per layer (at any batch) that the formula does not count."""
    pytest.importorskip("torchtitan")
    import torch

    torch._dynamo.reset()  # compiled under this save list, not a cached graph of another test's

    def per_layer(batch):
        return (_saved_at_forward_end(_titan(2, "op", True, False, sdpa_listed=False), batch=batch)
                - _saved_at_forward_end(_titan(1, "op", True, False, sdpa_listed=False), batch=batch))

    slope = (per_layer(2 * B) - per_layer(B)) / (B * S)
    setup = Setup(batch=B, seq=S, stack="torchtitan", stack_release="2025-08-sm100", precision="bf16",
                  recompute="op", compile=True, device="cuda")
    pinned = Setup(batch=B, seq=S, stack="torchtitan", precision="bf16", recompute="op", compile=True, device="cuda")
    st = state_bytes(setup)
    terms = compile_effects.op_sac_terms(_titan_spec(), setup, st)
    assert sum(terms.values()) == slope, (terms, slope)
    # what the release drops against the pinned facts: SDPA's bf16 output and fp32 log-sum-exp per head
    dropped = sum(compile_effects.op_sac_terms(_titan_spec(), pinned, st).values()) - sum(terms.values())
    assert dropped == 2 * 256 + 4 * 4


@pytest.mark.slow
@needs_inductor
def test_compiled_cross_entropy_saves_the_logits_and_two_row_statistics():
    """torchtitan's loss (components/loss.py cross_entropy_loss: upcast + cross_entropy) compiled: beyond the bf16
    logits it saves (they are its input, already allocated) only an fp32 max and log-sum-exp per row; eager saves the
    fp32 log-softmax."""
    import torch

    pytest.importorskip("torchtitan")
    from torchtitan.components.loss import cross_entropy_loss

    from trainfit.measure.cpu_peak import cpu_peak

    n, v = B * S, 1024
    fn = torch.compile(cross_entropy_loss)
    x = torch.randn(B, S, v, dtype=torch.bfloat16, requires_grad=True)
    lab = torch.randint(0, v, (B, S))
    for _ in range(2):
        fn(x, lab).backward()

    def step(phase):
        phase("forward")
        loss = fn(x, lab)
        phase("forward_end")
        loss.backward()

    peak, _ = cpu_peak(step, 0)
    saved = peak.live_at("forward_end") - peak.live_at("forward")
    assert saved - 4 == 2 * 4 * n  # (the 4-byte loss scalar)
    assert peak.peak - peak.live_at("forward") < 2 * n * v * 1.01  # the logits' bf16 gradient, no fp32 buffers


@pytest.mark.slow
@needs_inductor
@pytest.mark.heavy  # ~50 s each with a cold inductor cache (CI's): `python -m pytest -m heavy`
@pytest.mark.parametrize("precision", ["amp-bf16", "bf16"])
def test_hf_compiled_step_within_1_percent_of_the_measure_engine(precision):
    """The HF Trainer's torch_compile (the whole model) through the measure engine, tiny Llama on CPU: the forward
    end and the step's peak (the compiled embedding backward) against the analytic engine."""
    pytest.importorskip("transformers")
    from trainfit.measure import measure

    spec = load_model("tiny-llama")
    setup = Setup(batch=2, seq=64, precision=precision, device="cpu", compile=True)
    real = measure(spec, setup, steps=0)
    predicted = estimate(spec, setup).memory
    assert predicted.peak == pytest.approx(real.peak, rel=0.01)
    assert predicted.phases["forward_end"] == pytest.approx(real.phase_peaks["forward"], rel=0.01)
    assert predicted.phases["forward_end"] < estimate(spec, setup.with_(compile=False)).memory.phases["forward_end"]


@pytest.mark.parametrize("recompute, ratio", [("none", 3 / 4), ("full", 3 / 4)])
def test_float8_tp_all_gathers_move_fp8(llama8b, recompute, ratio):
    """torchtitan's tensorwise Float8 TP casts each block input to fp8 before its sequence-parallel all-gather
    (torchao float8_tensor_parallel.py PrepareFloat8ModuleInput), and each row-parallel output's gradient before the
    backward's all-gather (Float8RowwiseParallel._prepare_output_fn: NoopFwToFloat8BwDynamic after the
    reduce-scatter). Counted by hand per layer and micro-batch: the forward's two all-gathers (attention and MLP
    inputs) and two reduce-scatters (wo, w2 outputs) are two all-reduce equivalents, the backward's two more, full
    recompute re-runs the forward's two; an all-gather is half of an all-reduce's ring bytes, and in fp8 half of that
    again (bf16 activations), in every one of them: none (4 × 0.75) / 4, full (6 × 0.75) / 6."""
    gpu = get_gpu("H100")
    kw = dict(batch=1, seq=8192, stack="torchtitan", recompute=recompute, tp=8)
    a = layout_step_time(llama8b, Setup(**kw), gpu)
    b = layout_step_time(llama8b, Setup(low_precision="tensorwise", **kw), gpu)
    assert b.tp_comm / a.tp_comm == pytest.approx(ratio, rel=1e-9)


def test_float8_tp_casts_each_block_input_once_on_its_sequence_shard(llama8b):
    """torchtitan's tensorwise Float8 TP (parallelize.py: PrepareFloat8ModuleInput on `attention` and `feed_forward`,
    Float8Colwise/RowwiseParallel on the linears): a block's input is cast on the rank's Shard(1) rows before its
    all-gather, and wq/wk/wv (w1/w3) read it already cast (float8_linear.py: tensor_already_casted_to_fp8), so one
    input cast per block of T/tp rows; the row-parallel wo/w2 cast their own local input (T rows, k/tp wide); in the
    backward wo/w2's output gradient is cast on T/tp rows before the gather (NoopFwToFloat8BwDynamic). Counted by
    hand from those files against the op list."""
    from trainfit.analytic.ops.layer import layer_forward
    from trainfit.analytic.ops.gemm import fp8_backward_extra
    from trainfit.analytic.ops.shape import shape_of
    from trainfit.analytic.timing import compute_dtype

    t, tokens, h = 4, 8192, llama8b.hidden
    s = Setup(stack="torchtitan", tp=t, sequence_parallel=True, seq=tokens, low_precision="tensorwise")
    sh = shape_of(llama8b, s, state_bytes(s), compute_dtype(s))
    fwd = layer_forward(llama8b, sh)
    casts = {o.name: o.reads for o in fwd if o.name.endswith(".cast_x")}
    # the attention block's input cast once (on q), the MLP's once (on gate): T/tp rows of h, bf16 read
    assert set(casts) == {"q.cast_x", "o.cast_x", "gate.cast_x", "down.cast_x"}
    assert casts["q.cast_x"] == casts["gate.cast_x"] == pytest.approx(tokens / t * h * 2)
    assert casts["o.cast_x"] == pytest.approx(tokens * llama8b.q_dim / t * 2)
    assert casts["down.cast_x"] == pytest.approx(tokens * llama8b.intermediate / t * 2)
    bwd = {o.name: o.reads for o in fp8_backward_extra(fwd, sh)}
    assert bwd["o.cast_dy"] == bwd["down.cast_dy"] == pytest.approx(tokens / t * h * 2)
    assert bwd["q.cast_dy"] == pytest.approx(tokens * llama8b.q_dim / t * 2)  # a column-parallel output: local
