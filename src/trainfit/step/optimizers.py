"""bitsandbytes' optimizers as the HF Trainer builds them (--optimizer adamw-8bit, paged-adamw-8bit, paged-adamw, lion).

transformers 5.23 trainer_optimizer.py:246-292 (_get_bitsandbytes_optimizer): bnb.optim.AdamW or Lion with
optim_bits 8 for the "8bit" names (else 32) and is_paged for the "paged" names. What that means for memory
(bitsandbytes 0.50 optim/optimizer.py):
- 8-bit: each parameter's two states are uint8 tensors of its shape plus one fp32 absmax per 256-element block
  each (init_state, :492-529: blocksize = 256); the two 256-entry quantisation maps are shared by all parameters
  (name2qmap); a parameter with fewer than min_8bit_size = 4096 elements keeps fp32 states (:502-503);
- 32-bit (paged-adamw, lion): fp32 states whatever the parameter's dtype (get_state_buffer(p, dtype=float32));
- paged: states of parameters with >= 1e5 elements are allocated in CUDA unified memory (get_state_buffer,
  :383-389, functional.get_paged -> cudaMallocManaged), outside torch's caching allocator; on a CPU the optimizer
  warns and falls back to ordinary tensors (:376-381), which is what our CPU steps run.
The update is bnb's own in-place kernel (optimizer_update_8bit_blockwise / optimizer_update_32bit): no
temporaries on CUDA.
"""
from __future__ import annotations

import warnings

import torch

from ..errors import EngineUnavailableError

# --optimizer -> (bitsandbytes class, optim_bits, is_paged)
BNB = {"adamw-8bit": ("AdamW", 8, False), "paged-adamw-8bit": ("AdamW", 8, True), "paged-adamw": ("AdamW", 32, True),
       "lion": ("Lion", 32, False)}


def bnb_optimizer(params: list, name: str, lr: float) -> torch.optim.Optimizer:
    try:
        import bitsandbytes.optim as bo
    except ImportError as e:
        raise EngineUnavailableError(f"--optimizer {name} runs bitsandbytes' optimizer: pip install "
                                     "'trainfit[bnb]', or use --engine analytic") from e
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    cls, bits, paged = BNB[name]
    # the constructor computes the shared 8-bit quantisation maps from Python lists (functional.create_dynamic_map,
    # .tolist()): constants, built as real tensors even inside the trace engine's fake mode
    with warnings.catch_warnings(), unset_fake_temporarily():  # "Paged optimizers are not supported on CPU": the fallback is documented above
        warnings.filterwarnings("ignore", message=".*[Pp]aged.*")
        return getattr(bo, cls)(params, lr=lr, optim_bits=bits, is_paged=paged)
