"""The deepspeed stack (DeepSpeed 0.19.8's ZeRO engine over an HF model): the engine's own data parallelism,
partitions and buckets (analytic/parallel/deepspeed.py) and its optimizer's clip over the rank's gradient partition.
Its facts are stacks/deepspeed.toml."""
from __future__ import annotations

from ...errors import SetupError
from ...setup import Setup
from ...spec import ModelSpec
from .. import grad_clip
from ..parallel.deepspeed import overlap_comm
from .base import StackModel


class DeepSpeedModel(StackModel):
    torch_data_parallel = False  # runtime/engine.py (its own allreduce / ZeRO reduce-scatter buckets)
    torch_optimizer = False  # runtime/zero/stage_1_and_2.py:556, fp16/fused_optimizer.py:100 (flat fp32 groups)
    zero_engine = True

    def check_model(self, spec: ModelSpec, setup: Setup) -> None:
        """--ep is AutoEP, which replaces only the MoE blocks of the HF model types its presets name (stacks/
        deepspeed.toml [expert_parallel] families: deepspeed 0.19.8 module_inject/auto_ep_presets/registry.py:20-29,
        :86-92 preset_name_for_hf_model_type)."""
        if setup.ep <= 1 or not spec.is_moe:
            return
        families = setup.stack_facts.fact("expert_parallel", "families")
        if spec.family not in families:
            raise SetupError(f"--ep {setup.ep} on --stack deepspeed is AutoEP, whose presets cover the model types "
                             f"{', '.join(families)}, not {spec.family} ({spec.name}); drop --ep, or use --stack "
                             "megatron or torchtitan")

    def notes(self, spec: ModelSpec, setup: Setup) -> list[str]:
        """Under --ep: AutoEP's router-logit retargeting calls transformers' output-capture registry as a dict
        (deepspeed 0.19.8 module_inject/auto_ep_presets/base.py:325-328 `registry.get(key, default)`), which
        transformers 5.24's _CanRecordRegistry.get (utils/output_capturing.py:48-50) does not take."""
        notes = super().notes(spec, setup)
        if setup.ep > 1:
            notes.append("AutoEP (deepspeed 0.19.8) with transformers 5.24: deepspeed.initialize raises 'TypeError: "
                         "_CanRecordRegistry.get() takes 2 positional arguments but 3 were given' "
                         "(auto_ep_presets/base.py:325-328); trainfit's measure step reads the registry as a dict "
                         "(step/deepspeed.py), a run needs the same or another transformers release")
        return notes

    def reduce_behind_backward(self, setup: Setup) -> bool:
        """With overlap_comm (ZeRO-3's default, --overlap-comm at 1/2) on its reduction stream; else on the
        backward's stream (stage_1_and_2.py:1590-1614) or after the backward (ZeRO-0: engine.py:3088-3095)."""
        return overlap_comm(setup)

    def clipped_params(self, setup: Setup, trained: float) -> float:
        """ZeRO-1/2/3: the rank's gradient partition (runtime/zero/stage_1_and_2.py:2951, stage3.py:2579)."""
        return trained / setup.dp if setup.zero >= 1 else trained

    def clip_work(self, setup, st, clipped, tensors, largest, sizes):
        """Inside the engine's optimizer step (grad_clip.deepspeed_clip)."""
        return grad_clip.deepspeed_clip(setup, st, clipped, tensors, largest)


MODEL = DeepSpeedModel()
