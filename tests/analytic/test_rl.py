"""--mode rl (analytic/rl.py): the 7B GRPO step of issue 16 checked against hand derivations, the phases, the
refusals; the tiny CPU step's trace against its real CPU measurement (heavy tier)."""
import json
import subprocess
import sys

import pytest

from trainfit.api import Request, analytic
from trainfit.errors import SetupError

# qwen2.5-7b's config.json (Qwen/Qwen2.5-7B): hidden 3584, 28 layers, 28 query / 4 key-value heads of 128,
# MLP 18944, vocabulary 152064, q/k/v biases, untied head
H, LAYERS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 3584, 28, 4, 128, 18944, 152064
LAYER = (H * H + H) + 2 * (H * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM) + H * H + 3 * H * MLP + 2 * H
PARAMS = LAYERS * LAYER + 2 * VOCAB * H + H  # 7,615,616,512 (the model card's "7.61B")
GIB = 2**30
ISSUE = dict(mode="rl", rl_algo="grpo", group_size=8, prompt_len=1024, completion_len=4096, gpu="H100-80GB")


def test_7b_grpo_kv_cache_and_weights_by_hand():
    # pure bf16 (2 bytes a value, Adam's states in bf16 too), a reference model (beta > 0), 8 micro-batches
    e = analytic(Request(model="qwen2.5-7b", precision="bf16", beta=0.04, grad_accum=8, recompute="full", **ISSUE))
    m = e.memory
    assert PARAMS == 7_615_616_512
    # the rollout's cache: 8 completions × (1024 + 4096 − 1) tokens (the last token is sampled, never cached),
    # k and v of every layer's key-value heads
    kv = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2 * 8 * (1024 + 4096 - 1)
    assert m.kv_cache == kv  # 2.93 GiB
    # policy + reference weights in bf16; Adam's two states in the weights' dtype
    assert m.weights == 2 * PARAMS * 2
    assert m.optimizer_states == 2 * PARAMS * 2
    # generate: both models, the optimizer's states (the gradients were freed by zero_grad), the cache, and the
    # generation's own transient (one layer's prefill activations, the last-position logits): under 2 %
    resident = 2 * PARAMS * 2 + 2 * PARAMS * 2 + kv
    assert 0 < m.phases["generate"] - resident < 0.02 * m.phases["generate"]
    assert e.detail.rl.micro_batch == 1 and e.detail.rl.completions == 8


def test_7b_grpo_phases_and_peak():
    e = analytic(Request(model="qwen2.5-7b", beta=0.04, **ISSUE))
    m = e.memory
    # TRL's order: generate, score (the reference's log-probs), the policy's step
    assert list(m.phases) == ["generate", "score", "forward_end", "backward", "optimizer_step"]
    # one micro-batch of 8 × 5120 tokens without recompute: the backward of the training step is the peak, far
    # beyond an 80 GB GPU (the activations alone: hundreds of GiB)
    assert m.peak_phase == "backward" and m.peak == max(m.phases.values())
    assert m.activations > 200 * GIB and not e.time.fits
    assert sum(m.at_peak.values()) == m.peak
    # TRL's default beta 0 loads no reference: no score phase, one model's weights less
    e0 = analytic(Request(model="qwen2.5-7b", **ISSUE))
    assert "score" not in e0.memory.phases
    assert e.memory.weights - e0.memory.weights == PARAMS * 4  # amp-bf16: fp32 weights (TRL's default dtype)
    # time: generation is decode-bound (4096 steps), the largest phase here
    secs = e.detail.rl.phase_seconds
    assert secs["generate"] > secs["train"] > 0 and e.time.step_seconds == pytest.approx(sum(secs.values()))


def test_vllm_rollout_holds_its_fraction_through_every_phase():
    hf = analytic(Request(model="qwen2.5-7b", grad_accum=8, recompute="full", **ISSUE))
    v = analytic(Request(model="qwen2.5-7b", grad_accum=8, recompute="full", rollout="vllm",
                         vllm_gpu_memory_utilization=0.3, **ISSUE))
    engine = v.detail.rl.engine
    # the engine's budget: 0.3 of the GPU's memory, less its rounding into whole KV blocks
    assert 0.28 * v.time.gpu_memory < engine <= 0.3 * v.time.gpu_memory
    # the training phases carry it beside the same policy step (and the policy's old log-probs are kept)
    for ph in ("forward_end", "backward", "optimizer_step"):
        assert v.memory.phases[ph] - hf.memory.phases[ph] == pytest.approx(engine, rel=1e-4)


def test_ppo_critic_step_and_reward_model():
    e = analytic(Request(model="qwen2.5-7b", rl_algo="ppo", critic_model="qwen2.5-0.5b",
                         reward_model="qwen2.5-0.5b", grad_accum=8, recompute="full",
                         **{k: v for k, v in ISSUE.items() if k != "rl_algo"}))
    assert "critic_step" in e.memory.phases and e.detail.rl.scored_by == ["policy", "reward", "critic"]
    assert e.detail.rl.models == {"policy": "qwen2.5-7b", "reward": "qwen2.5-0.5b", "critic": "qwen2.5-0.5b"}



def test_reward_model_in_its_checkpoint_dtype_with_one_output():
    # TRL loads it with AutoModelForSequenceClassification.from_pretrained(num_labels=1) and no dtype: the
    # checkpoint's bf16. qwen2.5-1.5b by hand: hidden 1536, 28 layers, 2 kv heads of 128, MLP 8960, vocabulary
    # 151936, tied embeddings; the score head 1536 × 1 replaces the LM head
    h, layers, kv, d, mlp, vocab = 1536, 28, 2, 128, 8960, 151936
    layer = (h * h + h) + 2 * (h * kv * d + kv * d) + h * h + 3 * h * mlp + 2 * h
    params = layers * layer + vocab * h + h + h * 1
    e = analytic(Request(model="qwen2.5-7b", reward_model="qwen2.5-1.5b", **ISSUE))
    assert e.detail.rl.resident["reward"] == params * 2


@pytest.mark.parametrize("kw, words", [
    (dict(critic_model="qwen2.5-0.5b"), "--critic-model"),
    (dict(grad_accum=3), "--grad-accum 3"),
    (dict(vllm_gpu_memory_utilization=0.5), "--rollout vllm"),
    (dict(tp=2), "--tp/--pp/--cp"),
    (dict(seq=100), "--seq does not apply"),
    (dict(rollout="vllm", device="cpu"), "GPU engine"),
])
def test_refusals(kw, words):
    with pytest.raises(SetupError, match=words):
        Request(model="qwen2.5-0.5b", mode="rl", **kw).setup()


def test_rl_settings_refused_elsewhere_cli_exit_2():
    r = subprocess.run([sys.executable, "-m", "trainfit.cli", "estimate", "qwen2.5-0.5b", "--group-size", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--group-size applies to rl only" in r.stderr + r.stdout


def test_ppo_with_lora_is_refused_naming_the_critic():
    # the critic (a token-classification value model) would train the adapters too, which the analytic engine does
    # not model; the line said "llama-3.1-8b is not one [a Llama-style causal LM]: use --engine trace or measure",
    # neither true: the policy is one, and those engines run GRPO only
    r = subprocess.run([sys.executable, "-m", "trainfit.cli", "estimate", "llama-3.1-8b", "--mode", "rl", "--rl-algo",
                        "ppo", "--lora-rank", "16", "--gpu", "H100-80GB"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--lora-rank with --rl-algo ppo" in r.stderr and "critic" in r.stderr
    assert "is not one" not in r.stderr and "use --engine trace or measure" not in r.stderr


def test_cli_json_has_the_phases():
    r = subprocess.run([sys.executable, "-m", "trainfit.cli", "estimate", "qwen2.5-7b", "--mode", "rl", "--group-size",
                        "8", "--prompt-len", "1024", "--completion-len", "4096", "--gpu", "H100-80GB", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    d = d[0] if isinstance(d, list) else d
    assert d["mode"] == "rl" and d["memory"]["peak_phase"] == "backward"
    assert d["rl"]["completions"] == 8 and "generate" in d["memory"]["phases"]


@pytest.mark.heavy
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
def test_tiny_rl_step_trace_equals_cpu_measurement(precision):
    """The minimal GRPO step (step/grpo.py) on tiny-llama: traced on fake tensors and measured on this CPU, per
    phase (trace within 0.01 %: the recorder and c10 see the same storages); the analytic phases within 0.3 % of
    the trace (at most 0.19 % measured: docs/benchmarks/models.md)."""
    from trainfit.analytic.rl import rl_memory
    from trainfit.api import load_spec
    from trainfit.measure.rl import measure_rl
    from trainfit.setup import Setup
    from trainfit.trace.rl import trace_rl

    spec = load_spec("tiny-llama")
    s = Setup(mode="rl", device="cpu", precision=precision, batch=1, group_size=2, prompt_len=16, completion_len=4,
              grad_accum=2, beta=0.04)
    an, _, _ = trace_rl(spec, s)
    peak, phase, measured = measure_rl(spec, s)
    model = rl_memory(spec, s)
    assert set(measured) == set(an.phases) == set(model.phases)
    assert phase == an.peak_phase
    for name, real in measured.items():
        assert an.phases[name] == pytest.approx(real, rel=1e-4), name
        assert model.phases[name] == pytest.approx(an.phases[name], rel=0.003), name
