"""The trace of one RL step (step/grpo.py) on fake tensors: the policy, its optimizer in steady state and the
reference model built under FakeTensorMode, the step recorded like a training step (trace/train.py), the KV cache
of the rollout labelled as such. Phases: generate, score, forward_end, backward, optimizer_step."""
from __future__ import annotations

from ..analytic import rl
from ..setup import Setup
from ..spec import ModelSpec
from ..step.grpo import RL_PHASES, build, rl_inputs
from .analysis import analyse
from .fake import fake_mode, translated_errors
from .inference import cache_tensors
from .modules import ModuleStack
from .recorder import KV_CACHE, PARAMETER, AllocationRecorder
from .train import _grad_hooks, adopt_resident, warm_up_optimizer


def trace_rl(spec: ModelSpec, setup: Setup):
    """(trace.analysis.Analysis, recorder, policy) of one RL step."""
    from ..step.grpo import grpo_step

    with translated_errors(spec.name), fake_mode():
        model, ref, optimizer = build(spec, setup)
        warm_up_optimizer(model, optimizer)
        prompts, adv = rl_inputs(spec, setup)
        modules = ModuleStack(model)
        rec = AllocationRecorder(modules, count_flops=False, round_cuda=setup.device == "cuda")
        handles = _grad_hooks(rec, model)

        def on_cache(cache):
            for t in cache_tensors(cache):
                rec.adopt(t, KV_CACHE)

        try:
            with modules, rec:
                adopt_resident(rec, model, optimizer, [{"prompts": prompts, "advantages": adv}])
                for name, p in (ref.named_parameters() if ref is not None else ()):
                    rec.adopt(p, PARAMETER, "ref." + name)
                start = rec.event
                rec.reset_peak()
                grpo_step(model, ref, optimizer, prompts, adv, setup, phase=rec.set_phase, on_cache=on_cache)
        finally:
            for h in handles:
                h.remove()
        return analyse(rec, start, RL_PHASES), rec, model


def trace_rl_estimate(spec: ModelSpec, setup: Setup):
    """The trace engine's Estimate of one RL step (--engine trace --mode rl)."""
    import time

    from .engine import NOTES, estimate_from

    t0 = time.perf_counter()
    an, rec, model = trace_rl(spec, setup)
    sh = rl.shape(setup)
    est = estimate_from(spec.name, model, setup, rec, an, sh.completions * sh.seq,
                        time.perf_counter() - t0, NOTES + (
                            "RL step (step/grpo.py): greedy full-length generation with a DynamicCache, the "
                            "reference's log-probs, the policy's GRPO micro-batches through TRL's fused head (torch "
                            "path), the optimizer step",))
    return est

