"""Pre-flight in torchtitan 0.2.2's trainer: a Trainer subclass, the hook torchtitan's entry point takes
(train.py:729 `main(trainer_class)`; the job config, model, parallel dims and optimizers are all built at the end of
Trainer.__init__, train.py:76-300, before the first train_step, train.py:547).

    from torchtitan.train import Trainer, main
    from trainfit.callbacks.torchtitan import checked
    main(checked(Trainer, gpu="H100-80GB", stop_if_not_fit=True))

`preflight(trainer)` alone estimates a built Trainer; `checked` also compares the real peak after `steps` steps."""
from __future__ import annotations

from ..errors import SetupError
from . import live
from .preflight import PeakWatch, _gpu, compare, estimate_live, judge, live_tensors, log, stop_or_go


def _rank_zero() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def llama3_spec(name: str, flavor: str, args):
    """The ModelSpec of torchtitan's llama3 TransformerModelArgs (models/llama3/model/args.py:28-47) as the HF Llama
    config of the same shape: RMSNorm, SwiGLU of torchtitan's FFN width (plan.emit_torchtitan.torchtitan_ffn), RoPE,
    untied embeddings, no biases (stacks/torchtitan.toml [models])."""
    from ..models.resolve import spec_from_config
    from ..plan.emit_torchtitan import torchtitan_ffn

    if name != "llama3":
        raise SetupError(f"torchtitan model {name!r}: the pre-flight reads llama3's model args; estimate the others "
                         "with trainfit estimate --stack torchtitan and a catalog model")
    shape = {"dim": args.dim, "multiple_of": args.multiple_of, "ffn_dim_multiplier": args.ffn_dim_multiplier}
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": args.dim,
              "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
              "num_key_value_heads": args.n_kv_heads or args.n_heads, "vocab_size": args.vocab_size,
              "intermediate_size": torchtitan_ffn(shape), "max_position_embeddings": args.max_seq_len,
              "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta, "tie_word_embeddings": False}
    return spec_from_config(config, f"torchtitan {name} {flavor}", source="torchtitan model args")


def job_settings(job, dims, grad_accum: int) -> dict:
    """trainfit settings of torchtitan's JobConfig (config/job_config.py) and ParallelDims
    (distributed/parallel_dims.py:20-27), the inverse of plan.emit_torchtitan.torchtitan_sections."""
    t, ac = job.training, job.activation_checkpoint
    precision = {("float32", "bfloat16"): "amp-bf16", ("bfloat16", "bfloat16"): "bf16",
                 ("float32", "float32"): "fp32"}.get((t.dtype, t.mixed_precision_param))  # job_config.py:275, 282
    if precision is None:
        raise SetupError(f"training.dtype {t.dtype} with mixed_precision_param {t.mixed_precision_param} is not "
                         "modelled: float32 + bfloat16 (amp-bf16), bfloat16 + bfloat16, float32 + float32")
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        raise SetupError("HSDP (data_parallel_replicate_degree and data_parallel_shard_degree both > 1) is not "
                         "modelled: shard over every data-parallel rank, or replicate")
    reshard = job.parallelism.fsdp_reshard_after_forward  # job_config.py:336
    zero = (2 if reshard == "never" else 3) if dims.dp_shard > 1 else 0
    if ac.mode == "memory_budget":  # job_config.py:652-655
        raise SetupError("activation_checkpoint.mode memory_budget is not modelled: use none, full or selective")
    recompute = {"none": "none", "full": "full"}.get(ac.mode) or (
        "op" if ac.selective_ac_option == "op" else f"layer:{ac.selective_ac_option}")
    compiled = job.compile.enable and "model" in job.compile.components  # job_config.py:722-725
    return {"stack": "torchtitan", "precision": precision, "grad_accum": grad_accum, "dp": dims.dp_replicate *
            dims.dp_shard, "zero": zero, "tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "ep": dims.ep,
            "recompute": recompute, "compile": compiled,
            "compile_loss": job.compile.enable and not compiled and "loss" in job.compile.components,
            "max_grad_norm": float(t.max_norm), "offload": "params" if t.enable_cpu_offload else "none"}


def preflight(trainer, *, gpu: str | None = None, gpu_memory: float | None = None, stop_if_not_fit: bool = False,
              **settings):
    """Estimate a built torchtitan Trainer before its first step: the model args, the job config's local batch and
    sequence (each micro-batch is local_batch_size x seq_len tokens), the parallel dims, the first optimizer. Prints the
    verdict; raises WillNotFitError when stop_if_not_fit and it does not fit."""
    job = trainer.job_config
    converters = list(getattr(job.model, "converters", []) or [])  # job_config.py:118 (train.py:153-155)
    if converters and "low_precision" not in settings:
        raise SetupError(f"model.converters {converters} are not read by the pre-flight: pass the recipe as "
                         "low_precision=... (trainfit's --low-precision)")
    spec = llama3_spec(job.model.name, job.model.flavor, trainer.model_args)
    run = {**job_settings(job, trainer.parallel_dims, trainer.gradient_accumulation_steps),
           **live.optimizer_settings(trainer.optimizers.optimizers[0], trainer.device.type),
           "device": "cuda" if trainer.device.type == "cuda" else "cpu", "gpu": gpu, "gpu_memory": gpu_memory,
           **settings}
    req = _gpu(live.Request(model=spec.name, batch=job.training.local_batch_size, seq=job.training.seq_len,
                            **{k: v for k, v in run.items() if v is not None}), run["device"])
    pre = judge(estimate_live(req, spec))
    if _rank_zero():
        print(pre.verdict)
    log.info(pre.verdict)
    stop_or_go(pre, stop_if_not_fit)
    return pre


def checked(trainer_class, *, steps: int = 2, **options):
    """`trainer_class` with the pre-flight at the end of __init__ and the real peak of its first `steps` train_steps
    compared with the prediction (logged, and kept as `trainfit_logs`)."""
    if steps < 1:
        raise SetupError(f"steps={steps}: compare the peak after at least 1 step")

    class Checked(trainer_class):
        def __init__(self, job_config, *args, **kwargs):
            super().__init__(job_config, *args, **kwargs)
            self.trainfit = preflight(self, **options)
            self.trainfit_logs, self._trainfit_watch, self._trainfit_steps = {}, None, 0

        def train_step(self, *args, **kwargs):
            if self._trainfit_steps == 0:
                self._trainfit_watch = PeakWatch(self.trainfit.estimate.setup.device)
                self._trainfit_watch.start([t for m in self.model_parts for t in live_tensors(m)])
            out = super().train_step(*args, **kwargs)
            self._trainfit_steps += 1
            if self._trainfit_steps == steps:
                allocated, reserved = self._trainfit_watch.stop()
                self.trainfit_logs, line = compare(self.trainfit, allocated, reserved, steps)
                log.info(line)
                if _rank_zero():
                    print(line)
            return out

    Checked.__name__ = Checked.__qualname__ = f"Checked{trainer_class.__name__}"
    return Checked
