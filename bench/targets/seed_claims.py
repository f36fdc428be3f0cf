"""The seeds' quantitative claims (../shared/seeds/), each checked with trainfit: docs/seed-claims.md.

    python -m bench run seed_claims            # rewrites docs/seed-claims.md
    python -m bench run seed_claims --check    # exits 1 if the committed file differs (tests/bench/test_seed_claims.py)

Each claim gets the trainfit command that answers it, the numbers trainfit prints, and a verdict computed from
them: holds (inside the claim's range), wrong by N× (outside it), depends on X (true for one setting, not another),
or not modelled yet (trainfit cannot answer it: why). Published figures, where they exist, are quoted beside the
verdict with their source; nothing here is fitted to them.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from bench import ROOT
from bench.figures import record
from trainfit import api
from trainfit.analytic.params import count_params
from trainfit.models.resolve import load_model

ABOUT = {"summary": "the seeds' quantitative claims checked with trainfit (docs/seed-claims.md)",
         "minutes": 1, "quick": None}

GiB = 2**30
DOC = ROOT / "docs" / "seed-claims.md"


@dataclass(frozen=True)
class Claim:
    seed: str
    quote: str
    commands: tuple[str, ...]
    check: Callable[[], tuple[str, str]]  # -> (what trainfit says, verdict)


def est(model: str, **kw):
    return api.estimate(model, **kw)


def gib(x: float) -> str:
    return f"{x / GiB:,.1f} GiB"


def within(value: float, low: float, high: float, what: str = "") -> str:
    if low <= value <= high:
        return "holds"
    factor = low / value if value < low else value / high
    return f"wrong by {factor:.1f}× ({'below' if value < low else 'above'} the claim{what})"


# ---- the claims --------------------------------------------------------------------------------------------------

def backward_twice_forward():
    e = est("llama-3.1-8b", batch=1, seq=2048)
    r = e.flops.backward / e.flops.forward
    full = est("llama-3.1-8b", batch=1, seq=2048, recompute="full")
    step = full.flops.step / full.flops.forward
    return (f"backward / forward FLOPs = {r:.2f}; a step = {e.flops.step / e.flops.forward:.2f}× the forward, "
            f"{step:.2f}× with full recompute"), within(r, 1.9, 2.1) + f" (a recomputed forward makes the step {step:.1f}×)"


def adam_two_or_three_models():
    out, ratios = [], []
    for p in ("amp-bf16", "bf16-master", "bf16"):
        e = est("llama-3.1-8b", precision=p)
        m = e.memory
        extra = m.optimizer_states + m.master_weights
        r = extra / m.weights
        ratios.append(r)
        out.append(f"{p}: states{' + fp32 master' if m.master_weights else ''} {gib(extra)} = {r:.1f}× the weights")
    if all(2 <= r <= 3 for r in ratios):
        return "; ".join(out), "holds"
    return "; ".join(out), ("depends on the precision: " + ", ".join(
        f"{p} {within(r, 2, 3)}" for p, r in zip(("amp-bf16", "bf16-master", "bf16"), ratios)))


def deepseek_61_layers():
    spec = load_model("deepseek-v3")
    return f"deepseek-v3: {spec.layers} decoder layers", within(spec.layers, 61, 61)


def all_layers_vs_one():
    t = est("llama-3.1-8b", batch=1, seq=2048)
    i = est("llama-3.1-8b", batch=1, seq=2048, mode="infer")
    r = t.memory.activations / i.memory.activations
    return (f"training saves {gib(t.memory.activations)} for backward; inference's largest transient "
            f"(one layer) is {gib(i.memory.activations)}: {r:.0f}× for 32 layers"), \
        "holds" if r >= 32 else f"wrong: only {r:.0f}× for 32 layers"


def accumulation_equivalent():
    a = est("llama-3.1-8b", batch=8, seq=2048, precision="bf16-master", recompute="full")
    b = est("llama-3.1-8b", batch=1, seq=2048, grad_accum=8, precision="bf16-master", recompute="full")
    same = abs(a.memory.peak - b.memory.peak) <= 0.01 * a.memory.peak
    return (f"batch 8: peak {gib(a.memory.peak)} ({a.memory.peak_phase}), activations {gib(a.memory.activations)}; "
            f"batch 1 × accumulation 8 (same tokens per step): {gib(b.memory.peak)} ({b.memory.peak_phase}), "
            f"activations {gib(b.memory.activations)}"), \
        ("holds: the same step, and here the same peak (the optimizer step's)" if same else
         "holds for the step; the micro-batch sets the activation memory and so the peak")


def batch_orders_of_magnitude():
    small = est("llama-3.2-1b", batch=1, seq=2048)
    big = est("llama-3.2-1b", batch=64, seq=2048)
    r = big.memory.peak / small.memory.peak
    return (f"llama-3.2-1b, seq 2048: micro-batch 1 peaks at {gib(small.memory.peak)}, 64 at "
            f"{gib(big.memory.peak)} ({r:.1f}×)"), \
        f"wrong by {100 / r:.0f}× for two orders of magnitude at a 64× batch: the model states do not grow; activations do, linearly"


def train_vs_infer_memory():
    t = est("llama-3.1-8b", batch=8, seq=2048, precision="bf16-master")
    i = est("llama-3.1-8b", batch=8, seq=2048, mode="infer")
    r = t.memory.peak / i.memory.peak
    return (f"llama-3.1-8b, batch 8 × 2048: training (bf16-master AdamW) {gib(t.memory.peak)}, inference (bf16) "
            f"{gib(i.memory.peak)}: {r:.1f}×"), within(r, 3, 4)


def compute_three_times():
    e = est("llama-3.1-8b", batch=1, seq=2048)
    r = e.flops.step / e.flops.forward
    return f"training step / inference forward FLOPs = {r:.2f}", within(r, 2.9, 3.1)


def memory_table():
    e = est("llama-3.1-8b", batch=8, seq=2048, precision="bf16-master")
    m = e.memory
    w = m.weights
    acts, grads, opt = m.activations / w, m.gradients / w, (m.optimizer_states + m.master_weights) / w
    total = m.peak / w
    return (f"llama-3.1-8b, bf16-master AdamW, batch 8 × 2048, weights X = {gib(w)}: activations {acts:.1f}X, "
            f"gradients {grads:.1f}X, optimizer + master {opt:.1f}X, peak {total:.1f}X"), \
        (f"depends: activations {within(acts, 2, 5)}; optimizer {within(opt, 1, 2)} (fp32 states and master are 6X "
         f"16-bit weights); total {within(total, 5, 10)}")


def gpt3_memory():
    e = est("gpt-3-175b", batch=1, seq=2048, precision="bf16-master", recompute="full")
    m = e.memory
    states = m.weights + m.gradients + m.optimizer_states + m.master_weights
    gpus = states / (80e9)
    return (f"gpt-3-175b, bf16-master AdamW: weights + gradients + master + states = {states / 1e12:.2f} TB before "
            f"activations; {gpus:.0f} H100-80GB to hold them sharded"), \
        within(states / 1e12, 1, 2, " of 1-2 TB") + "; against §5's 5 TB: " + within(states / 1e12, 5, 5, " of 5 TB")


def bert_params():
    n = [count_params(load_model(name)).total for name in ("bert-base", "bert-large")]
    verdicts = {within(x, 105e6, 345e6) for x in n}
    return f"bert-base: {n[0] / 1e6:.0f}M, bert-large: {n[1] / 1e6:.0f}M (BERT paper: 110M / 340M)", \
        verdicts.pop() if len(verdicts) == 1 else "; ".join(sorted(verdicts))


def bert_memory():
    peaks = [est("bert-large", batch=b, seq=512, precision="amp-fp16", head="masked-lm").memory.peak
             for b in (256, 1024)]
    said = (f"bert-large, MLM, × 512 tokens, amp-fp16 AdamW, one replica: peak {gib(peaks[0])} at batch 256, "
            f"{gib(peaks[1])} at 1024")
    verdicts = [within(p / 1e9, 256, 1e12, " of 256 GB+") for p in peaks]
    if verdicts[0] == verdicts[1]:
        return said, verdicts[0]
    return said, f"depends on the batch: at 256 {verdicts[0]}; at 1024 {verdicts[1]}"


def linear_in_batch():
    p = [est("llama-3.2-1b", batch=b, seq=2048).memory.peak for b in (1, 2, 4, 8)]
    slope = (p[3] - p[0]) / 7
    base = p[0] - slope
    affine = all(abs(x - (base + b * slope)) <= 0.02 * x for x, b in zip(p, (1, 2, 4, 8)))
    return (f"llama-3.2-1b, seq 2048: peaks {', '.join(gib(x) for x in p)} at batch 1, 2, 4, 8: "
            f"{gib(slope)} per sequence on a {gib(base)} base"), \
        ("depends: affine, not proportional — halving the batch halves the activations, not the model states"
         if affine and base > 0.1 * p[0] else "holds" if affine else "wrong: not linear in the batch")


def infer_less_than_train():
    out, savings = [], []
    for name in ("llama-3.2-1b", "llama-3.1-8b"):
        t = est(name, batch=4, seq=2048)
        i = est(name, batch=4, seq=2048, mode="infer")
        s = 1 - i.memory.peak / t.memory.peak
        savings.append(s)
        out.append(f"{name}: inference {gib(i.memory.peak)} vs training {gib(t.memory.peak)} ({s:.0%} less)")
    # 50-70 % less = training is 2-3.3× inference
    return "; ".join(out), "; ".join(f"training = {1 / (1 - s):.1f}× inference: "
                                     f"{within(1 / (1 - s), 2, 1 / 0.3, ' of 2-3.3×, i.e. 50-70 % less')}"
                                     for s in savings)


def quadratic_in_sequence():
    a, b = (est("llama-3.2-1b", batch=1, seq=s, attention="sdpa") for s in (2048, 4096))
    c, d = (est("llama-3.2-1b", batch=1, seq=s, attention="eager") for s in (2048, 4096))
    flash, eager = b.memory.activations / a.memory.activations, d.memory.activations / c.memory.activations
    return (f"saved activations 2048 → 4096 tokens: flash/SDPA ×{flash:.2f}, eager ×{eager:.2f} (linear: ×2, "
            f"quadratic: ×4)"), \
        (f"depends on the attention kernel: {'linear' if flash <= 2.2 else 'super-linear'} with SDPA, "
         f"{'partly quadratic' if eager > 2.2 else 'linear'} with eager attention (its s×s scores)")


def short_sequences_negligible():
    out, share = [], []
    for s in (512, 2048, 8192):
        e = est("llama-3.1-8b", batch=1, seq=s, precision="bf16-master")
        share.append(e.memory.activations / e.memory.peak)
        out.append(f"seq {s}: activations {share[-1]:.0%} of the peak")
    ok = share[0] < 0.05 and share[2] > 0.2
    return "; ".join(out), "holds" if ok else "wrong: " + ", ".join(f"{x:.0%}" for x in share)


# LLaMA (Touvron et al. 2023a, arXiv:2302.13971) §2.4: the 65B model "processes around 380 tokens/sec/GPU on 2048
# A100 GPU with 80GB of RAM", 1.4T tokens in ~21 days; Table 15: 1,022,362 GPU-hours, 449 MWh (= GPU-hours x 400 W x
# PUE 1.1, the paper's own assumption, not a measurement). The paper names model and sequence parallelism
# (Korthikanti et al.) and checkpointing that keeps the linear layers' outputs, but not the degrees: the layout below
# (TP 8 with sequence parallelism, 256 data-parallel replicas, a sharded optimizer, 1 x 8 sequences of 2,048 per
# replica = 4.2M tokens per step) is assumed. NB: their hand-written backward recomputes the cheap elementwise ops,
# which --recompute none does not: the real step saves less and computes a little more.
LLAMA1_GPU_HOURS = 1_022_362
LLAMA1_LAYOUT = dict(batch=1, seq=2048, grad_accum=8, tp=8, sequence_parallel=True, dp=256, zero=1,
                     precision="bf16-master", gpu="A100-80GB", tokens=1.4e12)


def llama1_steps():
    e = est("llama-1-65b", **LLAMA1_LAYOUT)
    t = e.time
    steps = 1.4e12 / (2048 * 2048)
    tok_s = e.setup.batch * e.setup.grad_accum * e.setup.seq / (t.step_seconds * 8)  # per GPU of one TP group
    err = t.gpu_hours / LLAMA1_GPU_HOURS - 1
    return (f"2,048 × 2,048-token sequences (4.2M tokens) over 1.4T tokens = {steps:,.0f} optimizer steps; llama-1-65b "
            f"on 2,048 A100-80GB (assumed layout: TP 8 + sequence parallel, DP 256, ZeRO-1): {gib(e.memory.device_total)}"
            f" per GPU ({'fits' if t.fits else 'does not fit'}), {tok_s:,.0f} tokens/s/GPU, "
            f"{t.train_seconds / 86400:.1f} days, {t.gpu_hours / 1e6:.2f}M GPU-hours, "
            f"{t.energy_kwh / 1e3:,.0f} MWh at {t.average_power_watts:,.0f} W per board"), \
        (f"{'holds' if abs(err) <= 0.15 else f'wrong by {err:+.0%}'}: the paper's 380 tokens/s/GPU, ~21 days, "
         f"{LLAMA1_GPU_HOURS / 1e6:.2f}M GPU-hours (Touvron et al. "
         f"2023a §2.4, Table 15): GPU-hours {err:+.0%} at the assumed layout; its 449 MWh assume 400 W per GPU and "
         "PUE 1.1")


def deepseek_batch():
    e = est("deepseek-v3", batch=1, seq=4096, precision="bf16-master", recompute="full")
    steps = 14.8e12 / 60e6
    return (f"60M-token batches over 14.8T tokens = {steps:,.0f} optimizer steps; one 4,096-token sequence of "
            f"deepseek-v3 trains with {gib(e.memory.activations)} of saved activations (full recompute) beside "
            f"{e.memory.weights / 1e9:,.0f} GB of bf16 weights; the paper's 2.788M H800 GPU-hours use FP8, DualPipe "
            "and 64-way expert parallelism"), \
        "not checked: H800 and DeepSeek's FP8/DualPipe/EP layout are not trainfit settings"


def resnet50():
    out, fits = [], []
    for batch, gpu in ((256, "V100-16GB"), (512, "V100-32GB")):
        e = est("resnet-50", batch=batch, precision="amp-fp16", optimizer="momentum", gpu=gpu)
        out.append(f"batch {batch} (amp-fp16, momentum): peak {gib(e.memory.peak)}, device total "
                   f"{gib(e.memory.device_total)} on a {gpu}: {'fits' if e.time.fits else 'does not fit'}")
        fits.append(e.time.fits)
    params = e.params
    return (f"resnet-50 has {params:,} parameters (transformers' ResNetForImageClassification = torchvision's "
            "resnet50); " + "; ".join(out)), \
        (f"parameters: {within(params, 100e6, 100e6, ' of 100M')}; memory: "
         + ("holds (batch 256 fits a 16 GB card, 512 a 32 GB one)" if all(fits)
            else "wrong: " + ", ".join("fits" if f else "does not fit" for f in fits)))


def energy_per_iteration():
    e = est("llama-3.1-8b", batch=8, seq=2048, precision="bf16-master", recompute="full", dp=8, zero=3,
            gpu="H100-80GB", tokens=1e9)
    t = e.time
    joules = t.average_power_watts * t.step_seconds * 8
    return (f"llama-3.1-8b on 8 H100-80GB (ZeRO-3, batch 8 × 2048 each): {t.average_power_watts:,.0f} W per board "
            f"at the achieved utilisation × {t.step_seconds:.2f} s × 8 = {joules / 1e3:,.1f} kJ per step, "
            f"{joules / (8 * 8 * 2048):.2f} J per token; {t.energy_kwh:,.0f} kWh for 1B tokens"), \
        "holds (measurable: trainfit prints it; the power model and its assumption are docs/benchmarks/published-time.md)"


def sag_memory():
    n = count_params(load_model("llama-3.2-1b")).total
    examples = 1_000_000
    return (f"SAG keeps the last gradient of every training example: llama-3.2-1b ({n / 1e9:.2f}B parameters) × "
            f"fp32 × {examples:,} examples = {n * 4 * examples / 1e15:,.1f} PB"), \
        within(n * 4 * examples / 1e12, 0, 80 * 8 / 1e3, " of one 8-GPU node's memory") + \
        " for a network: its memory grows with the data set, not the batch"


RL_7B = dict(mode="rl", rl_algo="grpo", group_size=8, prompt_len=1024, completion_len=4096, gpu="H100-80GB",
             precision="bf16", beta=0.04, grad_accum=8, recompute="full")


def rl_rollouts():
    e = est("qwen2.5-7b", **RL_7B)
    secs = e.detail.rl.phase_seconds
    share = secs["generate"] / sum(secs.values())
    kv = e.detail.rl.rollout_records["kv_bytes_per_token"] * 8 * (1024 + 4096)
    return (f"qwen2.5-7b GRPO on one H100-80GB (8 completions of 4,096 tokens per 1,024-token prompt, bf16, "
            f"reference model, full recompute): generate {secs['generate']:.1f} s, score {secs['score']:.1f} s, "
            f"train {secs['train']:.1f} s per step ({share:.0%} generating); the rollout's KV cache "
            f"{gib(kv)}, peak {gib(e.memory.peak)} at {e.memory.peak_phase}"), \
        ("holds: " if share >= 0.5 else "depends: ") + f"{share:.0%} of the step is generation (decode-bound, one " \
        "token per step per sequence); the memory peak stays in training"


CLAIMS = [
    Claim("000", "computation for training double because of the backward pass / backwards pass (~2x inference cost)",
          ("trainfit estimate llama-3.1-8b --seq 2048 --json", "... --recompute full --json"), backward_twice_forward),
    Claim("000", "Optimizer like ADAM adds only two or three model-sized overhead",
          ("trainfit estimate llama-3.1-8b --precision amp-bf16|bf16-master|bf16 --json",), adam_two_or_three_models),
    Claim("000", "you need all of them (61 for Deepseek models) kept in RAM", ("trainfit models --json",),
          deepseek_61_layers),
    Claim("000", "you need only one hidden layer kept in RAM for inference, but you need all of them",
          ("trainfit compare llama-3.1-8b --batch 1 --seq 2048",), all_layers_vs_one),
    Claim("000", "Microbatch size ... can be set to 1 ... With gradient accumulation it's equivalent",
          ("trainfit estimate llama-3.1-8b --batch 8 --precision bf16-master --recompute full",
           "trainfit estimate llama-3.1-8b --batch 1 --grad-accum 8 --precision bf16-master --recompute full"),
          accumulation_equivalent),
    Claim("000", "Training is also done over batches, which increase memory requirements by several orders of magnitude",
          ("trainfit estimate llama-3.2-1b --batch 1|64 --seq 2048",), batch_orders_of_magnitude),
    Claim("000", "Training now involves large amounts of inference for RL rollouts",
          ("trainfit estimate qwen2.5-7b --mode rl --rl-algo grpo --group-size 8 --prompt-len 1024 --completion-len "
           "4096 --precision bf16 --beta 0.04 --grad-accum 8 --recompute full --gpu H100-80GB",), rl_rollouts),
    Claim("000", "use something like Stochastic Average Gradient Descent (memory for a network)",
          ("trainfit models --json",), sag_memory),
    Claim("001", "Training needs 3-4x more memory (activations for backward pass)",
          ("trainfit compare llama-3.1-8b --batch 8 --seq 2048 --precision bf16-master",), train_vs_infer_memory),
    Claim("001", "Compute: Training is 3x compute (forward + 2 gradient computations)",
          ("trainfit estimate llama-3.1-8b --json",), compute_three_times),
    Claim("001", "Forward activations 2-5X, gradients X, optimizer 1-2X, total 5-10X the model size",
          ("trainfit estimate llama-3.1-8b --batch 8 --seq 2048 --precision bf16-master",), memory_table),
    Claim("001", "Training GPT-3 (175B parameters) requires 1-2TB of GPU memory (H100 has 80GB, needs ~20 GPUs)",
          ("trainfit estimate gpt-3-175b --precision bf16-master --recompute full",), gpt3_memory),
    Claim("001", "ResNet-50: model size 100M parameters; batch 256-512; memory 16-32GB (1 GPU)", ("trainfit estimate resnet-50 --batch 256 --precision amp-fp16 --optimizer momentum --gpu V100-16GB",
           "... --batch 512 --gpu V100-32GB"), resnet50),
    Claim("001", "BERT: model size 110M-340M parameters", ("trainfit models",), bert_params),
    Claim("001", "BERT: batch 256-1024, memory 256GB+ (distributed)",
          ("trainfit estimate bert-large --head masked-lm --batch 256 --seq 512 --precision amp-fp16",), bert_memory),
    Claim("001", "Measure energy/iteration: larger training = more power consumption",
          ("trainfit estimate llama-3.1-8b --batch 8 --seq 2048 --precision bf16-master --recompute full --dp 8 "
           "--zero 3 --gpu H100-80GB --tokens 1B --json",), energy_per_iteration),
    Claim("002", "inference can use around 50% to 70% less memory than training ... under the same batch size",
          ("trainfit compare llama-3.2-1b|llama-3.1-8b --batch 4 --seq 2048",), infer_less_than_train),
    Claim("002", "Memory usage scales linearly with the batch size",
          ("trainfit estimate llama-3.2-1b --batch 1|2|4|8 --seq 2048",), linear_in_batch),
    Claim("003", "memory ... scales linearly with the batch size and quadratically with the sequence length",
          ("trainfit estimate llama-3.2-1b --seq 2048|4096 --attention sdpa|eager",), quadratic_in_sequence),
    Claim("003", "for short sequences ... activations almost negligible, from around 2-4k tokens ... significant",
          ("trainfit estimate llama-3.1-8b --seq 512|2048|8192 --precision bf16-master",), short_sequences_negligible),
    Claim("003", "Llama 1 was trained with a batch size of ~4M tokens for 1.4 trillion tokens",
          ("trainfit estimate llama-1-65b --batch 1 --seq 2048 --grad-accum 8 --tp 8 --sequence-parallel --dp 256 "
           "--zero 1 --precision bf16-master --gpu A100-80GB --tokens 1.4T",), llama1_steps),
    Claim("003", "DeepSeek was trained with a batch size of ~60M tokens for 14 trillion tokens", ("—",),
          deepseek_batch),
]


def verdict_kind(verdict: str) -> str:
    """holds, wrong, depends (wrong for one setting or part, right for another) or not checked."""
    if verdict.startswith(("not checked", "not modelled")):
        return "not checked"
    if verdict.startswith("depends") or ("wrong" in verdict and "holds" in verdict):
        return "depends"
    return "wrong" if "wrong" in verdict else "holds"


def render() -> tuple[str, dict[str, int]]:
    """docs/seed-claims.md's text and how many claims got each kind of verdict."""
    lines = ["# The seeds' claims, checked with trainfit", "",
             "Generated by `python -m bench run seed_claims` from the four notes in ../shared/seeds/ (000: a comment thread;"
             " 001: a training-hardware note; 002: inference vs training VRAM; 003: training on one GPU). Each verdict is "
             "computed from the numbers trainfit prints (analytic engine, default settings unless given: amp-bf16, "
             "AdamW, HF stack); `tests/bench/test_seed_claims.py` fails if a number drifts.", "",
             "| seed | claim | trainfit | verdict |", "|---|---|---|---|"]
    kinds = dict.fromkeys(("holds", "wrong", "depends", "not checked"), 0)
    for c in CLAIMS:
        said, verdict = c.check()
        kinds[verdict_kind(verdict)] += 1
        cmd = "<br>".join(f"`{x}`" for x in c.commands if x != "—")
        lines.append(f"| {c.seed} | {c.quote} | {said}{'<br>' + cmd if cmd else ''} | {verdict} |")
    return "\n".join(lines) + "\n", kinds


def main(argv: list[str]) -> int:
    text, kinds = render()
    if "--check" in argv:
        if not DOC.exists() or DOC.read_text() != text:
            print("docs/seed-claims.md is stale: run python -m bench run seed_claims", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)} ({len(CLAIMS)} claims)")
    record("seed_claims", "the seeds' quantitative claims, each checked with trainfit (docs/seed-claims.md)", None,
           f"{len(CLAIMS)} claims: {kinds['holds']} hold, {kinds['wrong']} wrong, {kinds['depends']} depend on the "
           f"setting, {kinds['not checked']} not checked",
           {"claims": len(CLAIMS), **{kind.replace(" ", "_"): n for kind, n in kinds.items()}}, "published",
           machine="the analytic engine on a 2-core CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
