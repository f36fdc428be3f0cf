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
from trainfit.errors import SetupError
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


_RECAST = r"""
import json, os
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
import torch, deepspeed
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256)
model = prepare_model_for_kbit_training(LlamaForCausalLM(cfg).to(torch.bfloat16), use_gradient_checkpointing=False)
prepared = sorted({str(p.dtype) for p in model.parameters()})
model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
torch.distributed.init_process_group("gloo")
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={"train_micro_batch_size_per_gpu": 1,
                                  "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
print(json.dumps([prepared, sorted({str(p.dtype) for p in engine.module.parameters()})]))
"""


@pytest.mark.heavy
def test_deepspeeds_engine_casts_the_prepared_parameters_back(tmp_path):
    """DeepSpeed 0.19.8's own deepspeed.initialize (bf16, one gloo rank) on a model prepared by peft's own
    prepare_model_for_kbit_training and wrapped with LoRA adapters: every parameter peft made fp32 is bf16 after it
    (the fact stacks/deepspeed.toml [peft] adapter_dtype = "model" states, StackFacts.casts_parameters)."""
    import json
    import socket
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    run = subprocess.run([sys.executable, "-c", _RECAST], capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "PORT": port, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    prepared, wrapped = json.loads(run.stdout.strip().splitlines()[-1])
    assert prepared == ["torch.float32"] and wrapped == ["torch.bfloat16"]


def test_deepspeed_steps_with_no_preparation_in_force():
    """Under DeepSpeed's bf16 engine the preparation's fp32 parameters are bf16 again (the test above), so the
    step's dtypes are those of no preparation: the saved activations equal --stack hf's with --kbit-prep none (the
    HF step without it, whose activations the trace matches to real steps: tests/trace/test_kbit_prep_trace.py)
    — before, the fp32 residual stream of peft's preparation was counted beside bf16 weights. An explicit
    --kbit-prep is refused there (it would change nothing)."""
    spec = load_model("llama-3.1-8b")
    kw = dict(lora_rank=16, quant="nf4", precision="bf16-master", recompute="full", seq=4096)
    ds = estimate(spec, Setup(stack="deepspeed", **kw)).memory
    hf = estimate(spec, Setup(stack="hf", kbit_prep="none", **kw)).memory
    prepared = estimate(spec, Setup(stack="hf", **kw)).memory
    assert ds.activations == hf.activations < prepared.activations
    assert state_bytes(Setup(stack="deepspeed", **kw)).residual == 2
    with pytest.raises(SetupError, match="--kbit-prep peft: --stack deepspeed's engine casts every parameter"):
        Setup(stack="deepspeed", kbit_prep="peft", **kw)


@pytest.mark.parametrize("zero,dp", [(0, 1), (3, 8)])
def test_under_fp32_weights_the_preparation_changes_nothing(zero, dp):
    """peft's own prepare_model_for_kbit_training on a model whose weights are fp32 (amp-*'s) leaves every dtype as
    it was (it casts fp16/bf16 parameters only: peft 0.21.2 utils/other.py:204-209), so under amp-bf16 the step is
    the same with it or without it — also under FSDP2's MixedPrecisionPolicy (--zero 3), whose bf16 param_dtype makes
    the stream bf16. Before, --kbit-prep peft there counted an fp32 residual stream, fp32 frozen outputs and
    logits beside the bf16 gathers."""
    torch = pytest.importorskip("torch")
    from peft import prepare_model_for_kbit_training
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
    before = {n: p.dtype for n, p in model.named_parameters()}
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    assert {n: p.dtype for n, p in model.named_parameters()} == before and set(before.values()) == {torch.float32}
    spec = load_model("llama-3.1-8b")
    kw = dict(lora_rank=16, quant="nf4", precision="amp-bf16", recompute="full", seq=4096, dp=dp, zero=zero)
    # (the hf stack's default preparation is peft's: stacks/hf.toml [kbit_prep]; an explicit one is refused here)
    prepared, plain = estimate(spec, Setup(**kw)).memory, estimate(spec, Setup(kbit_prep="none", **kw)).memory
    assert (prepared.peak, prepared.activations, prepared.weights) == (plain.peak, plain.activations, plain.weights)
    with pytest.raises(SetupError, match="under --precision amp-bf16 they are fp32 already"):
        Setup(kbit_prep="peft", **kw)


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
