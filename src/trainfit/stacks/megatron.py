"""Megatron-Core's rules that are code, not facts (stacks/megatron.toml holds the facts). `setup` is read by
attribute: this layer does not import trainfit.setup."""
from __future__ import annotations


def refuse(setup) -> str | None:
    """Megatron's expert layout: the expert-parallel × expert-tensor-parallel group tiles the dp × cp × tp ranks of a
    pipeline stage (megatron-core 0.16.1 parallel_state.py:788-794: world_size divisible by etp × ep × pp), else
    None."""
    if (setup.ep > 1 or setup.etp is not None) and (setup.dp * setup.cp * setup.tp) % (setup.ep * setup.expert_tp):
        return (f"--ep {setup.ep} × --etp {setup.expert_tp} must divide the dp × cp × tp = "
                f"{setup.dp * setup.cp * setup.tp} ranks of a pipeline stage (Megatron's expert layout)")
    return None
