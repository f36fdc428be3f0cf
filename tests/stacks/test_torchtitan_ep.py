"""Expert parallelism on --stack torchtitan against torchtitan 0.2.2's own code: its model registry (the MoE
flavors' shapes), its GroupedExperts (the routed experts' parameters), its ParallelDims and device mesh (which
ep / etp layouts it builds, under a fake process group), and its ConfigManager (the emitted job)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from trainfit.api import load_spec
from trainfit.errors import SetupError
from trainfit.analytic.params import count_params
from trainfit.analytic.parallel.expert import split_params
from trainfit.analytic.parallel.expert_memory import dispatch_bytes, sac_saved_all_to_all
from trainfit.analytic.recompute import layer_params
from trainfit.plan import emit, emit_torchtitan
from trainfit.setup import Setup
from trainfit.stacks import get_stack

DSV3_16B = "deepseek-v2-lite"  # torchtitan's deepseek_v3 16B flavor has DeepSeek-V2-Lite's shape


def _torchtitan():
    return pytest.importorskip("torchtitan")


# -- the registry ---------------------------------------------------------------------------------------------
def test_moe_flavors_are_torchtitans_registry():
    """stacks/torchtitan.toml [moe_models] against torchtitan's deepseekv3_args and qwen3_args, and trainfit's catalog
    (HF configs) matched to them: two independent sources that agree."""
    _torchtitan()
    from torchtitan.models.deepseek_v3 import deepseekv3_args
    from torchtitan.models.qwen3 import qwen3_args

    registry = {"deepseek_v3": deepseekv3_args, "qwen3": qwen3_args}
    facts = get_stack("torchtitan").facts["moe_models"]
    for name in registry:
        for flavor, shape in facts[name].items():
            a = registry[name][flavor]
            assert (a.dim, a.n_layers, a.n_heads, a.vocab_size, a.moe_inter_dim, a.moe_args.num_experts,
                    a.moe_args.top_k) == (shape["dim"], shape["n_layers"], shape["n_heads"], shape["vocab_size"],
                                          shape["moe_inter_dim"], shape["num_experts"], shape["top_k"]), flavor
    for model, want in ((DSV3_16B, ("deepseek_v3", "16B")), ("deepseek-v3", ("deepseek_v3", "671B")),
                        ("qwen3-30b-a3b", ("qwen3", "30B-A3B")), ("qwen3-235b-a22b", ("qwen3", "235B-A22B"))):
        assert emit_torchtitan.torchtitan_flavor(load_spec(model))[:2] == want, model
    assert emit_torchtitan.torchtitan_flavor(load_spec("mixtral-8x7b")) is None


# -- parameters on a rank -----------------------------------------------------------------------------------------
def test_routed_experts_split_over_ep_times_etp():
    """One MoE block's parameters a rank holds unsharded: torchtitan's GroupedExperts built for the 16B flavor gives
    the routed experts (w1, w2, w3); ExpertParallel's Shard(0) leaves E/ep of them a rank, ExpertTensorParallel's
    Shard(0) + Shard(1)/(2) E/(ep·etp); the rest of the block is unchanged."""
    _torchtitan()
    import torch
    from torchtitan.models.deepseek_v3 import deepseekv3_args
    from torchtitan.models.moe.moe import GroupedExperts

    a = deepseekv3_args["16B"]
    with torch.device("meta"):
        ex = GroupedExperts(a.dim, a.moe_inter_dim, a.moe_args.num_experts, use_grouped_mm=False)
    routed = sum(p.numel() for p in ex.parameters())
    spec = load_spec(DSV3_16B)
    pc = count_params(spec)
    kw = dict(stack="torchtitan", zero=3, batch=1, seq=4096)
    base = layer_params(spec, pc, Setup(dp=8, **kw), True)
    assert base - layer_params(spec, pc, Setup(dp=8, ep=8, **kw), True) == pytest.approx(routed * (1 - 1 / 8))
    # tp 2: the rest over tp either way; experts over tp without EP, over ep x etp with it
    tp_only = layer_params(spec, pc, Setup(dp=8, tp=2, **kw), True)
    etp = layer_params(spec, pc, Setup(dp=8, tp=2, ep=4, etp=2, **kw), True)
    etp1 = layer_params(spec, pc, Setup(dp=8, tp=2, ep=4, etp=1, **kw), True)
    assert tp_only - etp == pytest.approx(routed / 2 - routed / 8)
    assert tp_only - etp1 == pytest.approx(routed / 2 - routed / 4)


def test_expert_fsdp_moves_only_the_efsdp_share():
    """The experts' FSDP group efsdp = dp·tp/(etp·ep) (parallel_dims.py:136-158) is the expert data-parallel group
    the DP exchange runs them over (parallel/zero.py dp_comm): with ep = dp (efsdp 1) only the dense part moves;
    the rank unshards its E/ep experts. By hand from the 16B flavor's routed experts (64 × 3 × 2048 × 1408 a
    layer, 26 MoE layers)."""
    spec = load_spec(DSV3_16B)
    pc = count_params(spec)
    kw = dict(stack="torchtitan", dp=8, zero=3, batch=1, seq=4096)
    stage = pc.total  # one rank's stage, unsharded (tp 1, pp 1)
    routed = 26 * 64 * 3 * 2048 * 1408
    assert Setup(ep=8, **kw).expert_dp == 1 and Setup(ep=2, **kw).expert_dp == 4
    dense, experts = split_params(spec, pc, Setup(ep=8, **kw), stage, spec.layers)
    assert dense == pytest.approx(stage - routed) and experts == pytest.approx(routed / 8)
    dense2, experts2 = split_params(spec, pc, Setup(ep=2, **kw), stage, spec.layers)
    assert experts2 == pytest.approx(routed / 2)
    # the step's exchange: the experts add nothing over efsdp 1 (ep 8) beside the dense part alone (ep 8 vs a model
    # whose expert share is exchanged over 4 ranks at ep 2)
    from trainfit.analytic.step_time import layout_step_time
    from trainfit.hardware import get_gpu

    gpu = get_gpu("H100-80GB")
    t8 = layout_step_time(spec, Setup(ep=8, **kw), gpu).dp_comm_total
    t2 = layout_step_time(spec, Setup(ep=2, **kw), gpu).dp_comm_total
    assert t8 < t2


def test_dispatch_buffer_is_one_routed_copy_less_the_padding():
    """The all-to-all output beside _permute's copies: tokens·top_k rows of dim in bf16, less the alignment rows
    (TOKEN_GROUP_ALIGN_SIZE_M = 8, models/moe/utils.py:15) of the E − E/ep experts not on the rank."""
    spec = load_spec(DSV3_16B)
    s = Setup(stack="torchtitan", dp=8, zero=3, ep=8, batch=4, seq=4096)
    rows = 4 * 4096 * 6 - (64 - 8) * 8
    assert dispatch_bytes(spec, s, 4 * 4096, 2) == rows * 2048 * 2
    assert dispatch_bytes(spec, Setup(stack="torchtitan", dp=8, zero=3, batch=4, seq=4096), 4 * 4096, 2) == 0


def test_op_sac_stores_deepseeks_all_to_all_outputs():
    """deepseek_v3's per-op SAC save list holds all_to_all_single (its parallelize.py _op_sac_save_list), qwen3's does
    not: under --recompute op each MoE layer of the former stores the dispatch and combine outputs, two
    tokens·top_k × dim bf16 tensors (16B flavor, batch 4 × 4096: 2 × 98,304 × 2048 × 2 bytes)."""
    _torchtitan()
    import torch
    from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list as deepseek
    from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list as qwen3

    a2a = torch.ops._c10d_functional.all_to_all_single.default
    assert a2a in deepseek and a2a not in qwen3
    kw = dict(stack="torchtitan", dp=8, zero=3, ep=8, batch=4, seq=4096)
    assert sac_saved_all_to_all(load_spec(DSV3_16B), Setup(recompute="op", **kw), 4 * 4096, 2) \
        == 2 * 4 * 4096 * 6 * 2048 * 2
    assert sac_saved_all_to_all(load_spec("qwen3-30b-a3b"), Setup(recompute="op", **kw), 4 * 4096, 2) == 0
    assert sac_saved_all_to_all(load_spec(DSV3_16B), Setup(recompute="full", **kw), 4 * 4096, 2) == 0
    # the whole step: the 26 MoE layers' stored outputs are the saved activations' difference from EP 1
    from trainfit.analytic.memory import train_memory

    spec = load_spec(DSV3_16B)
    ep8 = train_memory(spec, Setup(recompute="op", **kw))
    ep1 = train_memory(spec, Setup(recompute="op", **{**kw, "ep": 1}))
    assert ep8.activations - ep1.activations == pytest.approx(26 * 2 * 4 * 4096 * 6 * 2048 * 2, rel=1e-6)


# -- the layouts torchtitan builds ------------------------------------------------------------------------------
LAYOUTS = [  # (dp_shard, tp, ep, etp)
    (8, 1, 8, 1), (8, 1, 4, 1), (8, 1, 3, 1), (8, 1, 16, 1), (8, 2, 16, 1), (8, 2, 4, 2), (8, 2, 8, 2),
    (8, 2, 4, 4), (8, 2, 32, 1), (4, 4, 8, 1), (4, 4, 2, 4), (4, 4, 2, 2),
]

_MESH = """
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.distributed import ParallelDims
out = []
for dp, tp, ep, etp in json.loads(sys.argv[1]):
    dist.init_process_group("fake", rank=0, world_size=dp * tp, store=FakeStore())
    try:
        ParallelDims(dp_replicate=1, dp_shard=dp, cp=1, tp=tp, pp=1, ep=ep, etp=etp, world_size=dp * tp).build_mesh()
        out.append(True)
    except (AssertionError, ValueError, RuntimeError):
        out.append(False)
    dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.heavy  # ~13 s: a child process builds 12 device meshes
def test_layout_rules_are_torchtitans_device_mesh():
    """trainfit refuses exactly the ep/etp layouts torchtitan's ParallelDims and build_mesh refuse (run under torch's
    fake process group, in a child process: the meshes are global state)."""
    _torchtitan()
    r = subprocess.run([sys.executable, "-c", _MESH, json.dumps(LAYOUTS)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    built = json.loads(r.stdout.strip().splitlines()[-1])
    for (dp, tp, ep, etp), ok in zip(LAYOUTS, built):
        try:
            Setup(stack="torchtitan", dp=dp, tp=tp, ep=ep, etp=etp, zero=3, sequence_parallel=tp > 1)
            accepted = True
        except SetupError:
            accepted = False
        assert accepted == ok, (dp, tp, ep, etp)
    assert built.count(True) >= 4 and built.count(False) >= 4  # both kinds exercised


@pytest.mark.parametrize("kw, words", [
    (dict(dp=8, zero=3, etp=1, tp=2, sequence_parallel=True), None),  # torchtitan's default: accepted
    (dict(dp=8, zero=3, etp=2, tp=2, sequence_parallel=True), "no effect without expert parallelism"),
    (dict(dp=8, zero=0, ep=8), "--zero 3"),
])
def test_etp_without_ep_and_ep_without_fsdp(kw, words):
    if words is None:
        Setup(stack="torchtitan", **kw)
        return
    with pytest.raises(SetupError, match=words):
        Setup(stack="torchtitan", **kw)


def test_etp_defaults_to_torchtitans_one_and_megatrons_tp():
    """expert_tensor_parallel_degree = 1 (torchtitan config/job_config.py:464) vs Megatron's etp = tp."""
    assert Setup(stack="torchtitan", dp=4, tp=2, ep=8, zero=3, sequence_parallel=True).expert_tp == 1
    assert Setup(stack="megatron", precision="bf16-master", dp=4, tp=2, ep=4).expert_tp == 2


def test_models_torchtitan_does_not_build_are_refused():
    from trainfit.analytic.stacks import model_named

    with pytest.raises(SetupError, match="mixture of experts"):
        model_named("torchtitan").check_model(load_spec("mixtral-8x7b"), Setup(stack="torchtitan"))
    model_named("torchtitan").check_model(load_spec(DSV3_16B), Setup(stack="torchtitan"))
    with pytest.raises(SetupError, match="grouped"):  # the experts' grouped GEMMs under Float8: not modelled
        model_named("torchtitan").check_model(load_spec(DSV3_16B), Setup(stack="torchtitan", dp=8, zero=3,
                                                                         low_precision="tensorwise"))


# -- the job config ----------------------------------------------------------------------------------------------
def test_emitted_ep_job_parses_with_torchtitans_config_manager(tmp_path):
    """--emit torchtitan for an EP layout: torchtitan's ConfigManager reads back the model, the EP and ETP degrees."""
    _torchtitan()
    from torchtitan.config import ConfigManager

    spec = load_spec(DSV3_16B)
    for kw, etp in ((dict(dp=8, ep=8), 1), (dict(dp=8, tp=2, ep=4, etp=2, sequence_parallel=True), 2)):
        s = Setup(stack="torchtitan", zero=3, batch=4, seq=4096, recompute="op", **kw)
        path = tmp_path / "job.toml"
        path.write_text(emit.emit("torchtitan", s, spec, 8, tokens=1e9))
        cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
        assert (cfg.model.name, cfg.model.flavor) == ("deepseek_v3", "16B")
        p = cfg.parallelism
        assert (p.expert_parallel_degree, p.expert_tensor_parallel_degree) == (s.ep, etp)
        assert (p.data_parallel_shard_degree, p.tensor_parallel_degree) == (s.dp, s.tp)


# -- DeepEP (parallelism.expert_parallel_comm_backend "deepep") ---------------------------------------------------
def test_deepep_backend_is_torchtitans_own_choice():
    """torchtitan 0.2.2's JobConfig takes "standard" or "deepep" (the [moe] dispatchers trainfit lets through:
    alltoall and deepep); its deepseek_v3 model args read the backend into moe_impl, its qwen3 model args have no such
    field (the qwen3 MoE ignores the backend: refused there)."""
    _torchtitan()
    import typing

    from torchtitan.config import JobConfig
    from torchtitan.models.deepseek_v3 import deepseekv3_args
    from torchtitan.models.qwen3 import qwen3_args

    from trainfit.analytic.stacks import model_named

    hints = typing.get_type_hints(type(JobConfig().parallelism))
    assert set(typing.get_args(hints["expert_parallel_comm_backend"])) == {"standard", "deepep"}
    assert get_stack("torchtitan").facts["moe"]["dispatchers"] == ["alltoall", "deepep"]
    job = JobConfig()
    job.parallelism.expert_parallel_comm_backend = "deepep"
    ds = copy.deepcopy(deepseekv3_args["16B"])  # (the registry's own entry left as it is)
    ds.update_from_config(job)
    assert ds.moe_impl == "deepep"
    assert not hasattr(qwen3_args["30B-A3B"], "moe_impl")
    kw = dict(stack="torchtitan", dp=8, zero=3, ep=8, moe_dispatcher="deepep")
    model_named("torchtitan").check_model(load_spec(DSV3_16B), Setup(**kw))
    with pytest.raises(SetupError, match="standard MoE"):
        model_named("torchtitan").check_model(load_spec("qwen3-30b-a3b"), Setup(**kw))


@pytest.mark.parametrize("kw, words", [
    (dict(dp=8, zero=3, ep=8, moe_dispatcher="allgather"), "standard .an all-to-all. or deepep"),
    (dict(dp=8, zero=3, ep=8, moe_dispatcher="hybridep"), "standard .an all-to-all. or deepep"),
    (dict(dp=8, zero=3, tp=2, ep=8, moe_dispatcher="deepep", sequence_parallel=True), "reorderer"),
    (dict(dp=8, zero=3, moe_dispatcher="deepep"), "needs --ep > 1"),
    (dict(dp=8, zero=3, ep=8, moe_dispatcher="deepep", moe_dispatcher_sms=24), "not run by --stack torchtitan"),
])
def test_deepep_layouts_torchtitan_refuses(kw, words):
    with pytest.raises(SetupError, match=words):
        Setup(stack="torchtitan", **kw)


def test_deepep_group_sizes_are_deepeps():
    """DeepEP's Buffer.get_dispatch_config asserts the group size is one of its tuned configs (2 … 160 ranks): an
    EP 256 DeepEP group stops at start-up on either stack; Buffer.set_num_sms asserts an even SM count."""
    Setup(stack="torchtitan", dp=128, zero=3, ep=128, moe_dispatcher="deepep")
    with pytest.raises(SetupError, match="DeepEP runs groups of"):
        Setup(stack="torchtitan", dp=256, zero=3, ep=256, moe_dispatcher="deepep")
    with pytest.raises(SetupError, match="DeepEP runs groups of"):  # Megatron's group is etp × ep
        Setup(stack="megatron", precision="bf16-master", dp=256, tp=2, ep=128, moe_dispatcher="deepep",
              sequence_parallel=True)
    Setup(stack="megatron", precision="bf16-master", dp=256, tp=2, ep=64, moe_dispatcher="deepep",
          sequence_parallel=True)
    with pytest.raises(SetupError, match="even SM count"):
        Setup(stack="megatron", precision="bf16-master", dp=8, ep=8, moe_dispatcher="deepep", moe_dispatcher_sms=21)


def test_deepep_memory_is_counted_as_the_all_to_alls_an_over_count():
    """The planner judges a group's memory once for all its dispatchers (memory.NOT_IN_MEMORY), so DeepEP's buffers
    are counted as the all-to-all's: two tokens·top_k × dim copies stored per MoE layer under --recompute op. DeepEP
    stores fewer (the NB's direction), by hand for DeepSeek-V2-Lite (64 experts, top-6) on 8 ranks at 4 × 4096
    tokens: the dispatch's received rows, one per token and rank reached, 8 × (1 − C(56, 6)/C(64, 6)) ≈ 4.54 a token
    with their int64 indices and fp32 scores, and the combine's one row a token."""
    spec = load_spec(DSV3_16B)
    tokens = 4 * 4096
    kw = dict(stack="torchtitan", dp=8, zero=3, ep=8, batch=4, seq=4096, recompute="op")
    counted = sac_saved_all_to_all(spec, Setup(moe_dispatcher="deepep", **kw), tokens, 2)
    assert counted == sac_saved_all_to_all(spec, Setup(**kw), tokens, 2) == 2 * tokens * 6 * 2048 * 2
    miss = (56 * 55 * 54 * 53 * 52 * 51) / (64 * 63 * 62 * 61 * 60 * 59)
    received = tokens * 8 * (1 - miss)
    deepeps = (received + tokens) * 2048 * 2 + received * 6 * (8 + 4)
    assert 0.45 < deepeps / counted < 0.5  # the over-count: about twice DeepEP's


def test_deepep_sends_each_token_once_per_node_over_rdma():
    """The exchange over 16 ranks on two 8-GPU H100 nodes: the all-to-all sends every top-k copy bound for the other
    node through its NICs (T·k·(8/16) token rows), DeepEP each token once to the other node it reaches
    (T·(1 − C(32, 6)/C(64, 6))·(1/2) rows: the other node missed iff all six experts sit on this one); torchtitan's
    DeepEP runs on its Buffer's default 20 SMs."""
    from trainfit.analytic.parallel.collectives import Links
    from trainfit.analytic.parallel.expert import exchange_seconds, exchange_sms
    from trainfit.hardware import get_gpu

    spec = load_spec(DSV3_16B)
    gpu = get_gpu("H100-80GB")
    kw = dict(stack="torchtitan", dp=16, zero=3, ep=16, batch=4, seq=4096)
    tokens, tb = 4 * 4096, 2048 * 2
    links = Links.of(gpu)
    a2a = exchange_seconds(spec, Setup(**kw), links, tokens, 2)
    deepep = exchange_seconds(spec, Setup(moe_dispatcher="deepep", **kw), links, tokens, 2)
    assert a2a == pytest.approx(tokens * 6 * tb * 8 / 16 / links.inter, rel=1e-9)  # the NIC side is the longer
    miss = (32 * 31 * 30 * 29 * 28 * 27) / (64 * 63 * 62 * 61 * 60 * 59)
    rdma = tokens * tb * 2 * (1 - miss) * (1 / 2) / links.inter
    assert deepep == pytest.approx(rdma, rel=1e-9)  # the RDMA side is the longer: 3x less than the all-to-all's
    assert deepep < a2a / 3
    assert exchange_sms(Setup(moe_dispatcher="deepep", **kw), gpu) == 20


def test_emitted_deepep_job_reads_back(tmp_path):
    """--emit torchtitan writes parallelism.expert_parallel_comm_backend = "deepep"; torchtitan's ConfigManager parses
    it and trainfit's reader (readers/torchtitan.py) gives back the dispatcher."""
    _torchtitan()
    from torchtitan.config import ConfigManager

    from trainfit.readers import read

    spec = load_spec(DSV3_16B)
    s = Setup(stack="torchtitan", dp=8, zero=3, ep=8, batch=4, seq=4096, moe_dispatcher="deepep")
    path = tmp_path / "job.toml"
    path.write_text(emit.emit("torchtitan", s, spec, 8, tokens=1e9))
    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert cfg.parallelism.expert_parallel_comm_backend == "deepep"
    got = read(path, dp=8)
    assert got.values["moe_dispatcher"] == "deepep" and got.values["ep"] == 8
