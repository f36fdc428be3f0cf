"""A 4-bit frozen base (--quant, QLoRA) in the analytic engine: its bytes per parameter against the QLoRA paper's
figure, the model states with bf16 adapters from first principles, and bad inputs refused in one line, exit 2."""
from __future__ import annotations

import pytest

from trainfit.analytic.engine import estimate
from trainfit.cli import main
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

# Llama-3.1-8B (config.json): hidden 4096, intermediate 14336, q 32×128, kv 8×128, 32 layers, vocab 128256, untied
H, I, Q, KV, L, V = 4096, 14336, 4096, 1024, 32, 128256
LAYER_LINEARS = H * Q + 2 * H * KV + Q * H + 3 * H * I  # q, k, v, o, gate, up, down weights of one layer
OTHERS = 2 * V * H + (2 * L + 1) * H  # embedding, untied head, two norms per layer + the final norm


def _qlora(**kw) -> Setup:
    # the embedding, head and norms as loaded (16-bit): no peft preparation (tests/analytic/test_kbit_prep.py)
    return Setup(lora_rank=16, quant="nf4", precision="bf16", optimizer="adamw", kbit_prep="none", **kw)


def test_nf4_double_quant_bits_per_parameter_matches_qlora_paper():
    # Dettmers et al. 2023 (QLoRA) §3 "Double Quantization": 4-bit weights + 8/64 + 32/(64·256) ≈ 0.127 bits of
    # constants per parameter, i.e. 4.127 bits per quantised parameter (per-Linear tables and offsets aside)
    spec = load_model("llama-3.1-8b")
    base = estimate(spec, Setup(lora_rank=16, precision="bf16", optimizer="adamw")).memory.weights
    quant = estimate(spec, _qlora()).memory.weights
    saved_bytes = base - quant  # each quantised parameter goes from 16 bits to ~4.127
    n = L * LAYER_LINEARS
    assert abs(saved_bytes - n * (16 - 4.127) / 8) <= 1e-3 * n * 2


def test_qlora_model_states_from_first_principles():
    spec = load_model("llama-3.1-8b")
    r = 16
    adapters = L * r * ((H + Q) + 2 * (H + KV) + (Q + H) + 2 * (H + I) + (I + H))  # r·(in + out) (Hu et al. §4.1)
    m = estimate(spec, _qlora(lora_dtype="weight")).memory
    # torchtune-style bf16 adapters: their gradients 2 B and torch AdamW's two states in the parameter dtype, 2 B each
    assert m.gradients == 2 * adapters and m.optimizer_states == 4 * adapters and m.master_weights == 0
    # weights: 16-bit embedding/head/norms, bf16 adapters, and at most 4.127/8 B per quantised weight + tables
    n = L * LAYER_LINEARS
    packed = m.weights - 2 * OTHERS - 2 * adapters
    assert n * 4.127 / 8 < packed < n * 4.127 / 8 + L * 7 * (4 + 4 + 64 + 1024 + 4)


@pytest.mark.parametrize("argv,needle", [
    ("estimate llama-3.1-8b --quant nf4", "needs --lora-rank"),
    ("estimate llama-3.1-8b --lora-dtype weight", "needs --lora-rank"),
    ("estimate llama-3.1-8b --quant nf3 --lora-rank 8", "nf4, fp4, int8"),
    ("estimate llama-3.1-8b --quant nf4 --lora-rank 8 --stack torchtitan", "use --stack hf"),
    ("estimate llama-3.1-8b --quant nf4 --lora-rank 8 --mode infer", "do not apply to --mode infer"),
    ("estimate llama-3.1-8b --quant int8 --lora-rank 8 --dora", "use --quant nf4"),
    ("estimate llama-3.1-8b --quant nf4 --lora-rank 8 --precision amp-bf16", "--recompute full"),
])
def test_bad_quant_inputs_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv.split())
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and needle in err, err


def test_int8_weights_from_first_principles():
    # LLM.int8 (Dettmers et al. 2022 §3): one int8 per weight and one fp32 absmax scale per output row
    spec = load_model("llama-3.1-8b")
    base = estimate(spec, Setup(lora_rank=16, precision="bf16", optimizer="adamw")).memory.weights
    int8 = estimate(spec, Setup(lora_rank=16, quant="int8", precision="bf16", optimizer="adamw",
                                kbit_prep="none")).memory.weights
    rows = L * (Q + KV + KV + H + I + I + H)  # out features of q, k, v, o, gate, up, down per layer
    assert base - int8 == L * LAYER_LINEARS * (2 - 1) - 4 * rows
