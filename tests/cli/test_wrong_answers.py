"""Answers that were silently wrong, and the inputs that raised a traceback, each checked against an independent
source: the other run of the same model, the stack's own facts, the engine's documented rule."""
import json

import pytest


def _json(cli, *args) -> dict:
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _refused(cli, *args) -> str:
    code, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err)
    assert err.startswith("error:") and "Traceback" not in err, err
    return err


def test_compile_on_a_model_it_does_not_model_says_what_the_time_is():
    """BERT's block is not the Llama block compile_effects derives: its kernels stay eager's, and only the host's
    issue wait goes (any compiled step launches from generated code). The note said "time as eager" while the step
    dropped from 37.6 to 8.5 ms; the compiled step is the eager step less its host-issue term."""
    from trainfit import estimate

    eager = estimate("bert-base", gpu="H100-80GB")
    compiled = estimate("bert-base", gpu="H100-80GB", compile=True)
    e, c = eager.detail.step_time, compiled.detail.step_time
    assert e.host_issue > 0 and c.compute == e.compute  # unfused: the same kernels
    assert c.step_seconds == pytest.approx(e.step_seconds - e.host_issue, rel=1e-9)
    note = next(n for n in compiled.notes if n.startswith("compile:"))
    assert "unfused" in note and "host's kernel issue" in note and "time as eager" not in note


def _stack_toml(name: str) -> dict:
    import tomllib
    from importlib import resources

    return tomllib.loads(resources.files("trainfit.stacks").joinpath(f"{name}.toml").read_text())


@pytest.mark.parametrize("stack", ["hf", "torchtitan", "megatron", "deepspeed"])
def test_tensor_layouts_and_compile_follow_the_stacks_own_facts(cli, stack):
    """Every stack's file says whether it runs a tensor split and --compile (DeepSpeed: its ZeRO engine is modelled,
    and `plan --emit deepspeed` writes no tensor layout); a setting the file says no to is refused by name, with
    the stacks that run it, instead of being estimated (or raising KeyError 'compile')."""
    facts = _stack_toml(stack)
    tensor = facts.get("model_parallel", {}).get("tensor", True)
    args = ("estimate", "llama-3.1-8b", "--stack", stack, "--gpu", "H100-80GB")
    tp = ("--tp", "2", "--sequence-parallel") + (("--dp", "2", "--zero", "3") if stack == "torchtitan" else ())
    if tensor:
        assert cli(*args, *tp)[0] == 0
    else:
        err = _refused(cli, *args, *tp)
        assert f"--stack {stack} runs no tensor split" in err and "--tp 1" in err
    pipeline = facts.get("model_parallel", {}).get("pipeline", True)
    pp = ("--pp", "2", "--grad-accum", "2")
    if pipeline:
        assert cli(*args, *pp)[0] == 0
    else:
        err = _refused(cli, *args, *pp)
        assert f"--stack {stack} runs no pipeline split" in err and "--pp 1" in err
    if facts["compile"]["supported"]:
        assert cli(*args, "--compile")[0] == 0
    else:
        err = _refused(cli, *args, "--compile")
        assert f"--compile is not modelled for --stack {stack}" in err and facts["compile"]["why"] in err


def test_fit_advice_never_proposes_a_layout_the_stack_refuses(cli):
    # llama-3.1-8b at 8k tokens does not fit an A100-40GB; the advice proposed --tp 8 --sequence-parallel to
    # DeepSpeed, which --stack deepspeed now refuses: every proposal is a setup the stack accepts
    out = _json(cli, "estimate", "llama-3.1-8b", "--stack", "deepspeed", "--gpu", "A100-40GB", "--seq", "8192")
    advice = out["would_fit"]
    assert not out["fit"]["fits"] and advice
    for a in advice:
        assert "--tp" not in a["flags"] and "--pp" not in a["flags"], a
        assert cli("estimate", "llama-3.1-8b", "--stack", "deepspeed", "--gpu", "A100-40GB", "--seq", "8192",
                   *a["flags"].split())[0] == 0


def test_a_fact_missing_from_a_stacks_file_is_named():
    from trainfit.stacks import get_stack

    with pytest.raises(LookupError, match=r"stacks/deepspeed.toml has no \[nonesuch\] value"):
        get_stack("deepspeed").fact("nonesuch")


@pytest.mark.parametrize("flag, extra", [("--reward-model", ()), ("--critic-model", ("--rl-algo", "ppo"))])
def test_an_image_model_cannot_score_text(cli, flag, extra):
    err = _refused(cli, "estimate", "llama-3.1-8b", "--mode", "rl", *extra, flag, "resnet-50")
    assert f"{flag} resnet-50 is an image model" in err


def test_serve_mode_runs_a_model_with_fewer_positions_than_the_default_sequence(cli):
    """GPT-2 has 1024 learned positions (openai-community/gpt2 config.json n_positions): serve mode refused it over
    a --seq it does not take; vLLM's default max_model_len is the model's max_position_embeddings
    (vllm config.py _get_and_verify_max_len: max_model_len None -> the derived length)."""
    out = _json(cli, "estimate", "gpt2-small", "--mode", "serve", "--gpu", "H100-80GB")
    assert out["serving"]["max_model_len"] == 1024 and out["time"]["max_seq"] == 1024
    err = _refused(cli, "estimate", "gpt2-small", "--mode", "serve", "--gpu", "H100-80GB", "--max-model-len", "2048")
    assert "--max-model-len 2048" in err and "1024" in err


@pytest.mark.parametrize("server", ["vllm", "sglang"])
def test_serve_json_says_the_request_length_its_batch_is_at(cli, server):
    """time.max_batch (446 for Llama-3.1-8B on an H100 at --max-model-len 8192) counts requests of --prompt-len +
    --completion-len tokens, yet sat beside max_seq = the model length alone, reading as 446 sequences of 8,192 tokens
    where ~55 fit. time.max_batch_tokens now says the length it is at. Hand count from the estimate's own KV pool: the
    batch is the pool's tokens over one request's (vLLM's 16-token blocks and SGLang's page of 1 divide 1,024), below
    the request limit; the model-length sequences that fit are the pool over 8,192."""
    out = _json(cli, "estimate", "llama-3.1-8b", "--mode", "serve", "--server", server, "--gpu", "H100-80GB",
                "--max-model-len", "8192")
    t, sv, s = out["time"], out["serving"], out["setup"]
    assert t["max_batch_tokens"] == s["prompt_len"] + s["completion_len"] == 1024
    limit = sv.get("max_num_seqs") or sv["max_running_requests"]  # (the knobs sit flat in `serving`)
    assert t["max_batch"] == min(sv["kv_tokens"] // 1024, limit)
    assert t["max_seq"] == sv["max_model_len"] == 8192
    assert int(sv["max_concurrent_sequences"]) == sv["kv_tokens"] // 8192 < t["max_batch"]
    infer = _json(cli, "estimate", "llama-3.1-8b", "--mode", "infer", "--seq", "2048", "--gpu", "H100-80GB")
    assert infer["time"]["max_batch_tokens"] == 2048  # --mode infer: the largest batch at --seq


def test_serve_mode_refuses_an_encoder_with_the_reason(cli):
    err = _refused(cli, "estimate", "bert-base", "--mode", "serve", "--gpu", "H100-80GB")
    assert "bert-base is an encoder" in err and "pooling" in err and "--mode infer" in err


@pytest.mark.parametrize("gpu", [(), ("--gpu", "H100-80GB")])
def test_measure_in_serve_mode_names_measure(cli, gpu):
    err = _refused(cli, "estimate", "llama-3.1-8b", "--mode", "serve", "--measure", *gpu)
    assert "without --measure" in err and "--gpu" not in err


def test_serve_names_the_host_when_the_host_is_wrong(cli):
    err = _refused(cli, "serve", "--host", "999.1.1.1")
    assert "--host 999.1.1.1" in err and "--port" not in err


@pytest.mark.parametrize("engine", [[], ["--measure", "--device", "cpu"]])
def test_rl_mode_refuses_an_encoder_policy(cli, engine):
    """RL samples completions from the policy: an encoder (BERT) generates none; it was estimated as if it did."""
    err = _refused(cli, "estimate", "tiny-bert", "--mode", "rl", "--gpu", "H100-80GB", *engine)
    assert "tiny-bert is an encoder" in err and "--mode rl" in err


def test_fit_commands_reproduce_their_rows(cli):
    """`trainfit fit`'s "see it in full" command carries the user's own flags beside the suggestion's (it dropped
    --lora-rank 8 and --reserve, so the command showed another job): running it gives the row's step time and fit."""
    import json
    import shlex

    code, out, err = cli("fit", "llama-3.2-1b", "--gpu", "T4", "--lora-rank", "8", "--reserve", "1", "--json")
    assert code == 0, err
    rows = json.loads(out)["fits"]
    assert rows
    for r in rows[:3]:
        argv = shlex.split(r["command"])
        assert argv[:2] == ["trainfit", "estimate"] and "--lora-rank" in argv and "--reserve" in argv, argv
        code, out, err = cli(*argv[1:], "--json")
        assert code == 0, err
        t = json.loads(out)["time"]
        assert t["fits"] and t["step_seconds"] == pytest.approx(r["step_seconds"], rel=1e-12), (r, t)


def test_a_serving_engine_that_fails_its_start_up_check_says_it_does_not_start(cli):
    """Qwen3-32B on one H100 under vLLM's defaults: its device total fits the GPU, but the KV cache holds fewer tokens
    than one request of --max-model-len (40,960, the model's own), and vLLM raises at start-up ("max seq len ... is
    larger than the maximum number of tokens that can be stored in KV cache", v1/core/kv_cache_utils.py). The verdict
    said "does not fit" beside a positive headroom; it names what happens, and the numbers it rests on agree."""
    from trainfit import estimate

    e = estimate("qwen3-32b", gpu="H100-80GB", mode="serve")
    sv = e.detail.serving
    assert e.time.headroom > 0 and sv.kv_tokens < sv.max_model_len == 40960  # memory fits; one request does not
    code, out, err = cli("estimate", "qwen3-32b", "--gpu", "H100-80GB", "--mode", "serve")
    assert code == 0, err
    assert "does not start, headroom" in out and "does not fit" not in out
    assert "does not start on H100-80GB; what would" in out
    # memory short: "does not fit", as before; its advice is timed although the setup as given serves nothing
    code, out, _ = cli("estimate", "llama-3.1-70b", "--gpu", "H100-80GB", "--mode", "serve")
    assert "does not fit, headroom -" in out and "does not fit on H100-80GB; what would" in out
    assert "n/a the time" not in out and "tokens/s per GPU; the setup as given runs none" in out
