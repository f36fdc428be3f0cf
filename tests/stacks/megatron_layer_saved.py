"""Run as a script: the bytes one megatron-core 0.16.1 local-spec TransformerLayer (GPT: LayerNorm, GeLU, eager
attention, fp32, dropouts 0) saves for backward in its forward on CPU, under each recompute-modules list given on
the command line ('' = no recompute). Prints {modules: bytes} as JSON. Counted: every storage autograd saves
(saved_tensors_hooks), once, with its bytes at the end of the forward (CheckpointWithoutOutput has freed the
outputs it discards by then: tensor_parallel/random.py:700-709), less the layer's parameters."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import types

import torch
import torch.distributed as dist

HIDDEN, HEADS, FFN, SEQ, BATCH = 256, 4, 1024, 128, 2


def _cpu() -> None:
    """megatron-core on a CPU-only torch: the CUDA RNG state the checkpoints keep is the CPU generator's, and
    CheckpointWithoutOutput() reads its fp8=False default as "fp8 is not None" (random.py:636), asking Transformer
    Engine (not installed) for its fp8 state: off, no recompute contexts."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench.targets.megatron_cpu import _patch_cpu
    from megatron.core.tensor_parallel import random as r

    _patch_cpu()
    r._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    r._set_cuda_rng_state = lambda *a, **k: None
    r.FP8GlobalStateManager = types.SimpleNamespace(is_fp8_enabled=lambda: False, get_fp8_recipe=lambda: None)
    r.activation_recompute_forward = lambda **k: contextlib.nullcontext()
    r.fp8_autocast = lambda **k: contextlib.nullcontext()


def saved(modules: str) -> int:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module

    kw = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
              use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32)
    if modules:
        kw.update(recompute_granularity="selective", recompute_modules=modules.split(","))
    layer = build_module(get_gpt_layer_local_spec(), config=TransformerConfig(**kw), layer_number=1)
    x = torch.randn(SEQ, BATCH, HIDDEN, requires_grad=True)
    kept: list = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        layer(x, attention_mask=None)
    seen = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    total = 0
    for t in kept:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def main(argv: list[str]) -> None:
    _cpu()
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    print(json.dumps({m: saved(m) for m in argv}))


if __name__ == "__main__":
    main(sys.argv[1:])
