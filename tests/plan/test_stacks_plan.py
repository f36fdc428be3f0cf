"""The planner searches each stack's own options (stacks/*.toml) and compares stacks in one table: torchtitan's
recompute policies (none, full, op, layer:N), its ZeRO stages (0, 2, 3) and precisions, hf's as before; layouts a
stack cannot run are never planned. Fast (no torch) except where torchtitan's own config types are read."""
from __future__ import annotations

import json
import typing

import pytest

from trainfit.setup import Setup

from trainfit.api import load_spec
from trainfit.errors import TrainfitError
from trainfit.hardware import get_gpu
from trainfit.plan.emit_torchtitan import torchtitan_sections
from trainfit.plan.search import PlanQuery, search
from trainfit.stacks import get_stack


@pytest.fixture(scope="module")
def l8b():
    return load_spec("llama-3.1-8b")


def test_torchtitan_plan_searches_torchtitans_policies(l8b):
    r = search(l8b, get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=8192, stacks=("torchtitan",), top=200))
    searched = r.stats["stacks"]["torchtitan"]
    # stacks/torchtitan.toml: policies none, full, selective (= op), op, layer (every N-th block)
    assert searched["recomputes"] == ["none", "full", "op", "layer:2", "layer:4"]
    assert searched["zeros"] == [0, 2, 3] and searched["precisions"] == ["amp-bf16"]
    assert r.candidates and searched["groups"] > 0
    seen = {c.setup.recompute for c in r.candidates}
    assert {"none", "op", "layer:2"} <= seen  # several policies reach the ranking (one best plan per group)
    for c in r.candidates:
        s = c.setup
        assert s.stack == "torchtitan" and s.zero in (0, 2, 3)
        # torchtitan refuses DDP beside TP/PP and has no mixed precision with TP/PP without FSDP
        assert not (s.zero == 0 and s.dp > 1 and (s.tp > 1 or s.pp > 1))
        assert not (s.zero < 2 and (s.tp > 1 or s.pp > 1))


def test_hf_plan_is_unchanged_by_default(l8b):
    q = PlanQuery(gpus=8)
    assert q.stacks == ("hf",) and q.recomputes_for("hf") == ("none", "full")
    assert q.zeros_for("hf") == (0, 1, 2, 3) and q.precisions_for("hf") == ("amp-bf16", "bf16-master")
    r = search(l8b, get_gpu("H100-80GB"), PlanQuery(gpus=8, seq=4096, global_batch_tokens=2**20))
    assert all(c.setup.stack == "hf" for c in r.candidates)


def test_searched_policies_are_what_torchtitans_config_accepts(l8b):
    """Independent source: torchtitan's own JobConfig types. Every policy the planner searches for torchtitan
    becomes an activation_checkpoint mode/option and a reshard policy that torchtitan's dataclasses declare."""
    jc = pytest.importorskip("torchtitan.config.job_config")
    modes = set(typing.get_args(typing.get_type_hints(jc.ActivationCheckpoint)["mode"]))
    reshard = set(typing.get_args(typing.get_type_hints(jc.Parallelism)["fsdp_reshard_after_forward"]))
    dtypes = set(typing.get_args(typing.get_type_hints(jc.Training)["dtype"]))
    r = search(l8b, get_gpu("H100-80GB"), PlanQuery(gpus=16, seq=8192, stacks=("torchtitan",), top=200,
                                                    precisions=("amp-bf16", "bf16", "fp32")))
    for c in r.candidates:
        sec = torchtitan_sections(c.setup, l8b)
        ac = sec["activation_checkpoint"]
        assert ac["mode"] in modes
        if ac["mode"] == "selective":  # activation_checkpoint.py:177-183: 'op' or a positive integer
            assert ac["selective_ac_option"] == "op" or ac["selective_ac_option"].isdigit()
        assert sec["parallelism"].get("fsdp_reshard_after_forward", "default") in reshard
        assert sec["training"]["dtype"] in dtypes


def test_stacks_compared_in_one_table(l8b, cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    args = ["plan", "llama-3.1-8b", "--gpu", "H100-96GB", "--gpus", "8", "--seq", "8192", "--top", "40"]
    code, out, err = cli(*args, "--stacks", "hf,torchtitan")
    assert code == 0, err
    header = next(line for line in out.splitlines() if "dp×tp×pp" in line)
    assert "stack" in header
    assert "hf: searched" in out and "torchtitan: searched" in out
    code, out, _ = cli(*args, "--stacks", "hf,torchtitan", "--json")
    d = json.loads(out)
    assert {c["setup"]["stack"] for c in d["candidates"]} == {"hf", "torchtitan"}
    assert d["query"]["stacks"] == ["hf", "torchtitan"] and d["gpu"] == "H100-96GB"
    code, out, _ = cli(*args)  # one hf stack: the table as before, no stack column
    assert "stack" not in next(line for line in out.splitlines() if "dp×tp×pp" in line)


def test_op_recompute_time_by_hand(l8b):
    """torchtitan's per-op SAC re-runs every second matmul of a block: wk, wo, w3 — per token and layer
    2·(4096·1024 + 4096·4096 + 4096·14336) FLOPs for Llama-3.1-8B (dim 4096, 8 KV heads of 128, FFN 14336)."""
    per_token_layer = 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)  # wk, wo, w3 (the SDPA output is stored)
    gpu = get_gpu("H100-80GB")
    # under the flat --efficiency override the re-run matmuls' FLOPs are timed at that fraction of the peak (the
    # roofline's op-by-op recompute list: tests/analytic/test_ops.py)
    r = search(l8b, gpu, PlanQuery(gpus=8, seq=4096, stacks=("torchtitan",), recomputes=("op",), zeros=(3,),
                                   tp=1, pp=1, top=1, efficiency=0.6))
    c = r.candidates[0]
    s, tm = c.setup, c.time
    tokens = s.batch * s.seq * s.grad_accum
    want = tokens * 32 * per_token_layer / (gpu.flops_for("bf16") * 0.6)
    assert tm.recompute == pytest.approx(want, rel=1e-12)
    assert c.estimate.flops.recompute == pytest.approx(tokens * 32 * per_token_layer, rel=1e-12)


def test_layer_n_recomputes_every_nth_layer_per_stage(l8b):
    gpu = get_gpu("H100-80GB")
    base = PlanQuery(gpus=8, seq=4096, stacks=("torchtitan",), zeros=(3,), tp=1, pp=1, top=1)
    full = search(l8b, gpu, PlanQuery(**{**base.__dict__, "recomputes": ("full",)})).candidates[0]
    half = search(l8b, gpu, PlanQuery(**{**base.__dict__, "recomputes": ("layer:2",)})).candidates[0]
    per_tok = lambda c: c.estimate.flops.recompute / (c.setup.batch * c.setup.seq * c.setup.grad_accum)  # noqa: E731
    assert per_tok(half) == pytest.approx(per_tok(full) / 2, rel=1e-12)  # 16 of 32 layers re-run whole


@pytest.mark.parametrize("args, words", [
    (["--stack", "nemo"], ["--stacks", "hf, torchtitan, megatron, deepspeed"]),
    (["--stack", "torchtitan", "--zero", "1"], ["--zero", "torchtitan", "0, 2, 3"]),
    (["--stack", "torchtitan", "--recompute", "selective"], ["--recompute selective", "op"]),
    (["--stack", "hf", "--recompute", "op"], ["--recompute", "hf"]),
    (["--stack", "torchtitan", "--optimizer", "sgd"], ["--optimizer sgd", "adam, adamw"]),
    (["--stack", "torchtitan", "--precision", "bf16-master"], ["--precision", "torchtitan", "amp-bf16, bf16, fp32"]),
    (["--stacks", "hf,torchtitan", "--recompute", "layer:0"], ["layer:N", "positive integer"]),
    (["--stack", "torchtitan", "--gpu-memory", "-4"], ["--gpu-memory", "greater than 0"]),
])
def test_bad_stack_options_are_one_line_errors(cli, args, words):
    code, out, err = cli("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--gpus", "8", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_stack_facts_the_plan_reads_are_torchtitans():
    """The facts behind the torchtitan search, checked against torchtitan's own code where it can be imported."""
    st = get_stack("torchtitan")
    assert st.runs_layout(8, 2, 1, 0) and st.runs_layout(4, 2, 1, 2) is None
    assert st.runs_layout(1, 2, 1, 0, "amp-bf16") and st.runs_layout(1, 2, 1, 0, "fp32") is None
    pytest.importorskip("torchtitan")
    import inspect

    from torchtitan.components import optimizer as opt
    from torchtitan.distributed import utils as du
    from torchtitan.models.llama3.infra import parallelize

    src = inspect.getsource(opt.build_optimizers)
    assert '"Adam": torch.optim.Adam' in src and '"AdamW": torch.optim.AdamW' in src and "SGD" not in src
    assert "DDP has not supported > 1D parallelism" in inspect.getsource(parallelize.parallelize_llama)
    amp = inspect.getsource(du.maybe_enable_amp)
    assert "tp_enabled or parallel_dims.pp_enabled" in amp and "nullcontext" in amp


def test_plan_query_errors_are_one_line():
    for kw in (dict(stacks=()), dict(stacks=("hf", "hf")), dict(recomputes=()), dict(zeros=(5,)),
               dict(stacks=("torchtitan",), zeros=(1,))):
        with pytest.raises(TrainfitError) as e:
            PlanQuery(gpus=8, **kw)
        assert "\n" not in str(e.value)


@pytest.mark.heavy  # ~5 s: torchtitan's checkpointed step under the flop counter
def test_recompute_matmul_flops_equal_torchtitans_checkpointing():
    """Independent truth: torchtitan's own apply_ac (distributed/activation_checkpoint.py) on its own Transformer,
    one forward + backward under torch's FlopCounterMode. The extra matmul FLOPs with checkpointing are the
    re-run forward matmuls; trainfit's recompute_per_token (matmul part) must equal them."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    from torch.utils.flop_counter import FlopCounterMode
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed import activation_checkpoint as tac
    from torchtitan.models.llama3 import TransformerModelArgs
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list
    from torchtitan.models.llama3.model.model import Transformer

    from trainfit.analytic.flops import recompute_per_token
    from trainfit.models.hf_config import spec_from_config
    from trainfit.plan.emit_torchtitan import torchtitan_ffn

    args = TransformerModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=128, multiple_of=32,
                                max_seq_len=32)
    ffn = torchtitan_ffn({"dim": 64, "multiple_of": 32})
    spec = spec_from_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "intermediate_size": ffn, "vocab_size": 128, "max_position_embeddings": 32,
                             "tie_word_embeddings": False, "hidden_act": "silu"}, "tt-tiny")
    b, s = 2, 32
    tokens = torch.randint(0, 128, (b, s))

    def matmul_flops(ac: ActivationCheckpoint | None) -> int:
        torch.manual_seed(0)
        model = Transformer(args)
        with torch.no_grad():  # as train.py:256-258 does
            model.init_weights()
        if ac is not None:
            tac._layer_sac_count = 0  # a module-level counter: per process, as in one torchtitan run
            tac.apply_ac(model, ac, op_sac_save_list=_op_sac_save_list)
        with FlopCounterMode(display=False) as fc:
            model(tokens).float().sum().backward()
        counts = fc.get_flop_counts()["Global"]
        return sum(v for k, v in counts.items() if k.__name__.split(".")[0] in ("mm", "addmm", "bmm"))

    # the matmul part of one layer's forward per token: q, k, v, o and the three FFN matrices
    h, kv = spec.hidden, spec.kv_dim
    layer_mm = 2 * (h * spec.q_dim + 2 * h * kv + spec.q_dim * h + 3 * h * ffn)
    base = matmul_flops(None)
    for policy in ("op", "layer:2", "full"):
        mode, option = ("full", "2") if policy == "full" else ("selective", policy.split(":")[-1])
        extra = matmul_flops(ActivationCheckpoint(mode=mode, selective_ac_option=option)) - base
        setup = Setup(stack="torchtitan", recompute=policy, device="cpu", precision="fp32")
        want = recompute_per_token(spec, setup, spec.layers, layer_mm, 0.0) * b * s
        assert extra == want > 0, policy


def test_torchtitan_gpt_oss_plans_keep_to_what_torchtitan_builds():
    """torchtitan's gpt_oss casts its blocks to bf16 whatever training.dtype (torchtitan 0.2.2 models/gpt_oss/model/
    model.py:339-342) and runs no context or pipeline parallelism (model/args.py:181-184, __init__.py:85): the
    stack's rules on the model (analytic/stacks/torchtitan.py check_model) refuse every other group, so no plan may
    hold one — its FSDP2 mixed precision, torchtitan's plan default, is refused in one line naming the fix."""
    spec, gpu = load_spec("gpt-oss-20b"), get_gpu("H100-80GB")
    r = search(spec, gpu, PlanQuery(gpus=8, seq=4096, stacks=("torchtitan",), precisions=("bf16",), top=50))
    assert r.candidates
    assert {(c.setup.precision, c.setup.tp, c.setup.cp, c.setup.pp) for c in r.candidates} == {("bf16", 1, 1, 1)}
    with pytest.raises(TrainfitError, match="--precision bf16"):
        search(spec, gpu, PlanQuery(gpus=8, seq=4096, stacks=("torchtitan",)))
