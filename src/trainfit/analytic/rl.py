"""--mode rl: the memory and time of one RL post-training step (GRPO or PPO) on one GPU, phase by phase.

The step as TRL 1.16's GRPOTrainer runs it (trl/trainer/grpo_trainer.py), every model on the same GPU:
  generate  the policy samples --group-size completions of each prompt: transformers' generate in the trainer
            (grpo_trainer.py:1858-1873, under no_grad; accelerate's unwrapped model keeps its autocast wrapper,
            accelerator.py unwrap_model keep_fp32_wrapper=True) or a colocated vLLM engine holding
            --vllm-gpu-memory-utilization of the GPU for its own weights and KV pool (vllm_generation.py:347-360,
            max_num_seqs = the generation batch: grpo_trainer.py:1124; sleep mode off by default:
            grpo_config.py:612, so the engine's memory stays through the training phases);
  score     per-token log-probs of the completions under no_grad, micro-batch by micro-batch
            (_get_per_token_logps_and_entropies, grpo_trainer.py:1419-1505; batch_size = per_device_train_batch_size,
            :2505): the reference model's when beta > 0 (:2709-2739), the policy's own "old" log-probs when a vLLM
            rollout needs the importance-sampling correction (:2643-2657, vllm_importance_sampling_correction
            default True) or PPO needs its ratio, PPO's critic values, a reward model's scores;
  train     the policy's training step over the completions in --grad-accum micro-batches (the HF Trainer's step,
            analytic/memory.py), its loss through TRL's fused LM head (loss.py chunked_logprob_head);
  critic_step  PPO: the critic's own training step (a token-classification value head, as verl builds it).

Between steps the policy's gradients are freed (transformers trainer.py:1954 model.zero_grad(), set_to_none) while
its weights and optimizer states stay; the frozen models' weights stay throughout.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SetupError
from ..precision import PRECISIONS
from ..setup import SETTINGS, Setup
from ..spec import ModelSpec
from . import inference, serving
from ..models.hf_config import one_label, with_head
from .activations import FP32, INDEX
from .flops import forward_per_token
from .memory import TrainMemory, train_memory
from .params import count_params
from .precision import DTYPE_BYTES, state_bytes
from .rl_placement import sharded

# the step settings the policy's training step and its generation share with the RL request (declared once in
# trainfit.setup: those whose modes name both); batch, seq and accumulation are the RL shape's
_SHAPE = ("batch", "seq", "grad_accum", "mode")
TRAIN_SHARED = tuple(s.name for s in SETTINGS if s.owner is Setup and {"train", "rl"} <= set(s.meta.modes)
                     and s.name not in _SHAPE)
INFER_SHARED = tuple(s.name for s in SETTINGS if s.owner is Setup and {"infer", "rl"} <= set(s.meta.modes)
                     and s.name not in _SHAPE + ("precision",))
# vLLM's colocated engine in TRL (vllm_generation.py:359): "max_num_batched_tokens=4096"
TRL_VLLM_BATCHED_TOKENS = 4096


@dataclass(frozen=True)
class Shape:
    """The step's sizes on one GPU. --batch counts prompts; TRL's per_device_train_batch_size counts completions
    (grpo_config.py:480: the effective batch num_processes × per_device_batch_size × gradient_accumulation_steps
    must divide by num_generations), so micro = prompts × group / grad_accum is TRL's per_device_train_batch_size
    and the generation batch (steps_per_generation = gradient_accumulation_steps by default: grpo_config.py:528)
    is every completion of the step."""

    prompts: int
    completions: int
    micro: int
    accum: int
    prompt_len: int
    completion_len: int

    @property
    def seq(self) -> int:
        return self.prompt_len + self.completion_len


def shape(setup: Setup) -> Shape:
    n = setup.batch * setup.group_size
    return Shape(setup.batch, n, n // setup.grad_accum, setup.grad_accum, setup.prompt_len, setup.completion_len)


def train_setup(setup: Setup, head: str | None = None) -> Setup:
    """The policy's (or critic's) training step: micro-batches of whole sequences through TRL's fused LM head."""
    sh = shape(setup)
    shared = {n: getattr(setup, n) for n in TRAIN_SHARED}
    loss = "chunked-logprob" if head is None else "full"
    return Setup(mode="train", batch=sh.micro, seq=sh.seq, grad_accum=sh.accum, loss=loss, head=head, **shared)


def infer_precision(setup: Setup) -> str:
    """The precision a no-grad pass of the training model runs in: the training policy itself when inference
    allows it (amp-*: fp32 weights under autocast; bf16), else its 16-bit weights (bf16-master -> bf16)."""
    p = PRECISIONS[setup.precision]
    return setup.precision if not p.master else p.weight


def infer_setup(setup: Setup, batch: int, seq: int) -> Setup:
    return Setup(mode="infer", batch=batch, seq=seq, precision=infer_precision(setup),
                 **{n: getattr(setup, n) for n in INFER_SHARED})


def no_grad_forward(spec: ModelSpec, setup: Setup, batch: int, seq: int, lm_head: bool = True) -> int:
    """The transient of a no-grad forward over `batch` sequences of `seq` tokens without a cache (TRL's fused
    head sets use_cache=False: utils.py add_fused_lm_head): one layer's high point (inference.py's prefill
    moments, autocast's cached casts) or the fused head's, whichever is larger. `lm_head` False: a value or
    reward head (one or a few outputs per position), only the layers' high point (NB: the classifier's own
    outputs, batch × seq × labels, not counted: under by that)."""
    s = infer_setup(setup, batch, seq)
    m = inference.infer_memory(spec, s)
    layer = m.prefill_peak - m.weights - m.kv_cache - m.logits
    if not lm_head:
        return int(layer)
    st = state_bytes(s)
    tokens = batch * seq
    n = tokens - batch
    from .loss import TRL_TOKEN_STATS, trl_tiles

    # the backbone's output and its shifted copy, the labels and targets, the tiles and the per-token statistics;
    # under autocast every layer's cached weight casts (the models' parameters require grad, as TRL loads them:
    # autocast caches the casts of such leaves for the region, inference.py cast_params)
    head = (st.residual * spec.hidden + INDEX) * (tokens + n) + trl_tiles(spec, s, st, n) + TRL_TOKEN_STATS * FP32 * n
    if PRECISIONS[s.precision].autocast:
        head += st.act * inference.cast_params(spec) * spec.layers
    return int(max(layer, head))


@dataclass(frozen=True)
class Model:
    """A model of the step besides the policy: its name, spec and the bytes it keeps between phases."""

    role: str  # reference, reward, critic
    spec: ModelSpec
    resident: int  # weights (+ the critic's optimizer states and master copy)
    train: TrainMemory | None = None  # the critic's training step


def other_models(spec: ModelSpec, setup: Setup, load) -> list[Model]:
    """The reference (beta > 0, without LoRA: TRL loads it in the policy's dtype, grpo_trainer.py:1001; with LoRA
    the policy with its adapters off is the reference, :989-991), PPO's critic and a reward model. `load` resolves
    a model name (models.resolve.load_model(ref, field=))."""
    weight = DTYPE_BYTES[PRECISIONS[setup.precision].weight]
    out = []
    if setup.beta > 0 and not setup.lora_rank:
        out.append(Model("reference", spec, sharded(int(count_params(spec).total * weight), setup)))
    if setup.reward_model is not None:
        # AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, **model_init_kwargs)
        # (grpo_trainer.py:558-559): no dtype given, so transformers' "auto" (modeling_utils.py:4186-4187), the
        # checkpoint's own dtype
        r = with_head(one_label(_token_model(load(setup.reward_model, field="reward_model"), "--reward-model")), "seq-cls")
        out.append(Model("reward", r, sharded(int(count_params(r).total * checkpoint_bytes(r)), setup)))
    if setup.rl_algo == "ppo":
        # a value head on the backbone, one output per token: verl builds the critic as
        # AutoModelForTokenClassification with num_labels = 1 (verl/workers/fsdp_workers.py, CriticWorker
        # _build_critic_model_optimizer; volcengine/verl main, read 2026-11)
        c = one_label(_token_model(load(setup.critic_model, field="critic_model"), "--critic-model") if setup.critic_model is not None
                      else spec)
        cm = train_memory(c, train_setup(setup, head="token-cls"))
        out.append(Model("critic", c, int(cm.weights + cm.master + cm.optimizer), cm))
    return out


def _token_model(spec, flag: str) -> ModelSpec:
    """`spec` when it reads tokens: a reward or value head scores the policy's text (TRL and verl load it with
    AutoModelForSequenceClassification / AutoModelForTokenClassification), which an image model cannot."""
    if not isinstance(spec, ModelSpec):
        raise SetupError(f"{flag} {spec.name} is an image model; a reward or critic model scores the policy's text: "
                         "give a language model (see `trainfit models`)")
    return spec


def checkpoint_bytes(spec: ModelSpec) -> float:
    """Bytes per parameter of the checkpoint as its config.json states it (torch_dtype, or dtype from
    transformers 5); NB: fp32 when the config states none (transformers would read the weights' own dtype)."""
    return {"bfloat16": 2.0, "float16": 2.0}.get(spec.dtype, 4.0)


@dataclass(frozen=True)
class Rollout:
    """The generate phase's own bytes beside the resident models, and what stays through the other phases."""

    generate: int  # KV cache + the transient of generation at its high point (HF), or the engine's budget (vLLM)
    kv_cache: int
    engine: int  # a colocated vLLM engine's memory, held through every phase (0 for HF)
    engine_weights: int
    records: dict  # the rollout's own (Estimate.detail.rl's rollout_records)
    serving: serving.Serving | None = None  # a colocated vLLM engine's sizing


def hf_rollout(spec: ModelSpec, setup: Setup) -> Rollout:
    """transformers' generate of every completion at once: the prompt's prefill, then completion_len decode steps
    with a growing DynamicCache; the high point is the prefill or the last decode step (inference.py)."""
    sh = shape(setup)
    pre = inference.infer_memory(spec, infer_setup(setup, sh.completions, sh.prompt_len))
    # completion_len forwards in all (the prefill makes the first token): the last decode step reads a cache of
    # prompt + completion − 2 tokens and writes one more (inference.py's decode at seq caches seq + 1)
    last = inference.infer_memory(spec, infer_setup(setup, sh.completions, max(1, sh.seq - 2)))
    gen = max(pre.prefill_peak, last.decode_peak) - last.weights
    per_token = inference.kv_bytes_per_token(spec, infer_setup(setup, 1, 1))
    kv = int(per_token * sh.completions * (sh.seq - 1))
    return Rollout(int(gen), kv, 0, 0, {"kv_bytes_per_token": per_token, "prefill_peak": pre.prefill_peak,
                                        "decode_peak": last.decode_peak})


def vllm_setup(setup: Setup) -> Setup:
    """The engine's serve setup; an engine of --rollout-tp GPUs generates all its GPUs' completions together."""
    sh = shape(setup)
    return Setup(mode="serve", precision=PRECISIONS[setup.precision].compute, kv_dtype=setup.kv_dtype,
                 gpu_memory_utilization=setup.vllm_gpu_memory_utilization, max_model_len=sh.seq,
                 max_num_seqs=sh.completions * setup.rollout_tp, max_num_batched_tokens=TRL_VLLM_BATCHED_TOKENS,
                 tp=setup.rollout_tp)


def vllm_rollout(spec: ModelSpec, setup: Setup, gpu) -> Rollout:
    """A colocated vLLM engine (analytic/serving.py's start-up sizing with TRL's knobs): its whole budget —
    weights in the compute dtype, the profile run's activations, CUDA graphs and the KV pool — is taken at start
    and held (no sleep mode)."""
    if gpu is None:
        raise SetupError("--rollout vllm sizes the colocated engine from the GPU's memory: add --gpu (see "
                         "`trainfit gpus`)")
    sv = serving.serve_memory(spec, vllm_setup(setup), gpu)
    if sv.kv_blocks == 0:
        # vLLM refuses to start without a KV block ("No available memory for the cache blocks. Try increasing
        # `gpu_memory_utilization`": raise_if_cache_size_invalid, v1's _check_enough_kv_cache_memory; named, not
        # pinned to a line: vLLM's repository is not mirrored here); verl's rule for it: docs/perf/best_practices.rst:126
        from ..units import fmt_bytes
        raise SetupError(f"--vllm-gpu-memory-utilization {setup.vllm_gpu_memory_utilization} leaves the vLLM engine "
                         f"no KV cache: its {fmt_bytes(sv.requested)} per GPU hold {fmt_bytes(sv.weights)} of weights, "
                         f"{fmt_bytes(sv.activations + sv.cuda_graphs)} of activations and CUDA graphs; raise it or "
                         "--rollout-tp")
    engine = sv.weights + sv.activations + sv.cuda_graphs + sv.kv_pool
    sh = shape(setup)
    return Rollout(0, sv.kv_pool, int(engine), sv.weights,
                   {"kv_tokens_needed": sh.completions * setup.rollout_tp * sh.seq}, sv)


def rollout_buffers(setup: Setup, scored: int) -> int:
    """The generation batch TRL keeps through the step (_generate_and_score_completions, grpo_trainer.py:2500-2505):
    prompt_completion_ids and the attention mask (int64, completions × seq), and each scored model's per-token
    fp32 log-probs of the completions."""
    sh = shape(setup)
    return int(2 * INDEX * sh.completions * sh.seq + scored * FP32 * sh.completions * sh.completion_len)


@dataclass(frozen=True)
class RLMemory:
    phases: dict[str, int]
    peak: int
    peak_phase: str
    policy: TrainMemory
    others: list[Model]
    rollout: Rollout
    buffers: int
    scored: list[str]
    placement: object = None  # rl_placement.Placement

    @property
    def policy_resident(self) -> int:
        """The policy between steps: weights, master copy and optimizer states (no gradients)."""
        p = self.policy
        return int(p.weights + p.master + p.optimizer)


def scored_models(spec: ModelSpec, setup: Setup, others: list[Model]) -> list[tuple[str, ModelSpec]]:
    """Who scores the completions in the score phase, in TRL's order (old log-probs, reference, then rewards)."""
    out = []
    if setup.rollout == "vllm" or setup.rl_algo == "ppo":
        out.append(("policy", spec))
    if setup.beta > 0:
        out.append(("reference", spec))  # (with LoRA: the policy, adapters off)
    out += [(m.role, m.spec) for m in others if m.role in ("critic", "reward")]
    return out


def rl_memory(spec: ModelSpec, setup: Setup, gpu=None, load=None) -> RLMemory:
    """Every phase's bytes on one GPU (the busiest GPU of the phase's group under --rl-placement split):
    analytic/rl_placement.py places the models, the offloads and the engine's sleep."""
    from . import rl_placement

    sh = shape(setup)
    policy = train_memory(spec, train_setup(setup))
    others = other_models(spec, setup, load)
    roll = vllm_rollout(spec, setup, gpu) if setup.rollout == "vllm" else hf_rollout(spec, setup)
    scorers = scored_models(spec, setup, others)
    buffers = rollout_buffers(setup, sum(1 for role, _ in scorers if role in ("policy", "reference")))
    # the reward model scores the whole generation batch at once (TRL's _calculate_rewards,
    # grpo_trainer.py:1615-1620); the others go micro-batch by micro-batch
    forwards = {role: no_grad_forward(s, setup, sh.completions if role == "reward" else sh.micro, sh.seq,
                                      lm_head=role in ("policy", "reference")) for role, s in scorers}
    m = RLMemory({}, 0, "", policy, others, roll, buffers, [role for role, _ in scorers])
    pl = rl_placement.place(spec, setup, m, forwards)
    peak_phase = max(pl.phases, key=pl.phases.get)
    return RLMemory(pl.phases, pl.phases[peak_phase], peak_phase, policy, others, roll, buffers, m.scored, pl)


def generate_seconds(spec: ModelSpec, setup: Setup, mem: RLMemory, gpu, pc=None) -> float:
    """The rollout, op by op (no utilisation constant).
    vllm: TRL submits every prompt of the step to the colocated engine in one call (trl/generation/vllm_generation.py
    :680, `self.llm.generate(vllm_prompts, ...)`, TRL main f2cd57710), so the engine runs them as one batch
    (serving_time.batch_latency: the prompts in max_num_batched_tokens chunks, then completion_len − 1 decode steps
    of the whole batch, each step's GEMMs, paged KV reads, TP all-reduces, sampler and CUDA graphs). An engine of
    --rollout-tp GPUs generates all its GPUs' completions; when its KV pool holds fewer whole sequences, vLLM
    admits what fits and the rest wait (serving_time.batch_latency's waves; NB: taken as equal waves: the
    scheduler's refill as sequences finish overlaps them, errs slow).
    hf: transformers' generate, eager: the prompts' prefill, then completion_len − 1 decode steps (the prefill makes
    the first token), each a forward of every completion's next token against its DynamicCache at the mean context
    prompt + completion / 2 (infer_time.forward_time: each kernel by the roofline, never faster than the host
    issues them — a small batch is launch-bound). Under autocast (amp-*) every decode step casts its weights anew:
    accelerate wraps the model's forward in autocast (accelerator.py:1826-1835, accelerate 1.15), and leaving the
    outermost autocast region clears its cast cache (torch/amp/autocast_mode.py:349).
    NB: every completion runs to completion_len (no early EOS): an upper bound on the decode steps; generate's
    logits processors and sampling (softmax, multinomial over [completions, vocab]) are not counted: errs fast."""
    from . import infer_time, serving_time

    pc = pc or count_params(spec)
    sh = shape(setup)
    if setup.rollout == "vllm":
        sv = mem.rollout.serving
        k = sv.knobs
        seqs = sh.completions * setup.rollout_tp
        return serving_time.batch_latency(spec, vllm_setup(setup), gpu, pc, sv.kv_bytes_per_token, seqs,
                                          sh.prompt_len, sh.completion_len, k.capture_sizes,
                                          k.max_num_batched_tokens, k.max_num_seqs, sv.kv_tokens)
    s = infer_setup(setup, sh.completions, sh.prompt_len)
    pre = infer_time.forward_time(spec, s, gpu, pc, sh.prompt_len, sh.prompt_len)
    mid = sh.prompt_len + sh.completion_len // 2
    dec = infer_time.forward_time(spec, s, gpu, pc, 1, mid, casts_cached=False)
    return pre.seconds + (sh.completion_len - 1) * dec.seconds


def score_seconds(setup: Setup, mem: RLMemory, spec: ModelSpec, gpu) -> float:
    """The score phase op by op: each scoring model's no-grad forward over prompt + completion tokens
    (infer_time.forward_time, eager), micro-batch by micro-batch (the reward model over the whole generation batch
    at once: rl_memory's forwards); the policy's and reference's LM head over the completion tokens whose log-probs
    are taken (logits_to_keep), a reward or value head over theirs. NB: the log-softmax over those logits is not
    counted: errs fast."""
    from . import infer_time

    sh = shape(setup)
    by_role = {m.role: m.spec for m in mem.others}
    total = 0.0
    for role in mem.scored:
        s = by_role.get(role, spec)
        batch, passes = (sh.completions, 1) if role == "reward" else (sh.micro, sh.accum)
        rows = batch * sh.completion_len if role in ("policy", "reference") else None
        t = infer_time.forward_time(s, infer_setup(setup, batch, sh.seq), gpu, count_params(s), sh.seq, sh.seq,
                                    logits_rows=rows)
        total += passes * t.seconds
    return total


def score_flops(setup: Setup, mem: RLMemory, spec: ModelSpec, others: list[Model]) -> float:
    """One forward over every completion (prompt + completion tokens) per scoring model."""
    sh = shape(setup)
    by_role = {m.role: m.spec for m in others}
    return sum(forward_per_token(by_role.get(role, spec), sh.seq) * sh.completions * sh.seq for role in mem.scored)
