"""--kbit-prep (analytic/kbit_prep.py): peft's prepare_model_for_kbit_training keeps the parameters --quant leaves
unquantised in fp32. Its bytes against a hand count of Llama-3.1-8B's embedding, head and norms; the fp32 head's
logits against the dtypes the step makes; the stack's default; bad input in one line."""
from __future__ import annotations

import pytest

from trainfit.analytic.engine import estimate
from trainfit.analytic.kbit_prep import preparation
from trainfit.analytic.loss import head_and_loss
from trainfit.analytic.precision import state_bytes
from trainfit.cli import main
from trainfit.models.resolve import load_model
from trainfit.setup import Setup

# Llama-3.1-8B (config.json): hidden 4096, 32 layers, vocab 128256, untied embedding and head, RMSNorm weights
H, L, V = 4096, 32, 128256
NORMS = (2 * L + 1) * H  # input_layernorm and post_attention_layernorm per layer + the final norm
OTHERS = 2 * V * H + NORMS  # every parameter bitsandbytes leaves unquantised (the LM head and embedding skipped)


def _weights(**kw) -> float:
    spec = load_model("llama-3.1-8b")
    return estimate(spec, Setup(lora_rank=16, quant="nf4", precision="bf16", optimizer="adamw", **kw)).memory.weights


def test_peft_upcasts_embedding_head_and_norms_by_two_bytes_each():
    # peft 0.21.2 utils/other.py:204-209: every bf16 parameter that is not a Params4bit becomes fp32 (+2 B each)
    assert _weights(kbit_prep="peft") - _weights(kbit_prep="none") == 2 * OTHERS
    # the norm weights only (TRL's SFTTrainer with bf16=True)
    assert _weights(kbit_prep="norms") - _weights(kbit_prep="none") == 2 * NORMS


def test_fp32_head_makes_fp32_logits_and_no_upcast_copy():
    # bf16 head: bf16 logits (2 B) and ForCausalLMLoss's logits.float() copy (4 B) live together; peft's fp32 head
    # on the fp32 final-norm output makes fp32 logits (4 B) and .float() returns them as they are: 2 B less a logit
    spec, tokens = load_model("llama-3.1-8b"), 1024
    heads = {}
    for prep in ("none", "peft"):
        s = Setup(seq=tokens, lora_rank=16, quant="nf4", precision="bf16", kbit_prep=prep)
        heads[prep] = head_and_loss(spec, s, state_bytes(s), tokens)
    assert heads["peft"].forward_transient - heads["none"].forward_transient == -2 * V * tokens


def test_default_follows_the_stack_recipe():
    assert preparation(Setup(lora_rank=8, quant="nf4", precision="bf16")) == "peft"  # stacks/hf.toml [kbit_prep]
    assert preparation(Setup(lora_rank=8, precision="bf16")) == "none"
    assert state_bytes(Setup(lora_rank=8, quant="nf4", precision="bf16")).residual == 4  # the fp32 embedding's output
    assert state_bytes(Setup(lora_rank=8, quant="nf4", precision="bf16", kbit_prep="none")).residual == 2


@pytest.mark.parametrize("argv,needle", [
    ("estimate llama-3.1-8b --kbit-prep peft", "needs --quant"),
    ("estimate llama-3.1-8b --quant nf4 --lora-rank 8 --kbit-prep fp32", "peft, norms, none"),
])
def test_bad_kbit_prep_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv.split())
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and needle in err, err
