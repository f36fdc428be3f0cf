"""DeepSpeed's rules that are code, not facts (stacks/deepspeed.toml holds the facts): its AutoEP layout (--ep).
`setup` is read by attribute: this layer does not import trainfit.setup."""
from __future__ import annotations


def refuse(setup) -> str | None:
    """AutoEP (deepspeed 0.19.8, stacks/deepspeed.toml [expert_parallel]; --etp is not an axis of the stack: AutoEP
    raises for expert_tensor_parallel_size != 1, module_inject/auto_ep_folding.py:214-216): autoep_size must
    divide the data-parallel ranks (:111-115: the edp = world / ep groups). The rest of what trainfit models of it:
    without ZeRO-Offload, LoRA or Ulysses sequence parallelism. Else None."""
    if setup.ep <= 1:
        return None
    if setup.dp % setup.ep:
        return (f"--ep {setup.ep} must divide --dp {setup.dp}: AutoEP's expert-data-parallel groups are dp / ep ranks "
                "(module_inject/auto_ep_folding.py:111-115)")
    if setup.offload_state != "none":
        return ("--offload with --ep: DeepSpeed's ZeRO-Offload of AutoEP's expert partitions is not modelled; drop "
                "--offload, or --ep (ZeRO then shards the experts over --dp like any weight)")
    if getattr(setup, "lora_rank", 0):
        return "--lora with --ep: AutoEP under a LoRA adapter is not modelled on --stack deepspeed; drop --ep"
    if getattr(setup, "ulysses", 1) > 1:
        return ("--ulysses with --ep: AutoEP's sequence-parallel folding is not modelled on --stack deepspeed; "
                "drop --ep or --ulysses")
    return None
