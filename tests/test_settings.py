"""One definition of the settings (trainfit/setup/settings.py) reaches every surface: the Python API (Request), every CLI
command that takes settings, the web API's schema and the web page. Adding a setting is one declaration (plus
the formula that reads it); these tests fail if any surface would need a second edit."""
import json
import re

import pytest

from trainfit import api
from trainfit.setup import SETTINGS, Request, Setup

fastapi = pytest.importorskip("fastapi")




def test_every_setting_is_a_request_field_with_its_default():
    for s in SETTINGS:
        assert hasattr(Request(model="gpt2"), s.name)
        assert getattr(Request(model="gpt2"), s.name) == s.request_default


@pytest.mark.parametrize("command", ["estimate", "report"])
def test_every_setting_is_a_cli_option(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0
    for s in SETTINGS:
        assert s.flag in out, f"{s.flag} missing from `trainfit {command} --help`"


def test_every_setting_is_in_the_web_schema_and_on_the_page():
    from fastapi.testclient import TestClient

    from trainfit.web.app import create_app

    client = TestClient(create_app())
    schema = client.get("/api/openapi.json").json()
    params = {p["name"] for p in schema["paths"]["/api/estimate"]["get"]["parameters"]}
    page = client.get("/").text
    for s in SETTINGS:
        assert s.name in params
        assert f'id="{s.name}"' in page


def test_reserve_the_setting_added_in_one_place(cli):
    """--reserve was added by one declaration in RunSettings and one use in the fit formula. Hand check: the
    headroom is GPU memory minus reserve minus fixed overheads minus required, so 8 GiB instead of 1 GiB leaves
    exactly 7 GiB less."""
    base = ["estimate", "llama-3.2-1b", "--gpu", "H100-80GB", "--json"]
    _, a, _ = cli(*base, "--reserve", "1")
    _, b, _ = cli(*base, "--reserve", "8")
    a, b = json.loads(a), json.loads(b)
    assert a["time"]["headroom"] - b["time"]["headroom"] == 7 * 2**30
    assert a["memory"]["peak"] == b["memory"]["peak"]
    web = api.analytic(Request(model="llama-3.2-1b", gpu="H100-80GB", reserve=8.0))
    assert web.time.headroom == b["time"]["headroom"]
    code, _, err = cli(*base, "--reserve", "-1")
    assert code == 2 and "--reserve" in err


LOGITS = 2048 * 128_256 * 4  # llama-3.2-1b's fp32 logits at the default batch 1 × seq 2048
# llama-3.2-1b amp at batch 1 x 2048 tokens: the gradients' own segments free at the peak (analytic/grad_segments.py):
# its 48 fp32 MLP gradients (2,048 x 8,192 x 4 B = 64 MiB) exceed the 32 MiB bf16 MLP intermediate; the 1,002 MiB
# logits block holds 15, 33 open segments (2,112 MiB), less the states carved from the activations' cache (q/o
# 16 MiB and k/v 4 MiB, two each, 16 layers: 1,280 MiB) = 832 MiB
GRAD_SEGMENTS = 832 * 2**20
SLACK = 16 * 2**20  # the fit rule's segment slack of its states (test_gpu_memory_replaces_the_gpus_capacity_everywhere)


def test_gpu_memory_replaces_the_gpus_capacity_everywhere(cli):
    """--gpu-memory, one declaration in RunSettings: 40 GiB on an H100-80GB is exactly 40 GiB in the estimate's
    JSON (time.gpu_memory) and in the plan's, the device total is a hand check (peak + one cached block of the
    largest freed tensor, the loss's fp32 logits 2048 tokens × vocab 128,256 × 4 B, + the gradients' free
    segments + the H100's cuBLAS workspaces + its CUDA context, data/overheads.toml; one GPU, no NCCL), the
    headroom is the fit rule's capacity - required, the web API and view say the same, and it needs --gpu."""
    base = ["estimate", "llama-3.2-1b", "--gpu", "H100-80GB", "--json"]
    code, out, _ = cli(*base, "--gpu-memory", "40")
    assert code == 0
    d = json.loads(out)
    assert d["time"]["gpu_memory"] == 40 * 2**30
    # + 2 x 32 MiB cuBLAS + the Hopper context after a step (820,838,400 B, our H200 runs: tests/test_overheads.py)
    assert d["memory"]["device_total"] == (d["memory"]["peak"] + LOGITS + GRAD_SEGMENTS + 64 * 2**20
                                           + 820_838_400)
    # the fit rule (analytic/fit_rule.py): required = peak + the logits block (pinned) + the states' segment slack:
    # k/v weights and two AdamW states, 4 MiB each, 2 x 16 layers x 3 = 384 MiB in 20 MiB segments = 400 MiB; the
    # gradients' free segments are released at the OOM retry. capacity = 40 GiB - cuBLAS - context
    assert d["memory"]["required"] == d["memory"]["peak"] + LOGITS + SLACK
    assert d["fit"]["capacity"] == 40 * 2**30 - 64 * 2**20 - 820_838_400
    assert d["time"]["headroom"] == d["fit"]["headroom"] == d["fit"]["capacity"] - d["memory"]["required"]
    _, full, _ = cli(*base)
    assert json.loads(full)["time"]["gpu_memory"] == 85_017_755_648  # the catalog's H100 as CUDA sees it (deviceQuery)
    web = api.analytic(Request(model="llama-3.2-1b", gpu="H100-80GB", gpu_memory=40.0))
    assert web.time.gpu_memory == 40 * 2**30 and web.time.headroom == d["time"]["headroom"]
    code, out, _ = cli("plan", "llama-3.2-1b", "--gpu", "H100-80GB", "--gpus", "1", "--gpu-memory", "40", "--json")
    assert code == 0
    p = json.loads(out)
    # the plan's capacity for the step's tensors: the same 40 GiB less the same cuBLAS workspaces and context
    assert p["gpu_memory"] == 40 * 2**30
    assert p["candidates"][0]["memory"]["capacity"] == 40 * 2**30 - 64 * 2**20 - 820_838_400
    for args, word in (((*base[:2], "--gpu-memory", "40"), "needs --gpu"), ((*base, "--gpu-memory", "0"), "greater"),
                       ((*base, "--gpu-memory", "1e6"), "at most")):
        code, _, err = cli(*args)
        assert code == 2 and "--gpu-memory" in err and word in err and len(err.strip().splitlines()) == 1, err


def test_gpu_memory_reaches_the_web_view():
    from fastapi.testclient import TestClient

    from trainfit.web.app import create_app

    client = TestClient(create_app())
    v = client.post("/api/view", json={"model": "llama-3.2-1b", "gpu": "H100-80GB", "gpu_memory": 12}).json()
    assert v["capacity"] == 12 * 2**30
    assert v["summary"]["headroom"] == (12 * 2**30 - 64 * 2**20 - 820_838_400 - LOGITS - SLACK
                                        - v["summary"]["peak"])
    assert v["summary"]["fits"] is False and v["would_fit"]  # the advice judges against 12 GiB too
    r = client.get("/api/estimate", params={"model": "llama-3.2-1b", "gpu": "/etc/passwd.json"})
    assert r.status_code == 400 and "catalog GPU names" in r.json()["error"]


def test_setup_rejects_what_the_definition_rejects():
    for bad in ({"batch": 0}, {"precision": "fp64"}, {"zero": 5, "dp": 2}, {"mode": "infer", "grad_accum": 2}):
        with pytest.raises(Exception) as e:
            Setup(**bad)
        assert "--" in str(e.value)


def test_with_micro_batches_is_with_and_keeps_its_rules():
    """Setup.with_micro_batches (the planner's cheap derivation) builds the Setup `with_` builds and refuses what
    `with_` refuses for those two settings."""
    from trainfit.errors import SetupError

    base = Setup(seq=4096, dp=8, zero=3, recompute="selective", stack="torchtitan", precision="amp-bf16")
    for b, m in ((1, 1), (3, 7), (16, 2)):
        got, want = base.with_micro_batches(b, m), base.with_(batch=b, grad_accum=m)
        assert got == want and hash(got) == hash(want) and got.recompute == "op"
    assert base.with_micro_batches(5) == base.with_(batch=5)
    for bad in (dict(batch=0), dict(batch=2, grad_accum=0)):
        with pytest.raises(SetupError):
            base.with_micro_batches(**bad)
    inbwd = Setup(optimizer_in_backward=True, precision="bf16")
    with pytest.raises(SetupError, match="--grad-accum 1"):
        inbwd.with_micro_batches(1, 2)


def test_with_exchange_is_with_and_keeps_its_rules():
    """Setup.with_exchange (the planner's cheap derivation of a group's MoE dispatchers) builds the Setup `with_`
    builds and refuses what `with_` refuses, over every assignment of the exchange settings on Megatron bases that
    differ in what the rules read (ep, recompute, pipelining and its virtual stages, precision), and on a stack
    without them."""
    import itertools

    from trainfit.errors import SetupError

    bases = [Setup(stack="megatron", precision=p, seq=4096, dp=dp, ep=ep, pp=pp, vpp=vpp, grad_accum=8,
                   recompute=rec, zero=1)
             for p, dp, ep, pp, vpp, rec in itertools.product(("bf16-master", "fp32"), (8,), (1, 8), (1, 2), (1, 2),
                                                             ("none", "full", "selective"))
             if not (vpp > 1 and pp == 1)] + [Setup(seq=4096, dp=8, zero=3)]
    assignments = [dict(zip(("moe_dispatcher", "moe_dispatcher_sms", "overlap_moe_comm"), v)) for v in
                   itertools.product((None, "alltoall", "allgather", "deepep"), (None, 20), (False, True))]
    outcomes = set()
    for base, v in itertools.product(bases, assignments):
        try:
            want = base.with_(**v)
        except SetupError as e:
            with pytest.raises(SetupError, match=re.escape(str(e))):
                base.with_exchange(**v)
            outcomes.add("refused")
            continue
        got = base.with_exchange(**v)
        assert got == want and hash(got) == hash(want)
        outcomes.add("built")
    assert outcomes == {"built", "refused"}
    assert bases[0].with_exchange(batch=2) == bases[0].with_(batch=2)  # (other settings: with_ itself)


def test_every_setting_has_a_concern_and_the_modes_follow_it():
    """Settings are grouped by concern (setup/vocab.py GROUPS); the serving, RL, vision and fine-tuning groups'
    settings apply to their group's modes (quant also to serving: vLLM's weight formats), and the web form shows
    every setting once, the ones outside its first fieldsets under their concern's title."""
    import re

    from trainfit.setup.vocab import GROUPS
    from trainfit.web.page import knob_fieldsets

    # (a request's prompt and output lengths: RL's rollouts and serving's load mix, one definition each)
    exceptions = {"quant": ("train", "serve"), "prompt_len": ("rl", "serve"), "completion_len": ("rl", "serve")}
    for s in SETTINGS:
        assert s.meta.group in GROUPS, s.name
        if s.meta.group in ("serve", "rl", "vision", "fine-tune"):
            assert s.meta.modes == exceptions.get(s.name, GROUPS[s.meta.group][1]), (s.name, s.meta.modes)
    html = knob_fieldsets()
    names = re.findall(r'<(?:input|select)[^>]* id="([a-z_0-9]+)"', html)
    assert sorted(names) == sorted(s.name for s in SETTINGS)
    assert "Serving (--mode serve)" in re.findall(r"<legend>([^<]*)", html)


@pytest.mark.parametrize("kw, words", [({"mode": "infer", "grad_accum": 1}, "--grad-accum applies to train/rl only"),
                                       ({"rl_algo": "grpo"}, "--rl-algo applies to rl only")])
def test_the_api_refuses_a_keyword_given_at_its_default_where_it_does_not_apply(kw, words):
    """trainfit.estimate(**settings), like the CLI's written flags: a keyword the mode does not read is refused in one
    line even at its default value (its value alone cannot tell it from one not given); left out, it is fine."""
    import trainfit
    from trainfit.errors import SetupError

    with pytest.raises(SetupError, match=words) as e:
        trainfit.estimate("tiny-llama", **kw)
    assert "\n" not in str(e.value)
    assert trainfit.estimate("tiny-llama", mode=kw.get("mode", "train")).memory.peak > 0


def test_setup_equality_and_hash_are_the_dataclass_fields():
    """Setup.__eq__ / __hash__ read the instance's __dict__ (settings.py): it must hold the fields and nothing else,
    in their order, however the setup was made — so equality is the fields' and equal setups hash alike."""
    import copy
    import dataclasses
    import pickle

    names = [f.name for f in dataclasses.fields(Setup)]
    base = Setup(tp=2, dp=4, sequence_parallel=True, stack="megatron", precision="bf16-master", recompute="selective")
    made = {"init": base, "with_": base.with_(zero=1, batch=3), "keyed": base.keyed((("zero", 2), ("batch", 7))),
            "micro": base.with_micro_batches(5, 2), "copy": copy.copy(base), "pickle": pickle.loads(pickle.dumps(base)),
            "replace": dataclasses.replace(base, grad_accum=4), "copied": base.copied()}
    for how, s in made.items():
        assert list(s.__dict__) == names, how
        fields = tuple(getattr(s, n) for n in names)
        assert hash(s) == hash(fields), how
        twin = Setup(**{n: getattr(s, n) for n in names if dataclasses.fields(Setup)[names.index(n)].init})
        assert (s == twin) == (fields == tuple(getattr(twin, n) for n in names)), how
    assert made["copy"] == base and made["pickle"] == base and made["copied"] == base
    assert made["with_"] != base and made["keyed"] != made["micro"]
    assert (base == "x") is False and base != 1
