"""torchao's low-bit AdamW (--optimizer adamw-torchao-8bit | -4bit | -fp8) as the HF Trainer builds it.

transformers 5.24 trainer_optimizer.py:450-476 (_get_torchao_optimizer): torchao.optim.AdamW8bit or AdamW4bit with
block_size = optim_args' "block_size" (default 256, the stack's [optimizers] torchao_block_size); AdamWFp8 is the
same class family (torchao 0.18.0 optim/adam.py:375-403). The step torch.compiles one single-parameter update per
parameter (adam.py:142): it runs for real on a CPU (inductor's C++ kernels; the first step compiles, seconds per
distinct shape) but not on fake tensors (the trace engine refuses it: engines.check_stack). What the states and the
step hold: analytic/torchao_optim.py.
"""
from __future__ import annotations

import torch

from ..errors import EngineUnavailableError

CLASSES = {"adamw-torchao-8bit": "AdamW8bit", "adamw-torchao-4bit": "AdamW4bit", "adamw-torchao-fp8": "AdamWFp8"}


def torchao_optimizer(params: list, name: str, lr: float, block_size: int) -> torch.optim.Optimizer:
    try:
        import torchao.optim as ao
    except ImportError as e:
        raise EngineUnavailableError(f"--optimizer {name} runs torchao's optimizer: pip install torchao, or use "
                                     "--engine analytic") from e
    return getattr(ao, CLASSES[name])(params, lr=lr, block_size=block_size)
