"""LoRA's trainable parameters against a hand count from the model's dimensions, the model states of a LoRA step
from first principles, and bad LoRA inputs refused in one line with exit 2."""
from __future__ import annotations

import pytest

from trainfit.analytic.engine import estimate
from trainfit.cli import main
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def test_llama_3_1_8b_rank_16_all_linear_trainable_params():
    # Llama-3.1-8B (config.json): hidden 4096, intermediate 14336, 32 heads of 128, 8 KV heads, 32 layers.
    # LoRA on a Linear(in, out): A is r×in, B is out×r (Hu et al. 2021 §4.1) -> r·(in + out).
    h, i, q, kv, layers, r = 4096, 14336, 32 * 128, 8 * 128, 32, 16
    per_layer = r * ((h + q) + (h + kv) + (h + kv) + (q + h)  # q_proj, k_proj, v_proj, o_proj
                     + (h + i) + (h + i) + (i + h))  # gate_proj, up_proj, down_proj
    assert per_layer == 16 * (8192 + 5120 + 5120 + 8192 + 18432 + 18432 + 18432) == 1_310_720
    assert layers * per_layer == 41_943_040
    est = estimate(load_model("llama-3.1-8b"), Setup(lora_rank=16))
    assert est.detail.params_trainable == 41_943_040


def test_lora_model_states_from_first_principles():
    spec = load_model("llama-3.1-8b")
    r = 16
    # attention-only: q, k, v, o per layer
    n = spec.layers * r * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096))
    est = estimate(spec, Setup(lora_rank=r, lora_targets="attention", precision="bf16", optimizer="adamw"))
    m = est.memory
    base = est.params - n
    assert m.weights == 2 * base + 4 * n  # frozen bf16 base + fp32 adapters (peft autocast_adapter_dtype)
    assert m.gradients == 4 * n and m.optimizer_states == 8 * n and m.master_weights == 0


@pytest.mark.parametrize("argv,needle", [
    ("estimate llama-3.1-8b --lora-rank -1", "--lora-rank must be at least 0"),
    ("estimate llama-3.1-8b --lora-rank 8 --lora-targets q_proj,qq_proj", "q_proj, k_proj, v_proj, o_proj"),
    ("estimate llama-3.1-8b --lora-targets attention", "needs --lora-rank"),
    ("estimate llama-3.1-8b --dora", "needs --lora-rank"),
    ("estimate llama-3.1-8b --lora-rank 8 --stack torchtitan", "use --stack hf"),
    ("estimate llama-3.1-8b --lora-rank 8 --mode infer", "applies to train/rl only"),
])
def test_bad_lora_inputs_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv.split())
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and needle in err, err
