"""--mode rl on many GPUs (analytic/rl_placement.py) against published RL runs and rules: did the setup run, or
was it refused / out of memory? Validation only: nothing here is fitted, and no row gates a test.

Each row is one published setup translated into trainfit's settings, what was published about it, what trainfit
predicts (the per-GPU peak, its phase, the host memory per node) and whether the two agree on "ran" vs "OOM".

  verl-grpo-qwen2-7b   verl's GRPO example (examples/grpo_trainer/run_qwen2-7b.sh, volcengine/verl b178a3cd,
                       v0.7.0-125): Qwen2-7B-Instruct on 8 GPUs of one node, train_batch_size 1024 prompts, n 5,
                       prompt 512 + response 1024, ppo_micro_batch_size_per_gpu 40, gradient checkpointing, KL loss
                       (a reference, ref.fsdp_config.param_offload True), actor params/optimizer on the GPU, vLLM
                       TP 2 at gpu_memory_utilization 0.6, free_cache_engine (default True: sleep level 2). Shipped
                       as a working example; the GPU is not named (NB: an 80 GB H100 assumed).
  openrlhf-llama3-8b   OpenRLHF's hybrid-engine quick start (README.md:445-487, OpenRLHF 3c3be623), "for 8x A100
                       (80GB)" (README.md:766): Llama-3-8B actor, reference and reward model colocated
                       (--train.colocate_all), vLLM 4 engines × TP 2 at 0.5 with --vllm.enable_sleep (level 1:
                       vllm_engine.py:138) and --ds.enable_sleep (ZeRO-3 states to pinned host memory:
                       deepspeed_utils.py:151-188), rollout.batch_size 1024 prompts, n 1, 1024 + 1024 tokens,
                       micro-batches of 1 (train_ppo_ray.py:377, 393), gradient checkpointing, kl init_coef 0.01.
  verl-rollout-rule    verl's tuning rule for the engine (docs/perf/best_practices.rst:126): memory_per_gpu ×
                       gpu_memory_utilization × TP must exceed 2 × parameters (bf16 weights): Qwen2.5-7B at 0.15 of
                       an 80 GB GPU with TP 1 (12 GB < 15.2 GB) cannot hold its weights.

NB (direction of the error, per row): trainfit runs every completion to its maximum length (verl's
use_remove_padding / OpenRLHF's packing train on the real tokens: the GSM8K answers are far shorter) -> over;
the training loss through TRL's fused log-prob head where verl/OpenRLHF materialise [tokens, vocabulary] logits
per micro-batch -> under; OpenRLHF's --ds.enable_sleep keeps the bf16 weights on the GPU (lp_params not offloaded,
deepspeed_utils.py:176-177) where --actor-param-offload moves them -> under; Llama-3-8B is trainfit's llama-3.1-8b
(the same shapes, a longer RoPE) and Qwen2-7B is qwen2.5-7b (the same shapes).
Run: python -m bench run rl_published (table only; h8's posttrain bench imports rows()).
"""
from __future__ import annotations

import argparse

from trainfit.api import Request, analytic
from trainfit.errors import SetupError
from trainfit.units import fmt_bytes

ABOUT = {"summary": "--mode rl on many GPUs: published verl/OpenRLHF runs and rules, ran vs OOM (validation)",
         "minutes": 0.1, "quick": None}

CASES = [
    ("verl-grpo-qwen2-7b", "ran (shipped example, 8 GPUs of one node)",
     dict(model="qwen2.5-7b", gpu="H100-80GB", mode="rl", rl_algo="grpo", dp=8, zero=3, batch=128, group_size=5,
          prompt_len=512, completion_len=1024, grad_accum=16, recompute="full", beta=0.001, rollout="vllm",
          rollout_tp=2, vllm_gpu_memory_utilization=0.6, vllm_sleep_level=2, ref_param_offload=True)),
    ("openrlhf-llama3-8b", "ran (README quick-start template for 8x A100 80GB)",
     dict(model="llama-3.1-8b", gpu="A100-80GB", mode="rl", rl_algo="grpo", dp=8, zero=3, batch=128, group_size=1,
          prompt_len=1024, completion_len=1024, grad_accum=128, recompute="full", beta=0.01,
          reward_model="llama-3.1-8b", precision="bf16-master", rollout="vllm", rollout_tp=2,
          vllm_gpu_memory_utilization=0.5, vllm_sleep_level=1, actor_param_offload=True,
          actor_optimizer_offload=True)),
    ("verl-rollout-rule", "does not start (engine weights > its share: best_practices.rst:126)",
     dict(model="qwen2.5-7b", gpu="H100-80GB", mode="rl", dp=8, zero=3, batch=8, group_size=8, prompt_len=512,
          completion_len=1024, grad_accum=8, recompute="full", rollout="vllm", vllm_gpu_memory_utilization=0.15,
          vllm_sleep_level=2)),
]


def _predict(kw: dict) -> tuple[str, dict]:
    try:
        e = analytic(Request(**kw))
    except SetupError as err:
        return "refused", {"why": str(err)}
    pl = e.detail.rl.placement
    return ("ran" if e.time.fits else "oom"), {"peak": e.memory.peak, "peak_phase": e.memory.peak_phase,
                                                "required": e.memory.required, "host_per_node": pl.get("host_per_node", 0),
                                                "step_seconds": e.time.step_seconds}


def rows() -> list[dict]:
    """One dict per published case: name, setup (Request kwargs), published, predicted (ran / oom / refused),
    agrees (the published outcome and the prediction both ran, or both did not), and the predicted numbers."""
    out = []
    for name, published, kw in CASES:
        verdict, numbers = _predict(kw)
        ran = published.startswith("ran")
        out.append({"case": name, "setup": kw, "published": published, "predicted": verdict,
                    "agrees": ran == (verdict == "ran"), **numbers})
    return out


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    for r in rows():
        detail = (f"peak {fmt_bytes(r['peak'])} at {r['peak_phase']}, host {fmt_bytes(r['host_per_node'])}/node"
                  if "peak" in r else r["why"])
        print(f"{r['case']:20} published: {r['published']:55} predicted: {r['predicted']:8} "
              f"{'agrees' if r['agrees'] else 'DISAGREES'}  {detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
