"""The pre-flight inside real trainers on the CPU (heavy: importing the trainers and two real steps take ~10 s; the
torchtitan and Lightning FSDP cases launch their own processes, a minute or two each):
the HF Trainer for two steps with TrainfitCallback, an accelerate Accelerator, torchtitan's own job config and model
args and its real Trainer (one rank, and FSDP2 on two), Lightning on one rank and under FSDP on two. The number that
matters: the peak c10's allocator records over the Trainer's two real steps against the
prediction made from the live objects before the first forward."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.heavy

from trainfit.callbacks import WillNotFitError  # noqa: E402
from trainfit.callbacks.hf import TrainfitCallback, accelerate_preflight  # noqa: E402
from tests.callbacks.lightning_tiny import tiny_llama, tiny_module_class, token_batches  # noqa: E402


_model = tiny_llama


def _lora_model(targets):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(_model(), peft.LoraConfig(r=8, target_modules=targets))


def _train(tmp_path, callback, model=None, **args):
    data = [{"input_ids": torch.randint(0, 256, (32,)), "labels": torch.randint(0, 256, (32,))} for _ in range(8)]
    targs = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, use_cpu=True, report_to=[],
                                           per_device_train_batch_size=2, save_strategy="no", disable_tqdm=True,
                                           logging_steps=1, **args)
    trainer = transformers.Trainer(model=model if model is not None else _model(), args=targs, train_dataset=data,
                                   callbacks=[callback])
    trainer.train()
    return trainer


@pytest.mark.parametrize("engine, args", [
    ("auto", {}),  # the analytic engine from the model's config; fp32, the Trainer's fused AdamW
    ("trace", {"bf16": True, "gradient_checkpointing": True, "optim": "adamw_torch"}),  # the live module traced
])
def test_hf_trainer_two_steps_verdict_and_peak_error(tmp_path, capsys, engine, args):
    cb = TrainfitCallback(engine=engine)
    trainer = _train(tmp_path, cb, **args)
    out = capsys.readouterr().out
    s = cb.preflight.estimate.setup
    assert (s.batch, s.seq, s.device, s.dp) == (2, 32, "cpu", 1)
    assert s.precision == ("amp-bf16" if args else "fp32")
    assert s.recompute == ("full" if args else "none")
    assert "trainfit: LlamaForCausalLM: 2 x 32 tokens" in out and "fits the host's" in out
    assert "peak over the first 2 step(s)" in out
    logs = cb.logs
    assert logs["trainfit/real_peak"] > 1_000_000  # weights, gradients and AdamW's two states of 0.1 M parameters
    # the prediction from the live objects within 1 % of the allocator's own peak over the two real steps
    # (measured here: analytic -0.02 %, trace -0.06 %; the trace steps the Trainer's own param groups,
    # live.optimizer_groups: in the model's order it was -1.7 %, 32.5 KB of for-loop AdamW denom short)
    assert abs(logs["trainfit/peak_error"]) < 0.01, logs
    assert any("trainfit/peak_error" in r for r in trainer.state.log_history)


@pytest.mark.parametrize("targets, names", [("all-linear", "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"),
                                            (["q_proj", "v_proj"], "q_proj,v_proj")])
def test_hf_trainer_with_a_peft_lora_model(tmp_path, targets, names):
    """peft's LoRA read from the live model (r, the modules peft put adapters on); the peak within 2 % of the
    allocator's over two real steps (measured here: -1.2 % all-linear, -1.5 % q_proj,v_proj: about 16 KB the
    prediction lacks)."""
    cb = TrainfitCallback()
    _train(tmp_path, cb, model=_lora_model(targets))
    s = cb.preflight.estimate.setup
    assert (s.lora_rank, s.lora_targets, s.lora_dtype) == (8, names, "fp32")
    assert abs(cb.logs["trainfit/peak_error"]) < 0.02, cb.logs


def test_stop_if_not_fit_stops_before_the_first_step(tmp_path, capsys):
    """Judged against an H100 of 1 MiB (gpu_memory in GiB): the run stops in the first forward, no step taken."""
    cb = TrainfitCallback(gpu="H100-80GB", gpu_memory=2 ** -10, stop_if_not_fit=True)
    with pytest.raises(WillNotFitError, match="DOES NOT FIT H100-80GB"):
        _train(tmp_path, cb)
    assert cb.preflight.fits is False and cb.logs == {}
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_accelerate_preflight_reads_the_accelerator(capsys):
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # the Trainer's state in this process (accelerate/state.py _reset_state)
    acc = accelerate.Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=3)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    model, opt = acc.prepare(model, opt)
    pre = accelerate_preflight(acc, model, opt, (4, 64))
    s = pre.estimate.setup
    assert (s.batch, s.seq, s.grad_accum, s.precision, s.optimizer, s.optimizer_kernel) == \
        (4, 64, 3, "amp-bf16", "adamw", "fused")
    assert pre.fits is not None and "4 x 64 tokens x 3 accumulated" in capsys.readouterr().out
    AcceleratorState._reset_state(True)


def _torchtitan(tmp_path, nproc: int):
    """torchtitan's own main(checked(Trainer)) on the CPU (tests/callbacks/torchtitan_cpu.py: the device type, the
    device module and the data set it patches, each cited there), llama3 debugmodel (6.2 M parameters), fp32 weights
    and compute, no activation checkpointing, torchtitan's fused AdamW, 2 x 64 tokens per rank, two steps; `nproc`
    ranks by torch's launcher over gloo (dp_shard -1: FSDP2 over every rank). (the logs rank 0 wrote, its output)"""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torchtitan")
    here = Path(__file__).resolve()
    root = here.parents[2]
    out = tmp_path / "logs.json"
    flags = ["--model.flavor", "debugmodel", "--training.local_batch_size", "2", "--training.seq_len", "64",
             "--training.steps", "2", "--training.mixed_precision_param", "float32",
             "--activation_checkpoint.mode", "none", "--job.dump_folder", str(tmp_path / "dump")]
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  "--nproc-per-node", str(nproc)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    run = subprocess.run([*launch, str(here.parent / "torchtitan_cpu.py"), str(out), *flags], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


def _order(text: str) -> tuple[int, int, int]:
    """Where the verdict, torchtitan's own log line of step 1 (components/metrics.py:462) and the comparison appear."""
    return (text.index("trainfit: torchtitan llama3 debugmodel: 2 x 64 tokens"), text.index("step:  1"),
            text.index("trainfit: peak over the first 2 step(s)"))


def test_torchtitan_real_trainer_two_steps_one_rank(tmp_path):
    """torchtitan's real Trainer and entry point, one CPU rank: the verdict printed at the end of __init__, before
    torchtitan logs step 1, and the allocator's peak over its two real train_steps logged after them. Tolerance 0.1 %:
    on this job trainfit's own measure engine (a real CPU step, engines.measure) reads 98,756,860 B and the analytic
    engine predicts 98,756,608 B (-0.0003 %); the real Trainer measured 98,757,888 B (-0.0013 %), its few scalars
    (the valid-token count, the loss sum, the grad norm, train.py:566-600) on top. Hand bound: at least the weights,
    gradients and AdamW's two states, 16 bytes per parameter."""
    logs, text = _torchtitan(tmp_path, 1)
    verdict, step1, compared = _order(text)
    assert verdict < step1 < compared
    assert logs["steps_run"] == 2 and logs["world"] == 1
    assert logs["layout"] == {"dp": 1, "zero": 0, "offload": "none", "stack": "torchtitan", "precision": "fp32",
                              "recompute": "none"}
    assert logs["trainfit/real_peak"] >= 16 * logs["params"]
    assert abs(logs["trainfit/peak_error"]) < 0.001, logs


def test_torchtitan_real_trainer_fsdp_two_ranks(tmp_path):
    """The same on 2 CPU ranks over gloo: torchtitan's FSDP2 over both (data_parallel_shard_degree -1), which the
    hook reads from the live ParallelDims as dp 2, ZeRO-3. The real peak (rank 0, rebuilt block by block: gloo's
    threads free tensors outside the profiler, measure/dist_peak.py) equals trainfit's trace engine of the same job
    within 0.1 % (it runs torchtitan's apply_fsdp on a fake process group and adds gloo's own temporaries; measured
    67,977,464 B against the Trainer's 67,978,488 B). The analytic engine models NCCL, which has no such temporaries
    (docs/distributed.md, "How the CPU peak is read under gloo"): it predicted -2.9 % of the real peak here, so it is
    held to [-4 %, 0]."""
    import copy

    from torchtitan.models.llama3 import llama3_args

    from trainfit import engines
    from trainfit.callbacks.torchtitan import llama3_spec
    from trainfit.setup import Request

    logs, text = _torchtitan(tmp_path, 2)
    verdict, step1, compared = _order(text)
    assert verdict < step1 < compared
    assert logs["steps_run"] == 2 and logs["world"] == 2
    assert logs["layout"] == {"dp": 2, "zero": 3, "offload": "none", "stack": "torchtitan", "precision": "fp32",
                              "recompute": "none"}
    args = copy.deepcopy(llama3_args["debugmodel"])
    args.max_seq_len = 64  # as the Trainer sets it (update_from_config, train.py:140)
    spec = llama3_spec("llama3", "debugmodel", args)
    req = Request(model=spec.name, batch=2, seq=64, stack="torchtitan", precision="fp32", device="cpu",
                  recompute="none", optimizer="adamw", optimizer_impl="fused", max_grad_norm=1.0, dp=2, zero=3)
    traced = engines.trace(spec, req.setup(None)).memory.peak
    real = logs["trainfit/real_peak"]
    assert abs(traced - real) / real < 0.001, (traced, logs)
    assert -0.04 <= logs["trainfit/peak_error"] <= 0, logs


def _lightning_fit(cb):
    """A real lightning.Trainer (CPU, max_steps=2) fitting a LightningModule that wraps the tiny Llama (its forward
    returns the loss: the trace engine runs it), AdamW; the module back."""
    L = pytest.importorskip("lightning")

    data = token_batches()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
    module = tiny_module_class(L)()
    trainer.fit(module, data)
    return module


def test_lightning_trainer_two_steps_gradients_live_through_the_forward(capsys):
    """Lightning's closure runs training_step before zero_grad (loops/optimization/automatic.py:131-140), so the
    second forward runs beside the first step's gradients: the peak is the forward end + one fp32 gradient per
    parameter. The allocator's peak over the two real steps against that (measured: -0.02 %); without the closure
    order the prediction falls short by the gradients' bytes (-16.8 %)."""
    from trainfit.callbacks.lightning import TrainfitLightningCallback

    cb = TrainfitLightningCallback(steps=2)
    module = _lightning_fit(cb)
    out = capsys.readouterr().out
    assert "trainfit: Tiny: 2 x 32 tokens x 1 accumulated, fp32, adamw" in out and "peak over the first 2" in out
    m = cb.preflight.estimate.memory
    grads = sum(p.numel() * p.element_size() for p in module.parameters())  # fp32 gradients, one per parameter
    assert m.peak_phase == "forward_end" and m.gradients == grads
    real = cb.logs["trainfit/real_peak"]
    assert abs(cb.logs["trainfit/peak_error"]) < 0.01, cb.logs
    assert real - (m.peak - grads) > 0.9 * grads  # the order's gradients are what a plain step's prediction misses



def test_lightning_gpu_on_a_cpu_trace_is_warned_not_ignored(caplog):
    """A module without a config trainfit reads, on the CPU: its trace has no CUDA allocator figure, so gpu= cannot
    be judged: a warning says so and the host judges (the run goes on)."""
    from trainfit.callbacks.lightning import TrainfitLightningCallback

    cb = TrainfitLightningCallback(gpu="H100-80GB", gpu_memory=2 ** -10, stop_if_not_fit=True)
    with caplog.at_level("WARNING", logger="trainfit.callbacks"):
        _lightning_fit(cb)
    assert "gpu='H100-80GB' not judged" in caplog.text
    assert cb.preflight.fits is True and "fits the host's" in cb.preflight.verdict


def test_lightning_fsdp_two_cpu_ranks_two_steps(tmp_path):
    """A real lightning.Trainer under its FSDP strategy on 2 CPU ranks over gloo for two steps
    (tests/callbacks/lightning_fsdp_cpu.py: the strategy class Lightning refuses on the CPU, and torch's FSDP1 device
    check, each cited there; the module wraps itself per decoder layer). The layout the callback reads from the live
    strategy: dp 2, ZeRO-3 (FULL_SHARD), no offload, FSDP1. The real peak (rank 0, rebuilt block by block under gloo)
    within 5 % of trainfit's trace engine of the same job (FSDP1 on a fake process group with gloo's temporaries:
    1,814,008 B against the Trainer's 1,863,676 B, -2.7 %: Lightning's step is not the trace's). The analytic engine
    within 0.1 % of that trace (1,814,144 B: the root unit and the last two layers gathered, FSDP1's BACKWARD_PRE
    prefetch, parallel/zero.py unsharded_at in fp32) and so within 5 % of the real peak (-2.7 %); it was +14.1 %
    over the trace when it held two layers' gathered copies at every moment, the forward's end included."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("lightning")
    from trainfit import engines
    from trainfit.models.resolve import spec_from_config
    from trainfit.setup import Request

    here = Path(__file__).resolve()
    out = tmp_path / "logs.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[2] / "src"), str(here.parents[2])])}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(here.parent / "lightning_fsdp_cpu.py"), str(out)], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    logs = json.loads(out.read_text())
    text = run.stdout
    assert text.index("trainfit: Tiny: 2 x 32 tokens") < text.index("trainfit: peak over the first 2 step(s)")
    assert (logs["global_step"], logs["world"], logs["backend"]) == (2, 2, "gloo")
    assert logs["layout"] == {"dp": 2, "zero": 3, "offload": "none", "stack": "hf", "precision": "fp32"}
    cfg = _model().config
    spec = spec_from_config({**cfg.to_dict(), "architectures": ["Tiny"]}, "Tiny", source="live model")
    req = Request(model=spec.name, batch=2, seq=32, precision="fp32", device="cpu", recompute="none",
                  optimizer="adamw", optimizer_impl="for-loop", dp=2, zero=3, fsdp_version=1)
    traced = engines.trace(spec, req.setup(None)).memory.peak
    real = logs["trainfit/real_peak"]
    assert abs(real - traced) / real < 0.05, (traced, logs)
    analytic = engines.analytic(spec, req.setup(None)).memory.peak
    assert abs(analytic - traced) / traced < 0.005, (analytic, traced)
    assert abs(logs["trainfit/peak_error"]) < 0.05, logs
