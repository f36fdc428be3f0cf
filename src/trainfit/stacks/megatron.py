"""Megatron-Core's rules that are code, not facts (stacks/megatron.toml holds the facts). `setup` is read by
attribute: this layer does not import trainfit.setup."""
from __future__ import annotations


def refuse(setup) -> str | None:
    """Megatron's expert layout: the expert-parallel × expert-tensor-parallel group tiles the dp × cp × tp ranks of a
    pipeline stage (megatron-core 0.16.1 parallel_state.py:788-794: world_size divisible by etp × ep × pp); and its
    overlap (_moe_overlap, _tp_overlap), CPU offloading (_cpu_offloading), fused cross-entropy (_loss_fusion) and
    low-precision checks (_low_precision).
    Else None."""
    if (setup.ep > 1 or setup.etp is not None) and (setup.dp * setup.cp * setup.tp) % (setup.ep * setup.expert_tp):
        return (f"--ep {setup.ep} × --etp {setup.expert_tp} must divide the dp × cp × tp = "
                f"{setup.dp * setup.cp * setup.tp} ranks of a pipeline stage (Megatron's expert layout)")
    return (_moe_overlap(setup) or _tp_overlap(setup) or _cpu_offloading(setup) or _loss_fusion(setup)
            or _low_precision(setup))


def _loss_fusion(setup) -> str | None:
    """--loss-fusion te: Transformer Engine's parallel_cross_entropy runs Triton kernels (TransformerEngine v2.9
    transformer_engine/pytorch/triton/cross_entropy.py:297-338), which need a CUDA device; the native kernels are
    megatron-core's own torch.compile'd functions (fusions/fused_cross_entropy.py:12-84, jit.py:16-23), which also
    compile for CPU."""
    if getattr(setup, "loss_fusion", "none") == "te" and setup.device != "cuda":
        return (f"--loss-fusion te: Transformer Engine's cross-entropy runs Triton kernels, which do not run on "
                f"--device {setup.device}: use --device cuda, or --loss-fusion native")
    return None


def _cpu_offloading(setup) -> str | None:
    """--offload-layers (cpu_offloading)'s own checks (megatron-core 0.16.1 transformer_config.py:1144-1152): no
    pipeline parallelism, no activation recomputation (recompute_granularity set: selective or full), and no CUDA
    graphs (:1722-1723); Transformer Engine's offload context, whose handler runs its copies on CUDA streams
    (TransformerEngine v2.9 cpu_offload.py:353-354; transformer_block.py:318-320 refuses it without TE). The count
    against the model's layers is the model's (analytic/stacks/megatron.py check_model)."""
    if not getattr(setup, "offload_layers", 0):
        return None
    why = None
    if setup.pp > 1:
        why = "Megatron has no pipeline parallelism with CPU offloading (transformer_config.py:1144-1147): use --pp 1"
    elif setup.recompute_policy != "none":
        why = ("Megatron refuses it with activation recomputation (transformer_config.py:1149-1152): use "
               "--recompute none")
    elif setup.cuda_graph_scope:
        why = "Megatron refuses CUDA graphs with CPU offloading (transformer_config.py:1722-1723): drop --cuda-graph-scope"
    elif setup.device != "cuda":
        why = (f"Transformer Engine's offload context copies on CUDA streams, which do not run on --device "
               f"{setup.device}: use --device cuda")
    return f"--offload-layers: {why}" if why else None


def _tp_overlap(setup) -> str | None:
    """--tp-comm-overlap runs Transformer Engine's userbuffers, CUDA kernels (transformer_engine/common/
    comm_gemm_overlap); its need of sequence parallelism is setup/rules.py's (Megatron-LM arguments.py:915-916)."""
    if getattr(setup, "tp_comm_overlap", False) and setup.device != "cuda":
        return (f"--tp-comm-overlap runs Transformer Engine's userbuffers CUDA kernels, which do not run on --device "
                f"{setup.device}: use --device cuda")
    return None


def _moe_overlap(setup) -> str | None:
    """overlap_moe_expert_parallel_comm's own checks (megatron-core 0.16.1 transformer_config.py:1852-1884): expert
    parallelism, the alltoall or flex dispatcher, no full recompute, a virtual pipeline under pipelining, 16-bit."""
    if not setup.overlap_moe_comm:
        return None
    why = None
    if setup.ep <= 1:
        why = "it overlaps the expert-parallel all-to-all: it needs --ep > 1"
    elif setup.moe_dispatcher == "allgather":
        why = ("Megatron runs it with the alltoall or flex dispatcher, not allgather: use --moe-dispatcher alltoall, deepep "
               "or hybridep")
    elif setup.recompute_policy in ("full", "uniform", "block"):
        why = "Megatron refuses it with full recomputation: use --recompute none or selective"
    elif setup.pp > 1 and setup.vpp == 1:
        why = "under pipelining Megatron needs a virtual pipeline with it: add --vpp > 1"
    elif setup.precision not in ("bf16-master", "fp16-master"):
        why = "Megatron runs it on a bf16 or fp16 model only: use --precision bf16-master or fp16-master"
    return f"--overlap-moe-comm: {why} (transformer_config.py:1852-1884)" if why else None


def moe_overlap_mtp(setup, mtp: int) -> str | None:
    """overlap_moe_expert_parallel_comm beside multi-token prediction (megatron-core 0.16.1 transformer_config.py:
    1889-1896): one MTP layer at most, and with one a pipeline. `mtp`: the MTP layers trained (analytic/mtp.py
    mtp_layers: --mtp-layers, else the model's), which the setup alone does not know."""
    if not setup.overlap_moe_comm or not mtp:
        return None
    if mtp > 1:
        why = f"Megatron runs it beside one multi-token-prediction layer at most, not {mtp}: use --mtp-layers 1 or 0"
    elif setup.pp == 1:
        why = ("Megatron runs it beside a multi-token-prediction layer only under pipelining: add --pp > 1 (with "
               "--vpp), or --mtp-layers 0")
    else:
        return None
    return f"--overlap-moe-comm: {why} (transformer_config.py:1889-1896)"


def _low_precision(setup) -> str | None:
    """Transformer Engine's recipes under Megatron (megatron-core 0.16.1 transformer_config.py:988-1017): CUDA only
    (TE's kernels; its wheel builds against CUDA), no bf16 first/last layers with delayed scaling (:990-991), at most
    num_layers / pp of each (:999-1017)."""
    lp = getattr(setup, "low_precision", "none")
    if lp == "none":
        return None
    if setup.device != "cuda":
        return (f"--low-precision {lp} runs Transformer Engine's CUDA kernels, which do not run on --device "
                f"{setup.device}: use --device cuda")
    if lp == "delayed" and (setup.bf16_first_layers or setup.bf16_last_layers):
        return ("Megatron refuses --bf16-first-layers / --bf16-last-layers with delayed scaling "
                "(transformer_config.py:990-991): use --low-precision tensorwise, blockwise, mxfp8 or nvfp4")
    return None
