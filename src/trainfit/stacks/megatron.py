"""Megatron-Core's rules that are code, not facts (stacks/megatron.toml holds the facts). `setup` is read by
attribute: this layer does not import trainfit.setup."""
from __future__ import annotations


def refuse(setup) -> str | None:
    """Megatron's expert layout: the expert-parallel × expert-tensor-parallel group tiles the dp × cp × tp ranks of a
    pipeline stage (megatron-core 0.16.1 parallel_state.py:788-794: world_size divisible by etp × ep × pp); and its
    low-precision checks (_low_precision). Else None."""
    if (setup.ep > 1 or setup.etp is not None) and (setup.dp * setup.cp * setup.tp) % (setup.ep * setup.expert_tp):
        return (f"--ep {setup.ep} × --etp {setup.expert_tp} must divide the dp × cp × tp = "
                f"{setup.dp * setup.cp * setup.tp} ranks of a pipeline stage (Megatron's expert layout)")
    return _low_precision(setup)


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
