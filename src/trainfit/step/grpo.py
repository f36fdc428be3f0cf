"""A minimal GRPO step in the order TRL 1.16's GRPOTrainer runs it, shared by the trace and the CPU measurement
(trace/rl.py, measure/rl.py); analytic/rl.py models the same phases.

    phase("generate"): no_grad; prefill of every completion's prompt, then completion_len − 1 greedy decode steps
                       on a DynamicCache (transformers' generate, grpo_trainer.py:1858-1873, without sampling or EOS:
                       full-length completions, fake-tensor safe)
    phase("score"):    no_grad; the reference model's per-token log-probs, micro-batch by micro-batch
                       (grpo_trainer.py:2709-2739; only when beta > 0)
    per micro-batch:   phase("forward"): the policy's log-probs and entropy (step/logprob.py) and the GRPO loss
                       (_compute_loss, grpo_trainer.py:3020-3160: loss_type "dapo", TRL's default,
                       grpo_config.py:801; old log-probs = the current ones detached, :3065-3066)
                       phase("backward"): loss.backward()
    phase("optimizer"): clip_grad_norm_ (GRPOTrainer runs the Trainer's loop: max_grad_norm, step/standard.py
                        clip_gradients); optimizer.step(); zero_grad(set_to_none=True); phase("end")

Under amp-* each forward runs under torch.autocast (accelerate wraps the model's forward, and generate calls it).
The step sees: `prompts` (completions × prompt_len int64, each prompt repeated group-size times as TRL's
RepeatSampler does), `advantages` (completions fp32).
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Callable

import torch

from ..setup import Setup
from .build import autocast_dtype

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import ModelSpec
from .logprob import per_token_logps
from .standard import _unpacked_sequences, optimizer_phase

# the step's phase markers -> the Phase each one's high point is reported as (the training markers as in
# step/standard.py's step)
RL_PHASES = {"generate": "generate", "score": "score", "forward": "forward_end", "backward": "backward",
             "optimizer": "optimizer_step", "end": "optimizer_step"}
EPSILON = 0.2  # TRL's epsilon (clip range) default, grpo_config.py (epsilon_high defaults to epsilon)


def rl_inputs(spec: "ModelSpec", setup: Setup, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(prompts, advantages): each of --batch random prompts repeated --group-size times (TRL's RepeatSampler),
    one fp32 advantage per completion."""
    prompts = torch.randint(0, spec.vocab, (setup.batch, setup.prompt_len), device=device)
    return (prompts.repeat_interleave(setup.group_size, dim=0),
            torch.randn(setup.batch * setup.group_size, device=device))


def build(spec: "ModelSpec", setup: Setup, device="cpu"):
    """(policy, reference or None, optimizer), the optimizer's states not made yet (the callers warm up)."""
    from ..analytic.rl import train_setup
    from .build import build_model
    from .standard import make_optimizer

    ts = train_setup(setup)
    model = build_model(spec, ts, device=device)
    ref = None
    if setup.beta > 0:
        # TRL loads the reference with from_pretrained and leaves its parameters' requires_grad on
        # (grpo_trainer.py:985-1003, 1188 prepare_model(evaluation_mode=True)): under autocast its weights' casts are
        # cached like the policy's (autocast caches casts of leaves that require grad)
        ref = build_model(spec, ts, device=device).eval()
    return model, ref, make_optimizer(model, ts)


def _autocast(setup: Setup, device_type: str):
    dtype = autocast_dtype(setup)
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def generate(model, prompts: torch.Tensor, completion_len: int, setup: Setup,
             on_cache: Callable[[object], None] = lambda cache: None) -> torch.Tensor:
    """prompt + completion ids (completions × (prompt_len + completion_len)), greedy, every step's last-position
    logits in fp32 as generate's _sample takes them (`.to(copy=True, dtype=torch.float32)`)."""
    params = inspect.signature(model.forward).parameters
    kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers 5.24 renamed it
    device_type = prompts.device.type if prompts.device.type in ("cpu", "cuda") else "cpu"
    ids = prompts
    cache = None
    with torch.no_grad():
        for _ in range(completion_len):
            with _autocast(setup, device_type):
                step_ids = ids if cache is None else ids[:, -1:]
                out = model(input_ids=step_ids, use_cache=True, **({cache_arg: cache} if cache is not None else {}),
                            **kw)
            cache = getattr(out, cache_arg)
            on_cache(cache)
            logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
            del out
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=-1)
            del logits
    return ids


def grpo_step(model, ref_model, optimizer, prompts: torch.Tensor, advantages: torch.Tensor, setup: Setup,
              phase: Callable[[str], None] = lambda name: None,
              on_cache: Callable[[object], None] = lambda cache: None) -> float:
    """One GRPO step (module docstring); returns the last micro-batch's loss (nan on fake tensors). HF's mask
    building takes the real tensors' path on fake ones too (standard.py _unpacked_sequences)."""
    with _unpacked_sequences():
        return _grpo_step(model, ref_model, optimizer, prompts, advantages, setup, phase, on_cache)


def _grpo_step(model, ref_model, optimizer, prompts, advantages, setup, phase, on_cache) -> float:
    c = setup.completion_len
    device_type = prompts.device.type if prompts.device.type in ("cpu", "cuda") else "cpu"
    phase("generate")
    ids = generate(model, prompts, c, setup, on_cache)
    mask = torch.ones_like(ids)  # no padding, no EOS: every token attended and scored (completion_mask)
    micro = ids.shape[0] // setup.grad_accum
    ref = None
    if setup.beta > 0:
        phase("score")
        with torch.no_grad(), _autocast(setup, device_type):
            ref = torch.cat([per_token_logps(ref_model, ids[i:i + micro], None, c)[0]
                             for i in range(0, ids.shape[0], micro)], dim=0)
    loss = None
    for i in range(0, ids.shape[0], micro):
        phase("forward")
        with _autocast(setup, device_type):
            logps, _entropy = per_token_logps(model, ids[i:i + micro], None, c, entropy=True)
        loss = _grpo_loss(logps, advantages[i:i + micro], mask[i:i + micro, -c:],
                          None if ref is None else ref[i:i + micro], setup.beta, ids.shape[0] * c)
        phase("backward")
        loss.backward()
    return optimizer_phase(model, optimizer, loss, setup, phase)


def _grpo_loss(logps, advantages, mask, ref, beta: float, items: int):
    """grpo_trainer.py:3065-3150 for loss_type dapo, token-level importance sampling, on-policy."""
    old = logps.detach()
    coef_1 = torch.exp(logps - old)
    adv = advantages.unsqueeze(1)
    coef_2 = torch.clamp(coef_1, 1 - EPSILON, 1 + EPSILON)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if ref is not None:
        per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token_loss = per_token_loss + beta * per_token_kl
    # dapo: num_items_in_batch (the generation batch's tokens) × grad_accum / steps_per_generation (= grad_accum by
    # default) on one process (:3150-3155)
    return (per_token_loss * mask).sum() / items
