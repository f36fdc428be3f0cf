"""The DeepSpeed config JSON for a setup: what `--emit deepspeed` writes and what the measure engine's DeepSpeed step
(trainfit.step.deepspeed) hands deepspeed.initialize, so the run allocates what the estimate counts. No torch; `s` is
a trainfit Setup (read by attribute: this layer does not import setup)."""
from __future__ import annotations

from . import get_stack

# trainfit's --optimizer as the "type" of a DeepSpeed config's optimizer block (deepspeed 0.19.8 runtime/engine.py
# _configure_basic_optimizer): DeepSpeed's own Adam / AdamW (:2486-2492) and Lion (:2505-2511), else torch.optim's class
# of that name, SGD (:2548; momentum: trainfit's SGD with a momentum buffer). DeepSpeedConfig lower-cases DeepSpeed's
# own names (runtime/config.py:518-520) and keeps torch.optim's as written
OPTIMIZER_TYPES = {"adam": "Adam", "adamw": "AdamW", "lion": "Lion", "sgd": "SGD", "momentum": "SGD"}


def ds_config(s) -> dict:
    """DeepSpeed config JSON. train_batch_size = micro × accumulation × dp (DeepSpeed checks this identity). The
    ZeRO block names the buckets and overlap trainfit models (stacks/deepspeed.toml, DeepSpeed's own defaults),
    so the run allocates what the estimate counts; --offload adds the offload blocks."""
    ds = get_stack("deepspeed")
    fp16 = s.precision == "fp16-master"  # DeepSpeed's fp16 mode: fp16 weights + fp32 masters
    zero = {"stage": s.zero, "contiguous_gradients": ds.fact("contiguous_gradients"),
            # config.py:384-386: the default DeepSpeed resolves (stage == 3), or --overlap-comm at ZeRO-1/2
            "overlap_comm": s.zero in ds.fact("overlap_comm", "stages") or bool(getattr(s, "overlap_comm", False)),
            "reduce_bucket_size": ds.fact("reduce_bucket_size"),
            "allgather_bucket_size": ds.fact("allgather_bucket_size")}
    cfg = {
        # with sequence parallelism DeepSpeed counts world / sequence_parallel_size data-parallel ranks
        # (runtime/config.py:461-469)
        "train_batch_size": s.batch * s.grad_accum * s.dp // getattr(s, "ulysses", 1),
        "train_micro_batch_size_per_gpu": s.batch,
        "gradient_accumulation_steps": s.grad_accum,
        # the setup's clip (Setup.grad_clip_norm: --max-grad-norm, else stacks/deepspeed.toml [grad_clip], 1.0 as
        # DeepSpeed's own default and HF Trainer's integration set it); 0 turns DeepSpeed's clip off
        "gradient_clipping": s.grad_clip_norm,
        "bf16": {"enabled": s.precision == "bf16-master"},
        "fp16": {"enabled": fp16},
        "zero_optimization": zero,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if getattr(s, "ep", 1) > 1:
        # AutoEP (deepspeed 0.19.8 runtime/config.py:171-176 -> module_inject/auto_ep_config.py:42-50
        # parse_autoep_config): the HF model's MoE blocks replaced by AutoEPMoELayer, E / autoep_size experts a rank
        # (runtime/engine.py:816-913 _configure_expert_parallel); the preset found from the model's own config
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": s.ep}
    if getattr(s, "ulysses", 1) > 1:  # config.py:468-469; the groups: runtime/sequence_parallel/parallel_state_sp.py
        cfg["sequence_parallel_size"] = s.ulysses
    if s.zero == 3:
        zero.update({"stage3_prefetch_bucket_size": ds.fact("stage3_prefetch_bucket_size"),
                     "stage3_param_persistence_threshold": ds.fact("stage3_param_persistence_threshold"),
                     "stage3_max_live_parameters": ds.fact("stage3_max_live_parameters"),
                     "stage3_max_reuse_distance": ds.fact("stage3_max_reuse_distance"),
                     "sub_group_size": ds.fact("sub_group_size"),
                     "stage3_gather_16bit_weights_on_model_save": True})
    if s.offload_state in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": ds.fact("offload_optimizer"), "pin_memory": True}
    if s.offload_state == "params":
        zero["offload_param"] = {"device": ds.fact("offload_param"), "pin_memory": True}
    if s.recompute == "full":
        # DeepSpeed's own checkpointing API settings; a HF model must also call model.gradient_checkpointing_enable()
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return cfg
