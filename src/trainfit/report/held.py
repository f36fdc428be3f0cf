"""What the GPU holds beyond the allocated peak (issue 13), in words: the row labels and the one sentence that the
terminal table, the timeline plot, the HTML report and the web page all use (one definition, so they agree)."""
from __future__ import annotations

RESERVED_LABEL = "reserved (caching allocator)"
REQUIRED_LABEL = "required (fit rule)"
DEVICE_TOTAL_LABEL = "device total (nvidia-smi)"


def held_sentence(subject: str = "The peak", device_total: bool = True) -> str:
    """allocated vs reserved vs nvidia-smi in one sentence. subject: what shows the allocated bytes ("The peak",
    "The curve"); device_total: whether the device total is shown too (it needs a GPU)."""
    text = (f"{subject} is allocated memory (live tensors); reserved is what PyTorch's caching allocator holds "
            "when nothing limits it (freed blocks stay cached in their segments)")
    if device_total:
        text += ("; the device total adds the CUDA context and NCCL buffers — what nvidia-smi shows. The fit is "
                 "judged on required (the peak + the fragmentation the allocator cannot release: when cudaMalloc "
                 "fails it frees its cached free segments and retries) within the GPU's memory less --reserve "
                 "and those fixed overheads")
    return text + "."


def fit_numbers(fit) -> str:
    """The numbers a fit verdict was judged on (estimate.Fit), as every report shows them."""
    from ..units import fmt_bytes

    return f"required {fmt_bytes(fit.required)} of capacity {fmt_bytes(fit.capacity)}"


def verdict_word(judged, mode: str) -> str:
    """The verdict in words of `judged` (an estimate.Fit or Timing) for an estimate of `mode`, as every report shows
    it. A serving engine that fails a start-up check while its device total fits the GPU (KV cache shorter than
    --max-model-len, free memory under the requested share: analytic/engine.py) "does not start"; "does not fit" is
    kept for memory the GPU has not."""
    if judged.fits:
        return "fits"
    return "does not start" if mode == "serve" and judged.headroom >= 0 else "does not fit"


def overhead_label(name: str) -> str:
    """A Memory.overheads key (overheads.overheads: "cuda_context", "nccl_<process group>", "custom_allreduce",
    "deepep_buffers", "hybridep_buffers") as a row label."""
    if name == "cuda_context":
        return "CUDA context"
    if name == "custom_allreduce":
        return "SGLang custom all-reduce buffers"
    if name == "deepep_buffers":
        return "DeepEP buffers (NVLink, workspace, RDMA heap)"
    if name == "hybridep_buffers":
        return "HybridEP buffers (NVLink, RDMA)"
    if name.startswith("nccl_"):
        return f"NCCL buffers ({name[len('nccl_'):]} group)"
    return name.replace("_", " ")
