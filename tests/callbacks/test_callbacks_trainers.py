"""The pre-flight inside real trainers on the CPU (heavy: importing the trainers and two real steps take ~10 s):
the HF Trainer for two steps with TrainfitCallback, an accelerate Accelerator, torchtitan's own job config and model
args. The number that matters: the peak c10's allocator records over the Trainer's two real steps against the
prediction made from the live objects before the first forward."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.heavy

from trainfit.callbacks import WillNotFitError  # noqa: E402
from trainfit.callbacks.hf import TrainfitCallback, accelerate_preflight  # noqa: E402


def _model():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


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
    # (measured here: analytic -0.02 %, trace -0.06 %)
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


def test_torchtitan_preflight_from_its_job_config_and_model_args():
    """torchtitan 0.2.2's own JobConfig and llama3 debugmodel args: the spec trainfit builds has the parameters of
    torchtitan's own Transformer (built on the meta device), and the job's batch, sequence and layout."""
    from types import SimpleNamespace

    pytest.importorskip("torchtitan")
    from torchtitan.config import JobConfig
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import Transformer

    from trainfit.callbacks.torchtitan import checked, preflight

    job = JobConfig()
    job.training.local_batch_size, job.training.seq_len = 4, 256
    args = llama3_args["debugmodel"]
    with torch.device("meta"):
        n = sum(p.numel() for p in Transformer(args).parameters())
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], fused=True)
    trainer = SimpleNamespace(job_config=job, model_args=args, optimizers=SimpleNamespace(optimizers=[opt]),
                              parallel_dims=SimpleNamespace(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1),
                              device=torch.device("cpu"), gradient_accumulation_steps=1)
    pre = preflight(trainer)
    s = pre.estimate.setup
    assert pre.estimate.params == n
    assert (s.stack, s.batch, s.seq, s.precision, s.recompute, s.optimizer_kernel, s.max_grad_norm) == \
        ("torchtitan", 4, 256, "amp-bf16", "layer:2", "fused", 1.0)  # JobConfig's defaults: selective "2", max_norm 1
    job.model.converters = ["quantize.linear.float8"]
    with pytest.raises(Exception, match="converters"):
        preflight(trainer)
    assert checked(SimpleNamespace, steps=1).__name__ == "CheckedSimpleNamespace"


def test_torchtitan_checked_trainer_compares_the_peak_of_its_steps(capsys):
    """`checked` around a stand-in for torchtitan's Trainer (its own Trainer picks a CUDA device: tools/utils.py:37)
    that holds torchtitan's llama3 debugmodel, its own cross-entropy (components/loss.py:20-27) and fused AdamW on the
    CPU, fp32 without activation checkpointing: the pre-flight at the end of __init__, the allocator's peak of the
    first two train_steps logged against it, within 1 %. Hand bound: the real peak holds at least the weights, gradients and
    AdamW's two states, 16 bytes per parameter."""
    import copy
    from types import SimpleNamespace

    pytest.importorskip("torchtitan")
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import JobConfig
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import Transformer

    from trainfit.callbacks.torchtitan import checked

    class Stand:
        def __init__(self, job_config):
            self.job_config, self.model_args = job_config, copy.deepcopy(llama3_args["debugmodel"])
            self.model_args.update_from_config(job_config)  # as train.py:140: max_seq_len = training.seq_len
            torch.manual_seed(0)
            model = Transformer(self.model_args)
            with torch.no_grad():  # as train.py:258-259
                model.init_weights()
            self.model_parts = [model]
            self.optimizers = SimpleNamespace(optimizers=[torch.optim.AdamW(model.parameters(), fused=True)])
            self.parallel_dims = SimpleNamespace(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1)
            self.device, self.gradient_accumulation_steps = torch.device("cpu"), 1

        def train_step(self, tokens):
            opt = self.optimizers.optimizers[0]
            opt.zero_grad(set_to_none=True)
            loss = cross_entropy_loss(self.model_parts[0](tokens[:, :-1]), tokens[:, 1:]) / tokens[:, 1:].numel()
            loss.backward()
            opt.step()

    job = JobConfig()
    job.training.local_batch_size, job.training.seq_len = 2, 64
    job.training.mixed_precision_param = "float32"
    job.activation_checkpoint.mode = "none"
    trainer = checked(Stand, steps=2)(job)
    s = trainer.trainfit.estimate.setup
    assert (s.stack, s.precision, s.recompute, s.batch, s.seq) == ("torchtitan", "fp32", "none", 2, 64)
    for _ in range(2):
        trainer.train_step(torch.randint(0, 2048, (2, 65)))
    logs = trainer.trainfit_logs
    n = sum(p.numel() for p in trainer.model_parts[0].parameters())
    assert logs["trainfit/real_peak"] >= 16 * n
    assert "peak over the first 2 step(s)" in capsys.readouterr().out
    assert abs(logs["trainfit/peak_error"]) < 0.01, logs  # measured here: -0.0003 % (252 bytes of 98.8 MB)



def _lightning_fit(cb):
    """A real lightning.Trainer (CPU, max_steps=2) fitting a LightningModule that wraps the tiny Llama (its forward
    returns the loss: the trace engine runs it), AdamW; the module back."""
    L = pytest.importorskip("lightning")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _model()

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, labels=input_ids).loss

        def training_step(self, batch, batch_idx):
            return self(batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader([torch.randint(0, 256, (32,)) for _ in range(8)], batch_size=2)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
    module = Tiny()
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
