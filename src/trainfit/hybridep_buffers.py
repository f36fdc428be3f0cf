"""HybridEP's communication buffers per rank under --moe-dispatcher hybridep, beside PyTorch's caching allocator
(no torch).

megatron-core 0.16.1 builds one HybridEPBuffer per process on the first dispatch, over the dispatcher's tp × ep group,
for the rank's tokens at the dispatcher (moe/fused_a2a.py:278-320, :353-364). DeepEP's hybrid-ep branch (94a9f8f;
data/overheads.toml [hybridep] cites each constant) sizes its buffers for the worst case, every token of the group
routed to one rank:
- within the NVLink domain (buffer/intranode.cu:193-290): the combine's bf16 tokens and fp32 probabilities (one per
  local expert of each rank of the domain), shared by the dispatch, the dispatch's fp32 scales (one per 128 hidden)
  and a uint32 flag per chunk of 64 tokens of each rank, both ways;
- across NVLink domains (buffer/internode_doca.cu:383-432, :557-592): the dispatch's own tokens, probabilities and
  scales and those it forwards for the other domains, the combine's reduced and forwarded tokens and probabilities,
  and uint64 flags per chunk; the opt-in NIXL build allocates the same (buffer/internode_nixl.cu:154-222; within a
  few hundred bytes: data/overheads.toml [hybridep]).
The tokens are raised to at least 512 and padded to the 64-token chunk (csrc/hybrid_ep/config.cuh:382-387).
NB: the few-byte flag words, the preprocessing scratch (a few KiB) and the driver's page rounding are not counted
(under). NB: the per-step tensors the dispatch and combine return come from the caching allocator (counted as the
all-to-all's tensors: analytic/memory.py NOT_IN_MEMORY).
"""
from __future__ import annotations

from functools import lru_cache

from .data import load_toml

# the --moe-dispatcher whose buffers these are
DISPATCHER = "hybridep"


@lru_cache(maxsize=1)
def _conf() -> dict:
    return load_toml("overheads.toml")["hybridep"]


def padded_tokens(tokens: int) -> int:
    """The tokens a rank's buffers are sized for: at least 512, padded to the combine chunk (config.cuh:382-387)."""
    c = _conf()
    chunk = c["chunk_tokens"]
    return -(-max(int(tokens), c["min_tokens"]) // chunk) * chunk


def buffer_bytes(hidden: int, tokens: int, local_experts: int, per_domain: int, ranks: int) -> int:
    """The device bytes one rank's HybridEPBuffer holds (module doc): `tokens` at the rank's dispatcher, `hidden`
    wide, `local_experts` a rank, over `ranks` ranks of which `per_domain` share its NVLink domain."""
    c = _conf()
    t, nodes = padded_tokens(tokens), max(1, ranks // per_domain)
    chunks = t // c["chunk_tokens"]
    token, scales = hidden * c["token_bytes"], hidden // c["scale_block"] * 4
    probs = local_experts * per_domain * 4  # a token's probabilities for the experts of the NVLink domain
    out = t * ranks * (token + probs + scales) + 2 * chunks * ranks * c["flag_bytes"]  # intranode.cu:193-290
    if nodes > 1:
        other = nodes - 1
        dispatch = t * (token + probs * nodes + scales) + t * other * (token + probs + scales)  # internode_doca:388-402
        combine = 2 * t * other * (hidden * 2 + probs)  # the reduced and the forwarded tokens (:559-566)
        flags = 4 * (chunks * other + 2 * other) * c["rdma_flag_bytes"]  # group and attention flags, both ways
        out += dispatch + combine + flags
    return out
