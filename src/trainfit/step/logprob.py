"""TRL's fused LM head as its torch path runs it (no Triton: CPUs and fake tensors), for the RL step (step/grpo.py).

TRL 1.16's `add_fused_lm_head` (trl/trainer/utils.py:1548-1660) makes `model(..., labels, fused_lm_head=True)` run
the backbone and score the next-token labels through `_ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py:
299-470): logits tiles of TOKEN_CHUNK_SIZE tokens × _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries, folded into
per-token online-logsumexp statistics; the backward recomputes each tile. Off Triton every position is scored
(`compact` false: utils.py:1636-1650) and the tiles fold with torch ops (`_forward_tile`, `_backward_tile`,
chunked_logprob.py:211-296). This module runs the same tensors in the same order with the outputs the GRPO
trainer asks for (log-probs, and the entropy for the policy: grpo_trainer.py:1068-1077); TRL is not a
dependency (the module it mirrors is named at each step). No logit scaling or soft-capping (the catalog's
Llama-style models have none), temperature 1.
"""
from __future__ import annotations

import torch

from ..analytic.loss import TRL_TILE_TOKENS, TRL_TILE_VOCAB


class ChunkedLogProb(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], targets [N]) -> (log-probs [N], entropy [N] or None), fp32."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, entropy_out: bool):
        ctx.set_materialize_grads(False)
        device, n, vocab = hidden.device, hidden.shape[0], weight.shape[0]
        compute = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        # chunked_logprob.py:340-347: the seven statistics and one tile buffer, whole (TRL allocates all seven; the
        # torch tile fold reads four, the other three are held for the memory they take)
        running_max = torch.full((n,), float("-inf"), device=device, dtype=torch.float32)
        sum_exp = torch.zeros((n,), device=device, dtype=torch.float32)
        x_sum_exp = torch.zeros((n,), device=device, dtype=torch.float32)
        sq_sum_exp = torch.zeros((n,), device=device, dtype=torch.float32)
        z_sum = torch.zeros((n,), device=device, dtype=torch.float32)
        max_before_target = torch.full((n,), float("-inf"), device=device, dtype=torch.float32)
        target_logit = torch.zeros((n,), device=device, dtype=torch.float32)
        mm_buf = torch.empty((min(n, TRL_TILE_TOKENS), TRL_TILE_VOCAB), device=device, dtype=compute)
        for t0 in range(0, n, TRL_TILE_TOKENS):
            t1 = min(t0 + TRL_TILE_TOKENS, n)
            chunk = hidden[t0:t1].to(compute)
            for v0 in range(0, vocab, TRL_TILE_VOCAB):
                v1 = min(v0 + TRL_TILE_VOCAB, vocab)
                tile = mm_buf[:t1 - t0, :v1 - v0]
                torch.mm(chunk, weight[v0:v1].to(compute).t(), out=tile)
                _forward_tile(tile, targets[t0:t1], running_max[t0:t1], sum_exp[t0:t1], x_sum_exp[t0:t1],
                              target_logit[t0:t1], v0, v1 - v0, entropy_out)
        log_z = running_max + torch.log(sum_exp)
        logprobs = target_logit - log_z
        entropy = log_z - x_sum_exp / sum_exp if entropy_out else None
        ctx.save_for_backward(hidden, weight, targets, log_z, log_z if entropy is None else entropy)
        ctx.compute = compute
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors
        compute, n, vocab = ctx.compute, hidden.shape[0], weight.shape[0]
        need_h, need_w = ctx.needs_input_grad[:2]
        # chunked_logprob.py:405-415: fp32 accumulators, one tile buffer
        grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if need_h else None
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        mm_buf = torch.empty((min(n, TRL_TILE_TOKENS), TRL_TILE_VOCAB), device=hidden.device, dtype=compute)
        grad_logprobs = grad_logprobs.float().contiguous() if grad_logprobs is not None else None
        grad_entropy = grad_entropy.float().contiguous() if grad_entropy is not None else None
        for t0 in range(0, n, TRL_TILE_TOKENS):
            t1 = min(t0 + TRL_TILE_TOKENS, n)
            chunk = hidden[t0:t1].to(compute)
            for v0 in range(0, vocab, TRL_TILE_VOCAB):
                v1 = min(v0 + TRL_TILE_VOCAB, vocab)
                w_chunk = weight[v0:v1].to(compute)
                tile = mm_buf[:t1 - t0, :v1 - v0]
                torch.mm(chunk, w_chunk.t(), out=tile)
                _backward_tile(tile, targets[t0:t1], log_z[t0:t1], entropy[t0:t1],
                               None if grad_logprobs is None else grad_logprobs[t0:t1],
                               None if grad_entropy is None else grad_entropy[t0:t1], v0, v1 - v0)
                if grad_hidden is not None:  # _addmm_fp32 (chunked_logprob.py:52-63) off CUDA: addmm_ in fp32
                    grad_hidden[t0:t1].addmm_(tile.float(), w_chunk.float())
                if grad_weight is not None:
                    grad_weight[v0:v1].addmm_(tile.float().t(), chunk.float())
        return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
                grad_weight.to(weight.dtype) if grad_weight is not None else None, None, None)


def _forward_tile(tile, targets, running_max, sum_exp, x_sum_exp, target_logit, start, n_cols, entropy: bool):
    """chunked_logprob.py:211-254 `_forward_tile` (temperature 1, no scale or soft-cap; the statistics TRL's GRPO
    does not ask for are not folded)."""
    z = tile.float() * 1.0 * 1.0  # _torch_transform: z * logit_scale, then * inv_t (two new tensors)
    local = targets - start
    new_m = torch.maximum(running_max, z.amax(-1))
    rescale = torch.exp(running_max - new_m)
    e = torch.exp(z - new_m.unsqueeze(-1))
    sum_exp.mul_(rescale).add_(e.sum(-1))
    if entropy:
        x_sum_exp.mul_(rescale).add_((e * z).sum(-1))
    running_max.copy_(new_m)
    in_tile = (local >= 0) & (local < n_cols)
    target_z = z.gather(-1, local.clamp(0, n_cols - 1).unsqueeze(-1)).squeeze(-1)
    target_logit.copy_(torch.where(in_tile, target_z, target_logit))


def _backward_tile(tile, targets, log_z, entropy, grad_logprobs, grad_entropy, start, n_cols):
    """chunked_logprob.py:257-296 `_backward_tile` (temperature 1, no scale or soft-cap)."""
    y = tile.float() * 1.0
    z = y * 1.0
    log_p = z - log_z.unsqueeze(-1)
    p = torch.exp(log_p)
    grad = torch.zeros_like(z)
    if grad_logprobs is not None:
        is_target = torch.arange(start, start + n_cols, device=z.device) == targets.unsqueeze(-1)
        grad += grad_logprobs.unsqueeze(-1) * (is_target.float() - p)
    if grad_entropy is not None:
        grad -= grad_entropy.unsqueeze(-1) * p * (log_p + entropy.unsqueeze(-1))
    grad = grad * 1.0
    tile.copy_(grad * 1.0)


def per_token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, completion_len: int,
                    entropy: bool = False):
    """`model(input_ids, attention_mask, labels, fused_lm_head=True)` as TRL patches it (utils.py:1596-1660) on a
    device without Triton, and the slice _get_per_token_logps_and_entropies keeps (grpo_trainer.py:1493-1501):
    (log-probs [B, completion_len], entropy or None). `attention_mask` None: no padding. TRL passes an all-ones
    mask then, which transformers' SDPA path drops (masking_utils.py:292, _ignore_causal_mask_sdpa: `padding_mask
    is None or fast_all(padding_mask)`) but cannot read on fake tensors (:280, is_tracing): None is the same
    attention on real tensors and traceable."""
    labels = (input_ids.clone() if attention_mask is None else input_ids.masked_fill(attention_mask == 0, -100))
    labels[:, :-completion_len] = -100
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden_states = out.last_hidden_state[:, :-1]
    labels = labels[:, 1:]
    mask = labels != -100
    head = model.get_output_embeddings()
    logps, ent = ChunkedLogProb.apply(hidden_states.reshape(-1, hidden_states.size(-1)), head.weight,
                                      labels.clamp(min=0).reshape(-1), entropy)
    logps = logps.view(mask.shape).masked_fill(~mask, 0)
    ent = ent.view(mask.shape).masked_fill(~mask, 0) if ent is not None else None
    return logps[:, -completion_len:], (ent[:, -completion_len:] if ent is not None else None)
