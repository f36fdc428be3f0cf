"""The pre-flight's reading of live objects (trainfit.callbacks): optimizers, precision, the trainers' layouts, and
the CPU peak of steps a trainer runs itself. Torch only (the trainers run in test_callbacks_trainers.py, heavy)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from trainfit.callbacks import live  # noqa: E402
from trainfit.callbacks.layouts import autocast_of, deepspeed_settings, training_args_settings  # noqa: E402
from trainfit.callbacks.preflight import PeakWatch  # noqa: E402
from trainfit.errors import SetupError  # noqa: E402


def _params():
    return [torch.nn.Parameter(torch.zeros(8, 8))]


def _state_floats(opt) -> int:
    """Elements of the real per-parameter state (not the scalar step counter) after one step."""
    p = opt.param_groups[0]["params"][0]
    p.grad = torch.ones_like(p)
    opt.step()
    return sum(v.numel() for k, v in opt.state[p].items() if k != "step" and isinstance(v, torch.Tensor))


@pytest.mark.parametrize("make, name, states", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1), "sgd", 0),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "momentum", 1),
    (lambda ps: torch.optim.AdamW(ps, fused=True), "adamw", 2),
    (lambda ps: torch.optim.Adam(ps, foreach=False), "adam", 2),
])
def test_the_optimizer_named_is_the_one_whose_states_torch_keeps(make, name, states):
    """The name read from the live optimizer, and torch's own state after a step: one buffer per parameter for
    momentum SGD, two for Adam(W), none for plain SGD (what trainfit's optimizer names mean, vocab.OPTIMIZERS)."""
    opt = make(_params())
    assert live.optimizer_settings(opt, "cpu")["optimizer"] == name
    assert _state_floats(opt) == states * 64


def test_the_kernel_is_torchs_default_where_the_optimizer_leaves_it_open():
    """foreach/fused left at None: torch runs foreach on CUDA, the for-loop on the CPU
    (torch/optim/optimizer.py _default_to_fused_or_foreach)."""
    opt = torch.optim.AdamW(_params())
    assert live.optimizer_settings(opt, "cpu")["optimizer_impl"] == "for-loop"
    assert live.optimizer_settings(opt, "cuda")["optimizer_impl"] == "foreach"
    assert live.optimizer_settings(torch.optim.AdamW(_params(), foreach=True), "cpu")["optimizer_impl"] == "foreach"
    wrapped = type("AcceleratedOptimizer", (), {"optimizer": torch.optim.SGD(_params(), lr=0.1, momentum=0.5)})()
    assert live.optimizer_settings(wrapped, "cpu")["optimizer"] == "momentum"


def test_an_optimizer_trainfit_does_not_model_is_refused_in_one_line():
    with pytest.raises(SetupError, match="amsgrad"):
        live.optimizer_settings(torch.optim.AdamW(_params(), amsgrad=True), "cpu")
    with pytest.raises(SetupError, match="RMSprop is not modelled"):
        live.optimizer_settings(torch.optim.RMSprop(_params()), "cpu")


def test_precision_from_the_weights_and_the_autocast():
    assert live.precision_of("fp32", None) == "fp32"
    assert live.precision_of("fp32", "bf16") == "amp-bf16"
    assert live.precision_of("fp32", "fp16") == "amp-fp16"
    assert live.precision_of("bf16", None) == "bf16"
    with pytest.raises(SetupError, match="fp16 weights"):
        live.precision_of("fp16", None)
    with pytest.raises(SetupError, match="fp8"):
        autocast_of("fp8")


def test_the_batch_shape_is_the_input_ids():
    assert live.batch_shape({"input_ids": torch.zeros(3, 17, dtype=torch.long)}) == (3, 17)
    with pytest.raises(SetupError, match="batch_shape"):
        live.batch_shape({"x": torch.zeros(3)})


def _args(**kw):
    base = dict(gradient_accumulation_steps=4, max_grad_norm=0.5, world_size=8, activation_checkpointing=None,
                gradient_checkpointing=None, activation_checkpointing_kwargs=None, gradient_checkpointing_kwargs=None,
                fsdp=False, fsdp_config=None, deepspeed=None, bf16=False, fp16=False)
    return SimpleNamespace(**{**base, **kw})


def test_training_arguments_give_the_layout():
    """transformers 5.24: fsdp_config's reshard_after_forward True = full_shard (ZeRO-3), False = shard_grad_op
    (ZeRO-2); a DeepSpeed config's zero_optimization stage and offload."""
    assert training_args_settings(_args()) == {"grad_accum": 4, "max_grad_norm": 0.5, "dp": 8}
    assert training_args_settings(_args(fsdp=True, fsdp_config={"reshard_after_forward": True}))["zero"] == 3
    assert training_args_settings(_args(fsdp=True, fsdp_config={"reshard_after_forward": False}))["zero"] == 2
    assert training_args_settings(_args(gradient_checkpointing=True))["recompute"] == "full"
    with pytest.raises(SetupError, match="hybrid_shard"):
        training_args_settings(_args(fsdp=True, fsdp_config={"reshard_after_forward": "hybrid_shard"}))
    ds = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True}}
    assert deepspeed_settings(ds) == {"stack": "deepspeed", "zero": 2, "offload": "optimizer",
                                      "precision": "bf16-master"}


def test_the_cpu_peak_of_steps_run_outside_trainfit_to_the_byte():
    """Between start() and stop(): a 4000-byte tensor, then a 2000-byte one while it lives, both freed: the peak is
    the baseline (the distinct storages live at start) + 6000 bytes, from c10's allocator records."""
    w = torch.zeros(100)  # 400 bytes live at start
    view = w[:10]  # the same storage: counted once
    watch = PeakWatch("cpu")
    watch.start([w, view, None])

    def step():
        a = torch.empty(1000)
        b = torch.empty(500)
        return a.numel() + b.numel()

    assert step() == 1500
    allocated, reserved = watch.stop()
    assert (allocated, reserved) == (400 + 6000, None)


def test_torchtitan_job_config_gives_the_layout():
    """The inverse of --emit torchtitan (plan/emit_torchtitan.py): float32 + bfloat16 = amp-bf16, FSDP over
    dp_shard (never resharding = ZeRO-2), selective N = layer:N, op = per-op SAC."""
    from trainfit.callbacks.torchtitan import job_settings

    job = SimpleNamespace(
        training=SimpleNamespace(dtype="float32", mixed_precision_param="bfloat16", max_norm=1,
                                 enable_cpu_offload=False),
        activation_checkpoint=SimpleNamespace(mode="selective", selective_ac_option="op"),
        parallelism=SimpleNamespace(fsdp_reshard_after_forward="default"),
        compile=SimpleNamespace(enable=True, components=["loss"]))
    dims = SimpleNamespace(dp_replicate=1, dp_shard=4, tp=2, pp=1, cp=1, ep=1)
    s = job_settings(job, dims, 2)
    assert (s["precision"], s["dp"], s["zero"], s["tp"], s["recompute"], s["compile"], s["compile_loss"]) == \
        ("amp-bf16", 4, 3, 2, "op", False, True)
    job.parallelism.fsdp_reshard_after_forward = "never"
    job.activation_checkpoint.selective_ac_option = "2"
    s = job_settings(job, dims, 2)
    assert (s["zero"], s["recompute"]) == (2, "layer:2")
    with pytest.raises(SetupError, match="HSDP"):
        job_settings(job, SimpleNamespace(dp_replicate=2, dp_shard=2, tp=1, pp=1, cp=1, ep=1), 1)


def test_lightning_trainer_gives_the_layout():
    """Lightning 2.6.6: precision flags, FSDPStrategy's sharding_strategy (read from live strategies in
    test_callbacks_strategies.py), other strategies refused in one line."""
    from trainfit.callbacks.lightning import trainer_settings

    fsdp = type("FSDPStrategy", (), {"sharding_strategy": SimpleNamespace(name="SHARD_GRAD_OP")})()
    trainer = SimpleNamespace(precision="bf16-mixed", world_size=4, accumulate_grad_batches=2, gradient_clip_val=None,
                              strategy=fsdp)
    assert trainer_settings(trainer) == ("bf16", {"dp": 4, "grad_accum": 2, "max_grad_norm": None, "zero": 2,
                                                      "fsdp_version": 1})
    trainer.strategy = type("XLAStrategy", (), {})()
    with pytest.raises(SetupError, match="XLAStrategy is not modelled"):
        trainer_settings(trainer)
    trainer.precision = "transformer-engine"
    with pytest.raises(SetupError, match="transformer-engine"):
        trainer_settings(trainer)


def test_lightning_hooks_on_a_module_trainfit_traces(monkeypatch, capsys):
    """The Lightning callback's hooks on stand-ins for Lightning's Trainer (Lightning is not installed here): a plain
    nn.Module (no config trainfit reads: the trace engine runs it on the first batch), two real SGD steps between
    the hooks; the allocator's peak over them against the trace's prediction."""
    from trainfit.callbacks import lightning

    monkeypatch.setattr(lightning, "Callback", object)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, foreach=False)
    trainer = SimpleNamespace(precision="32-true", world_size=1, accumulate_grad_batches=1, gradient_clip_val=None,
                              strategy=type("SingleDeviceStrategy", (), {})(), optimizers=[opt], is_global_zero=True,
                              should_stop=False, global_step=0, logger=None)
    cb = lightning._Preflight(steps=2)
    batch = torch.randint(0, 64, (4, 16))
    for step in (1, 2):
        cb.on_train_batch_start(trainer, module, batch, 0)
        if step == 1:
            assert cb.preflight.estimate.engine == "trace"
            s = cb.preflight.estimate.setup
            assert (s.batch, s.seq, s.optimizer, s.optimizer_kernel, s.precision) == \
                (4, 16, "momentum", "for-loop", "fp32")
        # Lightning's automatic optimization: training_step, zero_grad, backward, step (automatic.py:131-140)
        loss = module(batch).float().mean()  # the reduction the trace applies to a module's output (trace/user.py)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, None, batch, 0)
    assert "peak over the first 2 step(s)" in capsys.readouterr().out
    # the second step is the steady state the trace predicts (the momentum buffers live from the first step on)
    assert abs(cb.logs["trainfit/peak_error"]) < 0.01, cb.logs


def test_the_trace_steps_the_live_optimizers_param_groups_as_the_real_step_does():
    """A for-loop AdamW keeps the previous parameter's `denom` until the next one's sqrt and div are made (torch 2.13
    optim/adam.py:544), so the order of its param groups changes the peak: grouped as the HF Trainer groups them
    (weights with decay, then the norm's without: trainer.py:1272-1286), the 64 x 256 weight follows the 64 x 64 one
    (4096 floats of denom held) rather than the norm's bias (64). The trace given the live optimizer's groups matches
    a real step's allocator peak; traced in module order it is 16 KB short."""
    from trainfit import engines
    from trainfit.setup import Request

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 256, bias=False))
    decay = [model[0].weight, model[2].weight]
    opt = torch.optim.AdamW([{"params": decay}, {"params": list(model[1].parameters()), "weight_decay": 0.0}],
                            lr=1e-3, foreach=False)
    x = torch.randn(4, 64)

    def step():
        model(x).float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's states resident, as in the trace's steady state
    watch = PeakWatch("cpu")
    from trainfit.callbacks.preflight import live_tensors
    watch.start(live_tensors(model, opt, {"x": x}))
    step()
    real, _ = watch.stop()
    groups = live.optimizer_groups(opt, model)
    assert groups == [[0, 3], [1, 2]]
    setup = Request(model="Sequential", batch=4, seq=1, precision="fp32", device="cpu", optimizer="adamw",
                    optimizer_impl="for-loop", max_grad_norm=0).setup(None)
    grouped = engines.trace_module(model, x, setup, param_groups=groups).memory.peak
    in_order = engines.trace_module(model, x, setup).memory.peak
    assert abs(grouped - real) / real < 0.002, (grouped, real)
    assert grouped - in_order == 4 * (64 * 64 - 64), (grouped, in_order)
