"""Module.to on fake tensors (the trace engine), where a stack's own code moves or casts modules as it builds them:
peft's adapters (step/lora.py), gpt_oss's per-block bf16 cast on torchtitan (models/gpt_oss/model/model.py:339-342).

torch's Module._apply swaps every FakeTensor parameter for its converted copy with torch.utils.swap_tensors (torch
2.13 nn/modules/module.py:966-990, `isinstance(param, FakeTensor)`, an unchanged one too), which fails on fake tensors
("Cannot swap t1 because it has weakref associated with it", even for a plain nn.Linear).
"""
from __future__ import annotations

import contextlib
import itertools

import torch
from torch._subclasses.fake_tensor import is_fake


@contextlib.contextmanager
def fake_safe_module_moves():
    """While active, Module.to on a module holding fake tensors makes the same move by reassigning each parameter
    that changes and each buffer (as peft's own cast_adapter_dtype does, tuners_utils.py:2745-2760): the resulting
    devices and dtypes are those of Module.to (floating-point tensors take the dtype). A module of real tensors takes
    torch's path unchanged."""
    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        if not any(is_fake(t) for t in itertools.chain(self.parameters(), self.buffers())):
            return original(self, *args, **kwargs)
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        for owner in self.modules():
            for name, p in list(owner.named_parameters(recurse=False)):
                want = p.to(device=device, dtype=dtype if dtype is not None and p.is_floating_point() else None)
                if want is not p:
                    setattr(owner, name, torch.nn.Parameter(want.detach(), p.requires_grad))
            for name, b in list(owner.named_buffers(recurse=False)):
                if b is not None:
                    owner._buffers[name] = b.to(device=device, dtype=dtype if dtype is not None and
                                                b.is_floating_point() else None)
        return self

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original
