"""--optimizer-in-backward: each parameter stepped the moment its gradient is ready, that gradient freed at once.

As torchtune does it (torchtune/training/memory.py create_optim_in_bwd_wrapper / register_optim_in_bwd_hooks, used
by full_finetune_single_device.py when optimizer_in_bwd=True): one optimizer per parameter, and a
`register_post_accumulate_grad_hook` on the parameter that calls that optimizer's step() then zero_grad() — so at
any moment of the backward at most the gradient being applied exists, never all of them. The wrapper below is
what the standard step sees: step() and zero_grad() after the backward find no gradient left, and `state`
gathers the per-parameter optimizers' states so the engines count them as resident.
"""
from __future__ import annotations

from typing import Callable

import torch


class InBackwardOptimizer:
    def __init__(self, params: list, make: Callable[[torch.nn.Parameter], torch.optim.Optimizer]):
        self.optimizers = {p: make(p) for p in params}

        def step_now(p: torch.nn.Parameter) -> None:
            opt = self.optimizers[p]
            opt.step()
            opt.zero_grad(set_to_none=True)

        self.handles = [p.register_post_accumulate_grad_hook(step_now) for p in params]

    @property
    def state(self) -> dict:
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    @property
    def param_groups(self) -> list:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def step(self, closure=None) -> None:
        """Apply gradients that did not come through a backward (a warm-up's zeros); after a backward there are
        none left: the hooks applied and freed each one."""
        for p, opt in self.optimizers.items():
            if p.grad is not None:
                opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)
