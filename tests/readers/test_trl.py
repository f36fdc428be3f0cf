"""`trainfit check` on TRL's SFTConfig / GRPOConfig / DPOConfig files, parsed by trl's own classes: each key's
trainfit setting against a hand derivation from trl 1.16.0's code (cited per case), TRL's own validation and
trainfit's refusals as one line and exit 2."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.cli.app import main
from trainfit.cli.check import request_of
from trainfit.readers import kind_of, read

pytest.importorskip("trl")
MODEL = "qwen2.5-0.5b"


def _setup(tmp_path, text: str, dp: int | None = None, name: str = "cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    r = read(path, dp)
    req, _ = request_of([r], MODEL, None, dp)
    return r, req.setup(load_spec(MODEL))


def test_grpo_config_counts_prompts_per_gpu(tmp_path):
    """8 completions per GPU micro-batch, gradient_accumulation_steps 4 → steps_per_generation 4 (grpo_config.py:1099):
    one GPU generates 8 × 4 = 32 completions = 2 prompts × num_generations 16, trained in 4 micro-batches of 8;
    vLLM colocated at 0.4 of the GPU, sleeping at level 2 (vllm_generation.py:366); TRL's defaults:
    gradient_checkpointing on (base_config.py:62), bf16 (base_config.py:108)."""
    r, s = _setup(tmp_path, "output_dir: out\nper_device_train_batch_size: 8\ngradient_accumulation_steps: 4\n"
                  "num_generations: 16\nmax_completion_length: 1024\nuse_vllm: true\nvllm_mode: colocate\n"
                  "vllm_gpu_memory_utilization: 0.4\nvllm_enable_sleep_mode: true\nbeta: 0.04\ntemperature: 0.7\n"
                  "num_iterations: 2\nfoo: 1\n", dp=2)
    assert (s.mode, s.rl_algo, s.batch, s.group_size, s.grad_accum, s.completion_len, s.rollout,
            s.vllm_gpu_memory_utilization, s.vllm_sleep_level, s.beta, s.dp, s.recompute, s.precision) == (
        "rl", "grpo", 2, 16, 4, 1024, "vllm", 0.4, 2, 0.04, 2, "full", "amp-bf16")
    assert r.unknown == ["foo"] and "temperature" in r.no_effect
    assert any(x.startswith("num_iterations = 2: not modelled (more time") for x in r.not_modelled)
    assert any(x.startswith("prompt length") for x in r.not_modelled)


def test_grpo_steps_per_generation_sets_the_micro_batches(tmp_path):
    """steps_per_generation 8 with gradient_accumulation_steps 2: 4 × 8 = 32 completions per GPU = 4 prompts × 8,
    trained in 8 micro-batches of 4; the optimizer's extra steps are listed."""
    r, s = _setup(tmp_path, "output_dir: out\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"
                  "steps_per_generation: 8\nnum_generations: 8\nbf16: false\ngradient_checkpointing: false\n")
    assert (s.batch, s.group_size, s.grad_accum, s.rollout, s.precision, s.recompute) == (4, 8, 8, "hf", "fp32",
                                                                                           "none")
    assert any(x.startswith("gradient_accumulation_steps = 2 with steps_per_generation = 8") for x in r.not_modelled)


def test_sft_config_reads_trls_defaults(tmp_path):
    """SFTConfig with only a batch: max_length 1024 (sft_config.py:202), gradient checkpointing on, bf16, TRL's fused
    LM head (sft_trainer.py:1144) = --loss chunked-logprob; use_liger_kernel → --liger; packing listed."""
    r, s = _setup(tmp_path, '{"output_dir": "o", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, '
                  '"packing": true, "use_liger_kernel": true, "activation_offloading": false, '
                  '"dataset_text_field": "text"}', name="sft.json")
    assert (s.stack, s.batch, s.grad_accum, s.seq, s.recompute, s.precision, s.loss, s.liger) == (
        "hf", 2, 8, 1024, "full", "amp-bf16", "chunked-logprob", True)
    assert any(x.startswith("packing = True: not modelled") for x in r.not_modelled)
    assert "activation_offloading" in r.no_effect and not r.unknown


def test_dpo_config_runs_chosen_and_rejected_together(tmp_path):
    """DPO's collator puts prompt+chosen and prompt+rejected in one batch (dpo_trainer.py:169): 2 × 4 sequences of
    max_length 512; the reference model is named as not modelled."""
    r, s = _setup(tmp_path, "output_dir: out\nper_device_train_batch_size: 4\nmax_length: 512\nbeta: 0.1\n"
                  "label_smoothing: 0.0\n")
    assert (s.mode, s.batch, s.seq, s.loss) == ("train", 8, 512, "chunked-logprob")
    assert any(x.startswith("reference model") for x in r.not_modelled)


def test_plain_training_arguments_stay_with_transformers(tmp_path):
    path = tmp_path / "args.yaml"
    text = "output_dir: out\nper_device_train_batch_size: 4\n"
    assert kind_of(path, text) == "hf_args"
    assert kind_of(path, text + "num_generations: 4\n") == "trl"


@pytest.mark.parametrize("text,needle", [
    ("per_device_train_batch_size: 3\nnum_generations: 4\n", "holds part of a group of 4"),
    ("per_device_train_batch_size: 4\nnum_generations: 1\n", "GRPOConfig rejects it"),
    ("per_device_train_batch_size: 4\nnum_generations: 4\noptim: adamw_anyprecision\n", "optim"),
    ("per_device_train_batch_size: 4\nmax_seq_length: 2048\n", "max_seq_length is TRL's old name"),
    # the RL step has no --compile (trainfit's setting, train only): refused by the file's own key
    ("per_device_train_batch_size: 4\nnum_generations: 4\ntorch_compile: true\n",
     "torch_compile True (read as --compile): --compile applies to train only"),
])
def test_bad_trl_config_is_one_line_and_exit_2(tmp_path, capsys, text, needle):
    path = tmp_path / "grpo.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        main(["check", str(path), "--model", MODEL, "--dp", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err



def _check_then_estimate(cli, path, *extra):
    """check's JSON, and `trainfit estimate`'s for the flags check prints (its "as trainfit:" line) plus `extra`."""
    import json
    import shlex

    code, out, err = cli("check", str(path), "--model", MODEL, "--dp", "2", *extra, "--json")
    assert code == 0, err
    d = json.loads(out)
    flags = [w for k, v in d["check"]["settings"].items() for w in ("--" + k.replace("_", "-"), str(v))]
    code, plain, _ = cli("check", str(path), "--model", MODEL, "--dp", "2", *extra)
    line = next(x for x in plain.splitlines() if x.startswith("as trainfit: "))
    assert shlex.split(line.removeprefix("as trainfit: ")) == flags
    code, est, err = cli("estimate", MODEL, *flags, *extra, "--json")
    assert code == 0, err
    return d, json.loads(est)


GRPO = ("output_dir: out\nper_device_train_batch_size: 8\ngradient_accumulation_steps: 4\nnum_generations: 8\n"
        "max_completion_length: 256\n")


def test_the_flags_check_prints_for_a_grpo_config_are_flags_estimate_takes(tmp_path, cli):
    """check printed 'as trainfit: ... --stack hf ... --mode rl ...' for a GRPOConfig, a line `trainfit estimate`
    refuses ('--stack applies to train only, not --mode rl: drop it'): a setting that does not apply to the mode
    (at its default, or the request refuses it) is left out, and estimate's answer is check's."""
    path = tmp_path / "grpo.yaml"
    path.write_text(GRPO)
    d, e = _check_then_estimate(cli, path)
    assert "stack" not in d["check"]["settings"] and d["memory"] == e["memory"]


def test_check_takes_the_prompt_length_it_asks_for(tmp_path, cli):
    """check's note on a GRPOConfig said 'pass --prompt-len' (docs/check.md too), but check had no such option ('No
    such option: --prompt-len', exit 2): the estimate stayed at 512 prompt tokens. With it, the answer is
    `trainfit estimate`'s for the flags check prints plus --prompt-len, and the note is gone."""
    path = tmp_path / "grpo.yaml"
    path.write_text(GRPO)
    d, e = _check_then_estimate(cli, path, "--prompt-len", "300")
    assert not any(x.startswith("prompt length") for x in d["check"]["not_modelled"])
    assert d["memory"] == e["memory"] and d["setup"]["prompt_len"] == 300 == e["setup"]["prompt_len"]
    code, _, err = cli("check", str(path), "--model", MODEL, "--prompt-len", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("init, want", [("", "amp-bf16"), ("model_init_kwargs: {dtype: float32}\n", "amp-bf16"),
                                        ("model_init_kwargs: {dtype: bfloat16}\n", "bf16")])
def test_model_init_kwargs_dtype_sets_the_weights_dtype(tmp_path, init, want):
    """TRL loads the model with model_init_kwargs (trainer/utils.py:1332-1336 create_model_from_path: float32 unless
    `dtype` says otherwise); dtype bfloat16 trains bf16 weights, gradients and optimizer states (--precision bf16).
    check listed model_init_kwargs as without effect and estimated fp32 master weights (amp-bf16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import create_model_from_path

    tiny = tmp_path / "tiny"
    LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=64)).save_pretrained(tiny)
    kwargs = {"dtype": "bfloat16"} if "bfloat16" in init else {"dtype": "float32"} if init else {}
    loaded = create_model_from_path(str(tiny), device_map=None, **kwargs)
    assert next(loaded.parameters()).dtype == (torch.bfloat16 if want == "bf16" else torch.float32)
    r, s = _setup(tmp_path, "output_dir: out\nper_device_train_batch_size: 2\nmax_length: 512\n" + init)
    assert s.precision == want
    assert "model_init_kwargs" not in r.no_effect


def test_the_parsers_own_warning_is_a_line_of_check_not_a_python_warning(tmp_path, cli):
    """transformers 5.24 warns that gradient_checkpointing is deprecated (training_args.py:1541, a FutureWarning
    printed with its file path on stderr): check says it among its lines, and its JSON under "warned"."""
    import json

    path = tmp_path / "args.yaml"
    path.write_text("output_dir: out\nper_device_train_batch_size: 2\ngradient_checkpointing: true\n")
    code, out, err = cli("check", str(path), "--model", MODEL)
    assert code == 0 and "FutureWarning" not in err and "training_args.py" not in err
    assert "  · TrainingArguments warns: `gradient_checkpointing` is deprecated" in out
    code, out, _ = cli("check", str(path), "--model", MODEL, "--json")
    assert code == 0 and any("gradient_checkpointing" in x for x in json.loads(out)["check"]["warned"])

