"""torchtitan's rules that are code, not facts (stacks/torchtitan.toml holds the facts): its expert-parallel layout.
`setup` is read by attribute: this layer does not import trainfit.setup."""
from __future__ import annotations


def refuse(setup) -> str | None:
    """torchtitan's expert layout (torchtitan 0.2.2 distributed/parallel_dims.py): --etp is 1 or --tp (:58-59), has
    no effect without --ep (config/job_config.py:466), and the ep × etp ranks tile the dp_shard × cp × tp ranks of a
    stage (:138, efsdp = dp_shard·cp·tp // (etp·ep) must be whole); trainfit models EP under FSDP (the experts'
    own efsdp group, stacks/torchtitan.toml [expert_parallel]). Context parallelism: refuse_cp. Else None."""
    why = refuse_cp(setup) or _async_tp(setup) or _dispatcher(setup)
    if why:
        return why
    if setup.ep == 1:
        if setup.etp not in (None, 1):
            return (f"--etp {setup.etp}: torchtitan's expert_tensor_parallel_degree has no effect without expert "
                    "parallelism (config/job_config.py:466); add --ep N or drop --etp")
        return None
    etp = setup.expert_tp
    if etp not in (1, setup.tp):
        return (f"--etp {etp}: torchtitan runs expert tensor parallelism of 1 or --tp ({setup.tp}) only "
                f"(distributed/parallel_dims.py:58-59); use --etp 1 or --etp {setup.tp}")
    if setup.dp > 1 and setup.zero < 2:
        return (f"--ep {setup.ep} with --zero {setup.zero}: torchtitan shards the experts with FSDP over their own "
                "efsdp group whenever ep > 1 (models/deepseek_v3/infra/parallelize.py:162-188); use --zero 3 "
                "(or 2), as trainfit models it")
    shard = setup.dp if setup.zero >= 2 else 1
    ranks = shard * setup.cp * setup.tp
    if ranks % (setup.ep * etp):
        return (f"--ep {setup.ep} × --etp {etp} must divide the dp_shard × tp = {ranks} ranks of a pipeline stage "
                "(torchtitan distributed/parallel_dims.py:138: efsdp = dp_shard·cp·tp // (etp·ep))")
    return None


def _dispatcher(setup) -> str | None:
    """--moe-dispatcher is parallelism.expert_parallel_comm_backend: "standard" (the all-to-all) or "deepep" (0.2.2
    config/job_config.py:474); DeepEP without expert tensor parallelism (models/deepseek_v3/infra/parallelize.py:
    107-111 raises) and, as trainfit models it, at --tp 1 (stacks/torchtitan.toml [expert_dispatch.deepep]: its MoE
    keeps every TP rank's tokens whole)."""
    how = getattr(setup, "moe_dispatcher", None)
    if how in (None, "alltoall"):
        return None
    runs = setup.stack_facts.fact("moe", "dispatchers")
    if how not in runs:
        return (f"--moe-dispatcher {how}: torchtitan's expert_parallel_comm_backend is standard (an all-to-all) or "
                f"deepep (config/job_config.py:474); use --moe-dispatcher {' or '.join(runs)}, or --stack megatron")
    if setup.tp > 1:
        return (f"--moe-dispatcher deepep with --tp {setup.tp}: torchtitan's DeepEPMoE drops the reorderer that splits "
                "a block's tokens over the TP ranks (models/moe/moe_deepep.py:37), so every TP rank would dispatch "
                "all of them; trainfit models torchtitan's DeepEP at --tp 1: drop --tp, or use --moe-dispatcher "
                "alltoall")
    return None


def _async_tp(setup) -> str | None:
    """--tp-comm-overlap is async TP, which torchtitan runs only with the model compiled (0.2.2
    distributed/tensor_parallel.py:20-23 raises otherwise) and torch's symmetric-memory CUDA kernels."""
    if not getattr(setup, "tp_comm_overlap", False):
        return None
    if not setup.compile:
        return ("--tp-comm-overlap is torchtitan's async TP, which needs the model compiled "
                "(distributed/tensor_parallel.py:20-23): add --compile")
    if setup.device != "cuda":
        return f"--tp-comm-overlap runs torch's symmetric-memory CUDA kernels, not on --device {setup.device}"
    return None


def refuse_cp(setup) -> str | None:
    """torchtitan's context parallelism (stacks/torchtitan.toml [context_parallel]): FSDP over dp_shard × cp is
    applied whenever cp > 1 (distributed/parallel_dims.py:333-335 fsdp_enabled), so a cp layout is an FSDP one; the
    ring runs the flash, memory-efficient and cuDNN SDPA kernels only (torch 2.13 distributed/tensor/experimental/
    _context_parallel/_attention.py:916-938), and torchtitan's SDPA backends (cuDNN, flash, math) leave fp32 to the
    math kernel; seq_len must divide by tp × 2 × cp (parallel_dims.py:365-372, models/llama3/infra/
    parallelize.py:69-74). Else None."""
    if setup.cp == 1:
        return None
    if setup.zero < 2:
        return (f"--cp {setup.cp} with --zero {setup.zero}: torchtitan applies FSDP over dp_shard × cp whenever "
                "context parallelism is on (distributed/parallel_dims.py:333-335); use --zero 3 (or 2)")
    if setup.precision == "fp32":
        return (f"--cp {setup.cp} with --precision fp32: torch's ring attention runs the flash, memory-efficient and "
                "cuDNN SDPA kernels only (torch distributed/tensor/experimental/_context_parallel/_attention.py:"
                "935-938), and fp32 takes torchtitan's math kernel; use --precision amp-bf16 or bf16")
    if setup.seq % (2 * setup.cp * setup.tp):
        return (f"--seq {setup.seq}: torchtitan needs seq_len divisible by tp × 2 × cp = {2 * setup.cp * setup.tp} "
                "(distributed/parallel_dims.py:365-372 seq_len_divisor)")
    return None
