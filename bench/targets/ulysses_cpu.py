"""DeepSpeed's UlyssesSPAttentionHF (deepspeed 0.19.8 runtime/sequence_parallel/ulysses_sp.py) run on CPU ranks
(gloo) around transformers' SDPA attention: per rank, the bytes each all-to-all is given (forward and backward) and
the bytes the attention saves for backward, beside the same attention run without Ulysses on the rank's slice of
the sequence with every head. A helper of tests/analytic/test_long_context.py (heavy tier); nothing is fitted.

    ulysses_probe(heads, kv_heads, head_dim, seq, ranks) -> [per rank {"a2a_forward", "a2a_backward", "saved",
                                                              "saved_slice_all_heads"}]
"""
from __future__ import annotations

import json
import os
import pickle
import sys


def ulysses_probe(heads: int, kv_heads: int, head_dim: int, seq: int, ranks: int = 2, timeout: int = 300) -> list[dict]:
    from bench.targets.deepspeed_cpu import rank_job

    job = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, seq=seq)
    return rank_job(__spec__.name, "--worker", job, ranks, "ulysses", timeout)


def _saved_bytes(fn):
    """Run fn() recording the unique storages autograd saves; (result, bytes)."""
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def worker(path: str) -> None:
    import torch
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from deepspeed.sequence import layer as ds_layer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    job = pickle.load(open(path, "rb"))
    deepspeed.init_distributed(dist_backend="gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    heads, kv, d, seq = job["heads"], job["kv_heads"], job["head_dim"], job["seq"]
    local = seq // n
    group = torch.distributed.new_group(list(range(n)))
    sent = {"now": "forward", "forward": 0, "backward": 0}
    real = torch.distributed.all_to_all_single

    def counting(output, input, *a, **k):  # the exchange's input on this rank
        sent[sent["now"]] += input.numel() * input.element_size()
        return real(output, input, *a, **k)

    ds_layer.dist.all_to_all_single = counting  # (deepspeed/sequence/layer.py:329 calls dist.all_to_all_single)

    class Attn(torch.nn.Module):  # what transformers' sdpa_attention_forward reads off the attention module
        is_causal = True
        num_key_value_groups = heads // kv

    ulysses = UlyssesSPAttentionHF(sdpa_attention_forward, batch_size=1, attn_head_count=heads, attn_head_size=d,
                                   kv_head_count=kv, num_hidden_layers=1, process_group=group,
                                   local_seq_length=local, global_seq_length=seq)
    ulysses.core_attn_implementation = "sdpa"
    torch.manual_seed(rank)
    q = torch.randn(1, heads, local, d, requires_grad=True)
    k = torch.randn(1, kv, local, d, requires_grad=True)
    v = torch.randn(1, kv, local, d, requires_grad=True)
    pos = torch.arange(rank * local, (rank + 1) * local).unsqueeze(0)
    module = Attn()
    (out, _), saved = _saved_bytes(lambda: ulysses(module, q, k, v, None, position_ids=pos))
    sent["now"] = "backward"
    out.sum().backward()
    # the same core on this rank's slice with every head, no exchange
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    _, saved_slice = _saved_bytes(lambda: sdpa_attention_forward(module, q2, k2, v2, None)[0])
    with open(os.path.join(job["dir"], f"rank{rank}.json"), "w") as f:
        json.dump({"a2a_forward": sent["forward"], "a2a_backward": sent["backward"], "saved": saved,
                   "saved_slice_all_heads": saved_slice}, f)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
