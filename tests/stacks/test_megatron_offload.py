"""--offload-layers (Megatron's activation CPU offloading through Transformer Engine's offload handler) against hand
derivations from the code (megatron-core 0.16.1, TransformerEngine v2.9 transformer_engine/pytorch/cpu_offload.py)
and Korthikanti et al. 2022's per-layer count; Megatron's own refusals (TransformerConfig's checks are exercised in
tests/plan/test_emit_megatron.py)."""
from __future__ import annotations

import pytest

from trainfit.analytic.megatron_offload import exposed_seconds, groups_on_device, window_map
from trainfit.analytic.layout import validate_layout
from trainfit.analytic.memory import train_memory
from trainfit.errors import SetupError
from trainfit.models.hf_config import spec_from_config
from trainfit.setup import Setup, validate

H, HEADS, LAYERS, SEQ = 256, 4, 8, 512


def gpt():
    """A GPT-2-style model with dropout: Korthikanti's layer, whose saved set TE marks for offload except the
    bias-dropout-add masks."""
    return spec_from_config({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": H, "n_head": HEADS, "n_layer": LAYERS,
        "vocab_size": 1000, "n_positions": SEQ, "n_inner": 4 * H, "activation_function": "gelu",
        "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1, "tie_word_embeddings": True}, "gpt")


def mg(**kw) -> Setup:
    return Setup(stack="megatron", precision="bf16-master", batch=1, seq=SEQ, attention="flash", **kw)


def test_window_map_by_hand():
    """cpu_offload.py:343-350 by hand. 80 layers, 40 offloaded: 80 // 40 = 2, no remainder, window[i] = 2(i+1) - 1.
    10 layers, 4 offloaded: 10 // 4 = 2, remainder 2: i=0: 1 + 1 = 2 (constant 1); i=1: 3 + 2 = 5 (constant 2);
    i=2: 5 + 2 = 7; i=3: 7 + 2 = 9. The last group is always waited for at the last layer's commit."""
    assert window_map(80, 40) == tuple(2 * i + 1 for i in range(40))
    assert window_map(10, 4) == (2, 5, 7, 9)
    assert window_map(80, 79)[-1] == 79


def test_layers_on_device_by_hand():
    """80 layers, 40 offloaded. Forward at layer 40: groups 0..19 were released at the commits of layers 1..39
    (window 2g+1 < 40), so of the 41 layers made 21 are on the device: the kept layer 40 and groups 20..39. At the
    last layer (79): only group 39 (released at layer 79's own commit) beside the 40 kept layers: 41 = L - N + 1.
    Backward at layer 79: group 39 is reloaded at layer 79's commit backward (:641-648), beside the 40 kept ones."""
    n, layers = 40, 80
    assert groups_on_device(layers, n, 40) == 20
    assert groups_on_device(layers, n, 79) == 1
    on_device = [max(0, j - n + 1) + groups_on_device(layers, n, j) for j in range(layers)]
    assert max(on_device) == on_device[79] == 41
    assert on_device[0] == 1  # layer 0's own tensors, being made / just reloaded


@pytest.mark.parametrize("layers", [2, 3, 7, 10, 61, 80, 126])
def test_groups_on_device_counted_as_the_definition_walks(layers):
    """groups_on_device counts the groups g <= j with window[g] >= j (TE's layer_window_map, cpu_offload.py:341-350)
    by bisection: the same count as the definition's walk over every group, for every layer and offload depth."""
    for n in range(1, layers):
        window = window_map(layers, n)
        for j in range(layers):
            assert groups_on_device(layers, n, j) == sum(1 for g, w in enumerate(window) if g <= j <= w), (n, j)


def test_offloaded_and_kept_bytes_by_hand():
    """Korthikanti's layer without the attention scores (flash): 34·h bytes per token in 16-bit with dropout = norm
    inputs 4h, linear inputs (ln_out) 4h, q k v 6h, attention output 2h, fc1 output 8h, GeLU output 8h (all marked
    by TE: offloaded) and the two 1-byte dropout masks 2h (torch dropout in bias-dropout-add: kept); plus fp32
    statistics TE marks too: LayerNorm mu + rsigma of two norms (16 B) and the softmax lse (4 B x 4 heads).
    Offloading 3 of 8 layers at 512 tokens leaves 5 whole layers and 3 layers' masks; each offloaded layer copies its
    marked bytes and the attention output once more (saved by the attention and by linear_proj, two pack-hook calls)."""
    tokens = SEQ
    whole = (34 * H + 16 + 16) * tokens
    kept = 2 * H * tokens
    copied = (whole - kept) + 2 * H * tokens
    base = train_memory(gpt(), mg())
    m = train_memory(gpt(), mg(offload_layers=3))
    assert base.detail["activation_per_layer"] == whole
    assert m.detail["activation_per_layer"] == int((5 * whole + 3 * kept) / LAYERS)
    assert m.detail["offloaded_copied_per_layer"] == copied
    assert m.host_memory == 3 * copied and base.host_memory is None
    assert base.activations - m.activations == pytest.approx(3 * (whole - kept), abs=8)
    # the peak: the last layer's backward, where group 2 (window 7: released at layer 7's commit, reloaded at its
    # commit backward) is on the device beside that layer's backward temporaries (megatron_memory.py: the two
    # residual gradients 2·2h and fc1's output gradient 2·4h per token, tp 1, no SP)
    assert m.peak_phase == "backward"
    assert m.at_peak["temporaries"] == (2 * 2 * H + 2 * 4 * H) * tokens + (whole - kept)


def test_exposed_copies_by_hand():
    """4 layers, 2 offloaded: windows (1, 3). Group 0's copy starts at layer 0's commit and is waited for at layer
    1's: one layer's compute beside it; group 1's from layer 1's commit to layer 3's: two. Each way, copy 3 s,
    forward 1 s and backward 2 s a layer: group 0 exposes (3 - 1) + (3 - 2), group 1 (3 - 2) + 0 = 4 s."""
    assert exposed_seconds(4, 2, 3.0, 1.0, 2.0) == pytest.approx(4.0)
    assert exposed_seconds(4, 2, 0.5, 1.0, 2.0) == 0.0
    assert exposed_seconds(4, 0, 3.0, 1.0, 2.0) == 0.0


@pytest.mark.parametrize("kw,match", [
    (dict(offload_layers=8, pp=2), "pipeline"),
    (dict(offload_layers=2, recompute="selective"), "recomputation"),
    (dict(offload_layers=2, cuda_graph_scope="attn"), "CUDA graphs"),
])
def test_megatron_refusals(kw, match):
    """transformer_config.py:1144-1152 and :1722-1723, as Setup's rules say them."""
    with pytest.raises(SetupError, match=match):
        validate(mg(**kw))


def test_refused_beyond_the_models_layers_and_on_other_stacks(cli):
    with pytest.raises(SetupError, match="fewer layers"):  # the engines' entry (analytic/layout.py)
        validate_layout(gpt(), mg(offload_layers=LAYERS))
    code, _, err = cli("estimate", "llama-3.2-1b", "--stack", "hf", "--offload-layers", "4")
    assert code == 2 and "--offload-layers" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("estimate", "llama-3.2-1b", "--stack", "megatron", "--cpu-offloading-num-layers", "16")
    assert code == 2 and "fewer layers" in err and len(err.strip().splitlines()) == 1


def test_a_deeper_stage_than_the_bound_is_refused_in_one_line(cli, tmp_path):
    """Each offloading layer holds its own count of groups (groups_on_device rises and falls with the layer), so its
    layers are laid out one by one: a config of 10**9 layers once ran for hours; past megatron_offload.MAX_LAYERS it
    is refused in one line, at once, and at the bound it is answered (no other rule refuses it)."""
    import json
    import time

    from importlib import resources

    from trainfit.analytic.megatron_offload import MAX_LAYERS

    config = json.loads((resources.files("trainfit.models.catalog") / "llama-3.2-1b.json").read_text())
    for layers, refused in ((10**9, True), (MAX_LAYERS, False)):
        path = tmp_path / f"deep{layers}.json"
        path.write_text(json.dumps({**config, "num_hidden_layers": layers}))
        t0 = time.perf_counter()
        code, out, err = cli("estimate", str(path), "--stack", "megatron", "--offload-layers", "16")
        assert (code == 2) == refused, err
        if refused:
            assert "--offload-layers" in err and f"{MAX_LAYERS:,} layers" in err and len(err.strip().splitlines()) == 1
            assert time.perf_counter() - t0 < 30
