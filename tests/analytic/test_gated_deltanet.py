"""The Gated DeltaNet layer's saved set (analytic/gated_deltanet.py) against a real CPU step of transformers'
Qwen3NextGatedDeltaNet: every tensor autograd packs (torch.autograd.graph.saved_tensors_hooks), by storage, less the
layer's input and parameters. Key and value heads of different widths, so that a term priced at the wrong width
shows."""
from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.analytic.gated_deltanet import saved_per_token, state_per_sequence  # noqa: E402
from trainfit.models.hf_config import spec_from_config  # noqa: E402
from trainfit.setup import Setup  # noqa: E402

CONFIG = {"model_type": "qwen3_next", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "full_attention_interval": 2,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128, "vocab_size": 1000,
          "max_position_embeddings": 512}


def _saved_by_a_real_step(batch: int, seq: int, dtype) -> int:
    """The bytes of the tensors autograd packed in the layer's forward that are still held when it returns (a graph
    the output does not reach is freed with what it saved)."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = Qwen3NextConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    layer = Qwen3NextGatedDeltaNet(cfg, 0).to(dtype)
    x = torch.randn(batch, seq, CONFIG["hidden_size"], dtype=dtype, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()} | {x.untyped_storage().data_ptr()}
    packed = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            packed.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (r() for r in packed)
            if t is not None}
    del y
    return sum(held.values())


def test_saved_set_matches_a_real_cpu_step():
    """bf16 (the chunked rule in fp32 on copies): exact but for the (chunk, chunk) boolean mask, two (value_heads,)
    fp32 tensors and the (batch, value_heads, chunks) chunk decays (4,192 B, not priced)."""
    spec = spec_from_config(CONFIG, "gdn-test")
    batch, seq = 2, 128
    setup = Setup(batch=batch, seq=seq, precision="bf16")
    real = _saved_by_a_real_step(batch, seq, torch.bfloat16)
    assert real - saved_per_token(spec, setup) * batch * seq == 64 * 64 + 2 * 4 * 4 + 2 * 4 * 2 * 4


def test_linear_layer_state_by_hand():
    """Per sequence: the conv state (conv_dim = 2·2·16 + 4·32 = 192 channels × 4 taps, bf16) and the fp32 recurrent
    state (4 value heads × 16 × 32)."""
    spec = spec_from_config(CONFIG, "gdn-test")
    assert state_per_sequence(spec, 2) == 192 * 4 * 2 + 4 * 4 * 16 * 32


def test_saved_set_under_autocast_matches_a_real_cpu_step():
    """amp-bf16: the rule's matmuls save bf16 casts. The real step's count holds besides the priced set the weight
    casts (in_proj_qkvz 320 x 128, out_proj 128 x 128, in_proj_ba 8 x 128, the conv's 192 x 4: the layer's `fixed`
    term) and one bf16 cast of the input, which the two in_proj calls share here (a leaf requiring grad: autocast
    caches it; the layer's linear-input term prices a model's non-leaf input per call), and the unpriced mask and
    decays of the bf16 case."""
    spec = spec_from_config(CONFIG, "gdn-test")
    batch, seq = 2, 128
    setup = Setup(batch=batch, seq=seq, precision="amp-bf16")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = _saved_by_a_real_step(batch, seq, torch.float32)
    weight_casts = 2 * (320 * 128 + 128 * 128 + 8 * 128 + 192 * 4)
    unpriced = 64 * 64 + 2 * 4 * 4 + 2 * 4 * 2 * 4
    assert real - saved_per_token(spec, setup) * batch * seq == weight_casts + 2 * batch * seq * 128 + unpriced


def test_op_list_matmul_flops_against_torchs_flop_counter():
    """One Gated DeltaNet layer's op list (analytic/ops/gated_deltanet.py) multiplies through what a real layer's
    forward dispatches (torch's FlopCounterMode, the trace's counter: mm and bmm); flops.py (gated_deltanet.
    linear_params, rule_flops_per_token) counts these and the rule's two unitriangular solves, which the op list
    lists by their bytes (a batched trsm) and torch's counter has no formula for: by hand, 64^2 / 2 multiply-adds per
    right-hand column of a chunk's system, key_head_dim + value_head_dim = 16 + 32 columns, 2 FLOPs each, per value
    head (4), chunk (2) and sequence (2). torch also counts the depthwise conv (2 x 4 taps per channel and padded
    position: 2 x 2 x (2 x 32 + 4 x 32) x (128 + 3) x 4), which neither lists as a matmul."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from trainfit.analytic.gated_deltanet import linear_params, rule_flops_per_token
    from trainfit.analytic.ops import Shape, layer_forward

    layer = Qwen3NextGatedDeltaNet(Qwen3NextConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"}), 0)
    with FlopCounterMode(display=False) as counter:
        layer(torch.randn(2, 128, CONFIG["hidden_size"]))
    real = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    spec = spec_from_config(CONFIG, "gdn-test")
    ops = layer_forward(spec, Shape(batch=2, seq=128), moe=True, linear=True)
    mixer = sum(o.flops for o in ops if o.kind == "gemm" and o.name.startswith(("in_proj", "out_proj", "rule.")))
    assert mixer == real["aten.mm"] + real["aten.bmm"]
    assert real["aten.convolution"] == 2 * 2 * (2 * 32 + 4 * 32) * (128 + 3) * 4
    solves = (64 * 64 / 2) * (16 + 32) * 2 * 4 * 2 * 2
    assert 2 * 128 * (2 * linear_params(spec) + rule_flops_per_token(spec, 128)) == mixer + solves
