"""`trainfit check` on axolotl and LLaMA-Factory YAML (their packages do not install here: read against their cited
schemas): each key's trainfit setting by hand from the schema's defaults, bad input as one line and exit 2."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.cli.app import main
from trainfit.cli.check import request_of
from trainfit.readers import kind_of, read

MODEL = "qwen2.5-0.5b"

# axolotl's examples/qwen2/qlora-fsdp.yaml shape, with a key axolotl does not have
AXOLOTL = """base_model: Qwen/Qwen2.5-0.5B
adapter: qlora
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_modules: [q_proj, v_proj]
sequence_len: 4096
sample_packing: true
micro_batch_size: 2
gradient_accumulation_steps: 4
optimizer: paged_adamw_8bit
learning_rate: 0.0002
gradient_checkpointing: offload
flash_attention: true
fsdp_version: 2
fsdp_config:
  offload_params: false
  reshard_after_forward: true
  state_dict_type: FULL_STATE_DICT
datasets:
  - path: alpaca_2k_test
    type: alpaca
weird_key: 3
"""

# LLaMA-Factory's examples/train_qlora/llama3_lora_sft_bnb_npu.yaml shape, defaults left out
LLAMAFACTORY = """model_name_or_path: Qwen/Qwen2.5-0.5B
stage: sft
do_train: true
quantization_bit: 4
dataset: identity,alpaca_en_demo
template: qwen
output_dir: saves/qwen/lora/sft
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
bf16: true
flash_attn: fa2
neat_packing: true
"""


def _setup(tmp_path, text: str, name: str = "cfg.yaml", dp: int | None = 2):
    path = tmp_path / name
    path.write_text(text)
    r = read(path, dp)
    req, _ = request_of([r], MODEL, None, dp)
    return r, req.setup(load_spec(MODEL))


def test_axolotl_qlora_under_fsdp2(tmp_path):
    """qlora → nf4 base (loaders/model.py:719) with rank-32 adapters on q/v; bf16 "auto" → bf16 (config.py:559);
    gradient_checkpointing "offload" → full, the offload listed; fsdp_config resharding after forward → ZeRO-3 on
    FSDP2; sample_packing and lora_dropout listed with their direction."""
    r, s = _setup(tmp_path, AXOLOTL)
    assert r.model == "Qwen/Qwen2.5-0.5B"
    assert (s.stack, s.batch, s.grad_accum, s.seq, s.precision, s.recompute, s.lora_rank, s.lora_targets, s.quant,
            s.attention, s.optimizer, s.zero, s.fsdp_version, s.dp) == (
        "hf", 2, 4, 4096, "amp-bf16", "full", 32, "q_proj,v_proj", "nf4", "flash2", "paged-adamw-8bit", 3, 2, 2)
    notes = " | ".join(r.not_modelled)
    assert "sample_packing = True: not modelled (less attention time" in notes
    assert "lora_dropout = 0.05: not modelled (more memory" in notes
    assert "gradient_checkpointing = 'offload'" in notes and "fsdp_config.state_dict_type" in notes
    assert r.unknown == ["weird_key"] and {"learning_rate", "datasets", "lora_alpha"} <= set(r.no_effect)


def test_llamafactory_defaults_are_lora_rank_8_all_linear_checkpointed(tmp_path):
    """finetuning_type defaults to lora (finetuning_args.py:464) of rank 8 (:77) on every linear (:81 "all");
    quantization_bit 4 → nf4 (model_args.py:283-287); gradient checkpointing on unless disabled
    (model_utils/checkpointing.py:184); cutoff_len 2048 (data_args.py:46); fa2 → FlashAttention-2."""
    r, s = _setup(tmp_path, LLAMAFACTORY, dp=None)
    assert r.model == "Qwen/Qwen2.5-0.5B"
    assert (s.stack, s.batch, s.grad_accum, s.seq, s.precision, s.recompute, s.lora_rank, s.lora_targets, s.quant,
            s.attention) == ("hf", 1, 8, 2048, "amp-bf16", "full", 8, "all-linear", "nf4", "flash2")
    assert any(x.startswith("neat_packing = True: not modelled") for x in r.not_modelled)
    assert not r.unknown and {"template", "dataset", "learning_rate"} <= set(r.no_effect)


def test_axolotl_with_its_deepspeed_json(tmp_path):
    """deepspeed: its config decides the stack, precision and ZeRO (read beside it, as with TrainingArguments)."""
    ds = tmp_path / "zero2.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", '
                  '"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}')
    axo = tmp_path / "axo.yaml"
    axo.write_text(f"base_model: Qwen/Qwen2.5-0.5B\nmicro_batch_size: 4\ngradient_accumulation_steps: 2\n"
                   f"sequence_len: 1024\ndeepspeed: {ds}\n")
    req, _ = request_of([read(ds), read(axo)], MODEL, None, 4)
    s = req.setup(load_spec(MODEL))
    assert (s.stack, s.zero, s.precision, s.batch, s.grad_accum, s.seq, s.dp) == (
        "deepspeed", 2, "bf16-master", 4, 2, 1024, 4)


def test_each_yaml_goes_to_its_reader(tmp_path):
    path = tmp_path / "x.yaml"
    assert kind_of(path, AXOLOTL) == "axolotl"
    assert kind_of(path, LLAMAFACTORY) == "llamafactory"
    assert kind_of(path, "model_name_or_path: gpt2\nper_device_train_batch_size: 2\n") == "hf_args"


@pytest.mark.parametrize("text,needle", [
    ("base_model: x\nadapter: llama-adapter\n", "trainfit models lora and qlora"),
    ("base_model: x\nadapter: lora\n", "needs lora_r"),
    ("base_model: x\noptimizer: muon\n", "optimizer 'muon'"),
    ("model_name_or_path: x\nstage: sft\nquantization_bit: 3\n", "bitsandbytes 4- and 8-bit"),
])
def test_bad_recipe_is_one_line_and_exit_2(tmp_path, capsys, text, needle):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        main(["check", str(path), "--model", MODEL])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err
