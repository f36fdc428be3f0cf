"""DeepEP's communication buffers per rank under --moe-dispatcher deepep, beside PyTorch's caching allocator (no torch).

Both stacks that run DeepEP make one normal-mode Buffer per process on the first dispatch, sized for the larger of
DeepEP's recommended dispatch and combine configs of the group (megatron-core 0.16.1 moe/fused_a2a.py:33-65
get_buffer, over the dispatcher's tp × ep group; torchtitan 0.2.2 distributed/deepep/deepep.py:294-317, over the ep
group), for tokens of hidden × max(element size, 2) bytes (fused_a2a.py:21-30; deepep.py:288-291). The Buffer holds
(DeepEP dd758ca csrc/legacy/buffer.hpp:100-150; data/overheads.toml [deepep] cites each constant):
- the NVLink buffer, cudaMalloc'd: Config.get_nvl_buffer_size_hint (csrc/legacy/config.hpp:53-73) + the barrier
  signals and peer pointers after it;
- a 32 MiB workspace, cudaMalloc'd;
- over more than one NVLink domain of 8 ranks, the RDMA buffer (get_rdma_buffer_size_hint, config.hpp:75-97) from
  NVSHMEM's symmetric heap, whose physical memory DeepEP makes grow in 512 MiB granules, the first holding
  NVSHMEM's own start-up (deep_ep/buffers/legacy.py:121-122: "at least 256 MiB").
NB: the driver's page rounding of the two cudaMallocs is not counted (under by < 2 MiB each). NB: NVSHMEM's start-up is
taken at the 256 MiB DeepEP states as its least: errs low where it takes more than the granule's rest.
"""
from __future__ import annotations

from functools import lru_cache

from .data import load_toml

# the --moe-dispatcher whose buffers these are
DISPATCHER = "deepep"


@lru_cache(maxsize=1)
def _conf() -> dict:
    return load_toml("overheads.toml")["deepep"]


def groups() -> tuple[int, ...]:
    """The group sizes DeepEP's normal kernels run: the keys of its config maps (get_dispatch_config asserts the
    group is one: "Unsupported number of EP ranks")."""
    return tuple(sorted(int(k) for k in _conf()["dispatch"]))


def group(setup) -> int:
    """The ranks of the group a setup's Buffer is built over: the dispatcher's expert-TP × EP group (megatron-core's
    tp_ep; torchtitan's ep, where trainfit runs DeepEP at --tp 1)."""
    return setup.ep * setup.expert_tp


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def _token_bytes(c: dict, hidden_bytes: int) -> int:
    """One received token's slot in either buffer: its hidden bytes, SourceMeta, top-k indices and weights, scales
    (config.hpp:64-70, :87-93)."""
    return (hidden_bytes + c["source_meta_bytes"] + c["max_topk"] * (c["topk_idx_bytes"] + 4)
            + c["max_scales"] * 4)


def hint_bytes(hidden_bytes: int, ranks: int, sms: int) -> tuple[int, int]:
    """(NVLink, RDMA) bytes get_buffer asks for: the larger of the dispatch and combine configs' size hints
    (config.hpp:53-97), each rounded up to 128 bytes; RDMA 0 within one NVLink domain."""
    c = _conf()
    peers, channels = c["max_nvl_peers"], sms // 2
    rdma_ranks, nvl_ranks = max(ranks // peers, 1), min(ranks, peers)
    token = _token_bytes(c, hidden_bytes)
    nvl = rdma = 0
    for table in (c["dispatch"], c["combine"]):
        _, nvl_recv, rdma_send, rdma_recv = table[str(ranks)]
        n = channels * nvl_ranks * ((2 * rdma_ranks + 3) * 4 + nvl_recv * token)
        nvl = max(nvl, _ceil(n, 128))
        if ranks > peers:
            recv = _ceil(rdma_recv, rdma_send)  # the receive count rounded up to the send count (config.hpp:47)
            n = channels * rdma_ranks * ((2 * peers + 2) * 2 * 4 + recv * 2 * (token + 16))  # + an int4 per token
            rdma = max(rdma, _ceil(n, 128))
    return nvl, rdma


def buffer_bytes(hidden_bytes: int, ranks: int, sms: int) -> int:
    """The device bytes one rank's Buffer holds (module doc): the NVLink buffer and its signals, the workspace and,
    across NVLink domains, the NVSHMEM heap's granules for the RDMA buffer and NVSHMEM's start-up."""
    c = _conf()
    nvl, rdma = hint_bytes(hidden_bytes, ranks, sms)
    out = (nvl + c["signal_bytes"] if nvl else 0) + c["workspace_bytes"]
    if rdma:
        out += _ceil(rdma + c["nvshmem_start_bytes"], c["nvshmem_granularity_bytes"])
    return out
