"""Which module is running: a stack kept by global forward pre/post hooks.

Why global hooks (torch.nn.modules.module.register_module_forward_*_hook) and not a stack walk per
allocation: a hook push/pop per module call is a few microseconds, a Python stack walk per op would
cost more than the op itself under fake tensors. Checkpointed modules re-run their forward during
backward, so a non-empty stack in the backward phase means "recomputation" (flops.py uses this).
Backward: a hook on each module output's gradient (registered in the post hook) fires when that
module's backward starts, and names it `current` until the next one fires (NB: the glue between two
modules' backward, e.g. a residual add, is attributed to the module whose backward ran last).
"""
from __future__ import annotations

import torch
from torch.nn.modules import module as nn_module


class ModuleStack:
    def __init__(self, model: torch.nn.Module, on_mark=None):
        self.names = {id(m): name or type(m).__name__ for name, m in model.named_modules()}
        self.stack: list[str] = []
        self.current = ""
        self.on_mark = on_mark  # called with ("pre"|"post", name): structural marks for extrapolation
        self.on_backward = None  # called with a module's name when its backward starts (depth_records.py)
        self._handles = []

    def _pre(self, module, args):
        name = self.names.get(id(module))
        if name is not None:
            self.stack.append(name)
            self.current = name
            if self.on_mark is not None:
                self.on_mark(("pre", name))

    def _post(self, module, args, output):
        name = self.names.get(id(module))
        if name is not None and self.stack:
            self.stack.pop()
            self.current = self.stack[-1] if self.stack else ""
            if self.on_mark is not None:
                self.on_mark(("post", name))
            if torch.is_grad_enabled():
                outs = (output.values() if isinstance(output, dict)  # HF ModelOutput is a dict
                        else output if isinstance(output, (tuple, list)) else (output,))
                for o in outs:
                    if isinstance(o, torch.Tensor) and o.requires_grad:
                        o.register_hook(self._backward_hook(name))

    def _backward_hook(self, name):
        def entered_backward(grad):
            if not self.stack:  # not during a checkpoint's recomputation (a forward)
                self.current = name
                if self.on_backward is not None:
                    self.on_backward(name)

        return entered_backward

    def __enter__(self):
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack.clear()
        self.current = ""
