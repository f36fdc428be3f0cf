"""--mode rl on --dp GPUs (analytic/rl_placement.py): verl's hybrid engine (colocated) and OpenRLHF's split
placement, checked phase by phase against hand derivations on tiny-llama at --dp 2; the refusals."""
import subprocess
import sys

import pytest

from trainfit.api import Request, analytic
from trainfit.errors import SetupError

# tiny-llama (trainfit catalog): hidden 256, 4 layers, 8 query / 2 key-value heads of 32, MLP 688, vocabulary
# 2000, untied head, no biases: q 256², k and v 256 × 64, o 256², the gated MLP 3 × 256 × 688, two norms
LAYER = 2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688 + 2 * 256
PARAMS = 4 * LAYER + 2 * 2000 * 256 + 256  # 3,795,200
FP32 = 4
# --precision amp-bf16 (the default): fp32 weights, AdamW's two fp32 states; the reference in the policy's dtype
# (TRL loads it so; verl's ref.strategy = the actor's); --zero 3 = FSDP full shard over --dp 2
DP = 2
W = PARAMS * FP32 // DP  # one GPU's shard of the policy's weights, and of the reference's
OPT = 2 * PARAMS * FP32 // DP
H100_PCIE_GEN5 = 63.0e9  # PCI-SIG Gen5 x16 line rate per direction, bytes/s
BASE = dict(model="tiny-llama", mode="rl", batch=2, group_size=4, prompt_len=32, completion_len=16, grad_accum=2,
            beta=0.04, gpu="H100-80GB", rollout="vllm", dp=DP, zero=3)


def _est(**kw):
    return analytic(Request(**{**BASE, **kw}))


def test_dp2_colocated_phases_by_hand():
    e = _est()
    m, r = e.memory, e.detail.rl
    assert PARAMS == 3_795_200
    assert r.resident == {"policy": W + OPT, "reference": W}
    engine = r.engine  # the vLLM engine's start-up budget (analytic/serving.py, checked in its own tests)
    assert 0.28 * e.time.gpu_memory < engine <= 0.3 * e.time.gpu_memory
    # verl's rollout_mode without sleep mode: the whole engine (its KV pool too) beside the actor's states, the
    # reference and the one full tensor being streamed: the embedding, 2000 × 256 fp32
    assert m.phases["weight_sync"] == W + OPT + W + engine + 2000 * 256 * FP32
    assert m.phases["generate"] == W + OPT + W + engine
    # the training phases: the engine held (no sleep) beside the policy's FSDP step and the reference
    assert m.phases["backward"] - m.phases["generate"] > 0
    assert m.peak_phase == "backward" and sum(m.at_peak.values()) == m.peak
    # FSDP all-gathers the full parameters to stream them: (dp − 1)/dp of the fp32 weights arrive per GPU
    assert r.placement["sync_bytes"] == PARAMS * FP32 // DP
    assert r.phase_seconds["weight_sync"] == pytest.approx(PARAMS * FP32 / DP / 450e9)  # NVLink4 per direction


def test_dp2_offloads_and_sleep_by_hand():
    e0 = _est()
    e = _est(actor_param_offload=True, actor_optimizer_offload=True, ref_param_offload=True, vllm_sleep_level=1)
    m, r = e.memory, e.detail.rl
    engine = r.engine
    ew = r.serving.weights  # the engine's weights (bf16, vLLM's padded vocabulary)
    graphs = r.serving.cuda_graphs
    assert PARAMS * 2 <= ew < PARAMS * 2 * 1.05
    # generate: everything of the actor and the reference offloaded; only the engine is on the GPU
    assert m.phases["generate"] == engine
    # weight sync: the engine's woken weights and its CUDA graphs (never offloaded, verl perf_tuning.rst:56), the
    # streamed tensor; the actor's parameters are back in host memory by then (fsdp_workers.py:719-721)
    assert m.phases["weight_sync"] == ew + graphs + 2000 * 256 * FP32
    # the training phases: the engine asleep (its CUDA graphs only) instead of its whole budget
    for ph in ("forward_end", "backward", "optimizer_step"):
        assert e0.memory.phases[ph] - m.phases[ph] == engine - graphs + W  # (and the reference offloaded)
    # host memory per GPU: actor parameters + optimizer states + reference + vLLM's level-1 backup of its weights
    host = W + OPT + W + ew
    assert r.placement["host_per_gpu"] == host == e.detail.host_memory
    assert r.placement["host_per_node"] == DP * host  # both GPUs on one node
    # PCIe per step: the actor's parameters loaded 3× (rollout_mode, compute_log_prob for vLLM's old log-probs,
    # update_actor), the optimizer, the reference and the engine's weights once; each there and back
    moved = 3 * W + OPT + W + ew
    assert r.placement["transfers"]["actor_params"] == 3 * W
    assert r.phase_seconds["offload"] == pytest.approx(2 * moved / H100_PCIE_GEN5)
    assert e.time.step_seconds == pytest.approx(sum(r.phase_seconds.values()))


def test_sleep_frees_the_kv_pool_at_the_switch():
    # without sleep mode, the switch to generation holds the KV pool beside the actor: the OOM at the phase switch
    held = _est(vllm_gpu_memory_utilization=0.9)
    slept = _est(vllm_gpu_memory_utilization=0.9, vllm_sleep_level=2)
    kv = held.memory.kv_cache  # the engine's KV pool
    assert kv > 0.8 * held.detail.rl.engine
    assert held.memory.phases["weight_sync"] - slept.memory.phases["weight_sync"] >= kv
    assert slept.detail.host_memory is None  # level 2 keeps no host copy


def test_split_placement_groups():
    e = _est(rl_placement="split", vllm_gpu_memory_utilization=0.9)
    m, r = e.memory, e.detail.rl
    assert r.placement["groups"] == {"actor": DP, "rollout": DP, "reference": DP}
    # the rollout GPUs hold only the engine; the reference GPUs only the reference and its forward
    assert m.phases["generate"] == r.engine
    # the engine's GPUs receive the broadcast into its weights in place: the switch equals generation there
    assert m.peak == m.phases["generate"] == m.phases["weight_sync"]
    assert m.phases["backward"] < 0.01 * r.engine
    # OpenRLHF broadcasts every parameter in bf16 to the engines beside the FSDP gather of the fp32 shards
    assert r.placement["sync_bytes"] == PARAMS * 2 + PARAMS * FP32 // DP


@pytest.mark.parametrize("kw, words", [
    (dict(tp=2), "--tp/--pp/--cp"),
    (dict(rollout="hf", rollout_tp=2), "needs --rollout vllm"),
    (dict(rollout_tp=4), "does not divide --dp 2"),
    (dict(rl_placement="split", actor_param_offload=True), "--actor-param-offload"),
    (dict(rollout="hf", actor_optimizer_offload=True), "--actor-optimizer-offload"),
    (dict(beta=0, ref_param_offload=True), "loads none"),
    (dict(rollout="hf", vllm_sleep_level=1), "vLLM's sleep mode"),
    (dict(rl_placement="split", vllm_sleep_level=2), "nothing shares them"),
    (dict(rollout="hf", rl_placement="split"), "needs --rollout vllm"),
])
def test_refusals(kw, words):
    with pytest.raises(SetupError, match=words):
        Request(**{**BASE, **kw}).setup()


def test_trace_refuses_many_gpus_cli_exit_2():
    r = subprocess.run([sys.executable, "-m", "trainfit.cli", "estimate", "tiny-llama", "--mode", "rl", "--device",
                        "cpu", "--precision", "fp32", "--dp", "2", "--engine", "trace"], capture_output=True, text=True)
    assert r.returncode == 2 and "one process" in r.stderr + r.stdout


def test_rollout_tp_not_dividing_the_heads_is_refused_as_vllm_refuses_it():
    # vLLM's ModelConfig.verify_with_parallel_config: num_attention_heads % tensor_parallel_size == 0. qwen2.5-7b has
    # 28 query heads and 4 key/value heads: an engine of TP 8 (dividing --dp 8) does not start; TP 4 does
    cli = [sys.executable, "-m", "trainfit.cli", "estimate", "qwen2.5-7b", "--mode", "rl", "--rollout", "vllm",
           "--dp", "8", "--zero", "3", "--gpu", "H100-80GB"]
    r = subprocess.run(cli + ["--rollout-tp", "8"], capture_output=True, text=True)
    assert r.returncode == 2 and "--rollout-tp 8 does not divide the 28 attention heads of qwen2.5-7b" in r.stderr
    assert "Traceback" not in r.stderr
    assert subprocess.run(cli + ["--rollout-tp", "4"], capture_output=True, text=True).returncode == 0


def test_engine_without_kv_cache_refused():
    # verl's rule (docs/perf/best_practices.rst:126): memory × gpu_memory_utilization × TP > 2 × parameters. 0.15 of
    # an H100's 79.2 GiB is 11.9 GiB < qwen2.5-7b's 15.2 GB of bf16 weights: vLLM raises at start
    with pytest.raises(SetupError, match="no KV cache"):
        analytic(Request(model="qwen2.5-7b", mode="rl", gpu="H100-80GB", rollout="vllm",
                         vllm_gpu_memory_utilization=0.15))
    # TP 2 halves the weights per GPU (7.6 GB < 11.9 GiB): it starts
    e = analytic(Request(model="qwen2.5-7b", mode="rl", gpu="H100-80GB", rollout="vllm", dp=2, zero=3,
                         rollout_tp=2, vllm_gpu_memory_utilization=0.15))
    assert e.detail.rl.serving.kv_blocks > 0


def test_fsdp_generation_gathers_layers_by_hand():
    # HF generation under --zero 3: TRL unshards the root only (summon_full_params(recurse=False)); each layer's
    # forward all-gathers its parameters, the next prefetched: the root (embedding, final norm, untied head) and two
    # layers, in FSDP2's bf16 param_dtype under amp-bf16. The rest of the phase is --zero 2's (no gather).
    kw = dict(rollout="hf")
    z3, z2 = _est(**kw), _est(zero=2, **kw)
    gen2 = z2.memory.phases["generate"] - sum(z2.detail.rl.resident.values())
    gen3 = z3.memory.phases["generate"] - sum(z3.detail.rl.resident.values())
    root = 2 * 2000 * 256 + 256
    assert gen3 - gen2 == (root + 2 * LAYER) * 2


def test_a_split_placement_is_not_called_colocated_or_verls_hybrid_engine(cli):
    """Under --rl-placement split the notes said 'phases as verl's hybrid engine runs them' and the table's row
    'KV pool (colocated vLLM)', beside the note that the rollout runs on its own GPUs."""
    base = ("estimate", "qwen2.5-7b", "--mode", "rl", "--rollout", "vllm", "--dp", "8", "--gpu", "H100-80GB")
    code, out, _ = cli(*base, "--rl-placement", "split")
    assert code == 0 and "KV pool (split vLLM)" in out and "hybrid engine runs them" not in out
    assert "colocated vLLM" not in out and "phases of the split placement" in out
    code, out, _ = cli(*base)
    assert code == 0 and "KV pool (colocated vLLM)" in out and "hybrid engine runs them" in out
