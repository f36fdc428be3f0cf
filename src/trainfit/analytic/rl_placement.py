"""--mode rl on --dp GPUs: where the step's models live in each phase, what goes to host memory between phases and
what moving it costs (docs/rl.md "Many GPUs").

Two placements, as the frameworks name them:
  colocated  verl's hybrid engine (one `actor_rollout_ref` worker per GPU holding the FSDP actor, the reference and
             a vLLM rollout; verl/workers/fsdp_workers.py, volcengine/verl b178a3cd, v0.7.0-125) and OpenRLHF's
             --train.colocate_all (openrlhf/cli/train_ppo_ray.py:41-63, OpenRLHF 3c3be623): every model on every
             GPU, the phases taking turns. Between phases verl moves the actor's FSDP parameters
             (offload_fsdp_model_to_cpu / load_fsdp_model_to_gpu, verl/utils/fsdp_utils.py:144-200), its optimizer
             states (offload_fsdp_optimizer / load_fsdp_optimizer, :204-225) and the reference's parameters to host
             memory when actor/ref.fsdp_config.param_offload and optimizer_offload are set
             (_generated_ppo_trainer.yaml:30-31, 170-171; default false), and puts the vLLM engine to sleep
             (rollout.free_cache_engine, default true: rollout.yaml:47; sleep level 2 with vLLM >= 0.8.5:
             verl/third_party/vllm/__init__.py:48-49; OpenRLHF's --vllm.enable_sleep sleeps at level 1:
             openrlhf/trainer/ray/vllm_engine.py:138). vLLM's sleep level 1 backs the weights up in CPU memory and
             discards the KV cache; level 2 discards both (docs.vllm.ai/en/latest/features/sleep_mode).
  split      OpenRLHF without --colocate_*: the actor, reference, reward model and critic each on their own group
             (--actor/ref/reward/critic.num_gpus_per_node, default 8 each: train_ppo_ray.py:200-216) and the vLLM
             engines on others (--vllm.num_engines × --vllm.tensor_parallel_size); every group is sized --dp here.

The phases, in verl's order (ray_trainer's fit loop):
  weight_sync  rollout_mode (fsdp_workers.py:677-757): load the actor's parameters (:683), take its state dict,
               offload them again (:719-721), wake the engine's weights (:735-736), stream the parameters into it
               one full tensor at a time (`param.to(device).full_tensor()`, :728-733; update_weights :747), then wake
               the KV cache (:751-752). Without sleep mode the engine's KV pool is still held here: the phase
               switch where the actor's reloaded parameters meet the whole engine.
  generate     the engine generates; the actor's parameters and optimizer states are on the GPU unless offloaded.
  score        compute_log_prob (old log-probs: loads the actor's parameters, :993-994, offloads them, :1033-1034)
               and compute_ref_log_prob (the reference's, :1080-1081, :1119-1120); the engine asleep.
  train        update_actor: parameters and optimizer states loaded (:895-898), offloaded after (:928-932).
  critic_step  PPO: the critic's update (its own offloads, :1561-1586, not modelled: its states stay).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..estimate import PHASES, Phase
from ..precision import PRECISIONS
from .precision import DTYPE_BYTES

WEIGHT_SYNC = Phase.WEIGHT_SYNC.value  # the rollout_mode switch: actor -> engine weights


@dataclass(frozen=True)
class Placement:
    phases: dict[str, int]  # phase -> bytes on the busiest GPU in it
    groups: dict[str, int]  # split: group -> GPUs (every group --dp); colocated: {"all": dp}
    host_per_gpu: int  # bytes in host memory per GPU between phases (offloaded states, a sleeping engine's weights)
    transfers: dict[str, int] = field(default_factory=dict)  # what -> bytes each way per GPU per step (PCIe)
    sync_bytes: int = 0  # the policy's weights a GPU receives to refresh the engine per step
    parts: dict = field(default_factory=dict)  # phase -> Category -> bytes

    @property
    def gpus(self) -> int:
        return sum(self.groups.values())


def hybrid(setup) -> bool:
    """The phase-switching path of verl's hybrid engine (a weight_sync phase, the placement's host memory): more
    than one GPU, a split placement, or any offload or sleep level. The default one-GPU loop stays TRL's."""
    return (setup.world_size > 1 or setup.rl_placement != "colocated" or setup.vllm_sleep_level > 0
            or setup.actor_param_offload or setup.actor_optimizer_offload or setup.ref_param_offload)


def sharded(resident: int, setup) -> int:
    """A frozen model's weights on one GPU: verl wraps the reference (and reward model) in FSDP with the actor's
    strategy (ref.strategy = ${actor_rollout_ref.actor.strategy}, _generated_ppo_trainer.yaml:130), so --zero 3
    shards them over --dp like the actor's; DDP-style layouts (--zero 0-2) keep a replica per GPU."""
    return -(-resident // setup.dp) if setup.zero == 3 else resident


def largest_tensor(spec, setup) -> int:
    """The one parameter a GPU holds whole while streaming the actor's weights to the engine
    (`full_tensor()` per parameter, fsdp_workers.py:728-733): the embedding, vocabulary × hidden, in the actor's
    stored dtype. Sharded layouts only (--zero 3); other layouts already hold every parameter whole.
    NB: a model whose largest matrix is an MLP projection (intermediate × hidden > vocabulary × hidden): under."""
    if setup.zero != 3:
        return 0
    return int(spec.vocab * spec.hidden * DTYPE_BYTES[PRECISIONS[setup.precision].weight])


def place(spec, setup, m, forwards: dict[str, int]) -> Placement:
    """Per-phase bytes per GPU for `m` (rl.RLMemory's parts: the policy's TrainMemory, the other models, the
    rollout, the generation batch's buffers), given each scorer's no-grad forward transient in `forwards`."""
    p, roll, buffers = m.policy, m.rollout, m.buffers
    by_role = {o.role: o for o in m.others}
    ref = by_role["reference"].resident if "reference" in by_role else 0
    reward = by_role["reward"].resident if "reward" in by_role else 0
    critic = by_role.get("critic")
    pw, po = int(p.weights + p.master), int(p.optimizer)
    engine, ew = roll.engine, roll.engine_weights
    graphs = roll.serving.cuda_graphs if roll.serving is not None else 0
    if setup.rl_placement == "split":
        return _split(spec, setup, m, forwards, pw, po, ref, reward, critic, engine)
    # colocated: what each phase keeps on the GPU, by Category
    policy_on = _states(p, not setup.actor_param_offload, not setup.actor_optimizer_offload)
    frozen_on = {"weights": (0 if setup.ref_param_offload else ref) + reward}
    critic_on = _states(critic.train, True, True) if critic else {}
    # a sleeping engine keeps its CUDA graphs (verl docs/perf/perf_tuning.rst:56: "cudagraph memory can not be
    # offloaded to cpu"); NB: its profile-run activations are counted as freed (the budget's transient)
    sv = roll.serving
    whole = ({"weights": ew, "kv_cache": sv.kv_pool, "temporaries": engine - ew - sv.kv_pool} if sv is not None
             else {})
    idle = {"temporaries": graphs} if setup.vllm_sleep_level else whole
    parts = {}
    if roll.engine and hybrid(setup):
        # the engine's weights woken (or the whole engine, never asleep) beside the actor's parameters, one whole
        # tensor in flight; the KV pool woken only after (fsdp_workers.py:750-752)
        woken = {"weights": ew, "temporaries": graphs} if setup.vllm_sleep_level else whole
        parts[WEIGHT_SYNC] = _sum(policy_on, frozen_on, critic_on, woken,
                                  {"temporaries": largest_tensor(spec, setup)})
    # --zero 3: an FSDP-wrapped model's no-grad forward all-gathers each layer's parameters in turn (the current
    # and the prefetched layer, and the root's: memory.py's zero3_gathered_params); TRL's HF generation under FSDP
    # unshards the root only (summon_full_params(recurse=False), trl/trainer/grpo_trainer.py:1852-1859,
    # huggingface/trl f2cd5771), the layers gather in their forwards. NB: the reward model and critic counted
    # without it (under by their own gathered layers)
    unit = int(p.detail.get("zero3_gathered_params", 0)) if setup.zero == 3 else 0
    gen = {"kv_cache": roll.kv_cache, "temporaries": roll.generate - roll.kv_cache + unit} if not roll.engine else {}
    parts[Phase.GENERATE.value] = _sum(policy_on, frozen_on, critic_on, whole, gen)
    if forwards:
        def scoring(role):  # compute_log_prob / compute_ref_log_prob load their own model
            mine = role == "policy" or (role == "reference" and bool(setup.lora_rank))
            return _sum(_states(p, mine or not setup.actor_param_offload, not setup.actor_optimizer_offload),
                        {"weights": (ref if role == "reference" or not setup.ref_param_offload else 0) + reward},
                        critic_on, idle, {"inputs": buffers,
                                          "temporaries": forwards[role] + unit * (role in ("policy", "reference"))})
        parts[Phase.SCORE.value] = max((scoring(role) for role in forwards), key=lambda d: sum(d.values()))
    for name in PHASES:
        step = {k: v for k, v in p.at_peak.items()} if name == p.peak_phase else {"temporaries": p.phases[name]}
        parts[name] = _sum(step, frozen_on, critic_on, idle, {"inputs": buffers})
    if critic is not None:
        parts[Phase.CRITIC_STEP.value] = _sum(dict(critic.train.at_peak), frozen_on, idle, policy_on,
                                              {"inputs": buffers})
    phases = {k: int(sum(v.values())) for k, v in parts.items()}
    host = (pw * setup.actor_param_offload + po * setup.actor_optimizer_offload + ref * setup.ref_param_offload
            + ew * (setup.vllm_sleep_level == 1))
    transfers = {}
    if setup.actor_param_offload:
        # loads: rollout_mode (:683), update_actor (:896), compute_log_prob (:994) when the policy scores, and
        # compute_ref_log_prob (:1081) when LoRA makes the policy the reference
        trips = 2 + ("policy" in forwards) + ("reference" in forwards and bool(setup.lora_rank))
        transfers["actor_params"] = pw * trips
    if setup.actor_optimizer_offload:
        transfers["actor_optimizer"] = po  # update_actor's load (:898) and offload (:932)
    if setup.ref_param_offload:
        transfers["reference"] = ref  # compute_ref_log_prob's load (:1081) and offload (:1120)
    if setup.vllm_sleep_level == 1:
        transfers["engine_weights"] = ew  # sleep(level=1) backs the weights up in host memory, wake_up restores
    return Placement(phases, {"all": setup.dp}, int(host), transfers, _sync_bytes(spec, setup, m), parts)


def _states(t, params: bool, optimizer: bool) -> dict:
    """A trained model's states between its steps (TrainMemory t), those on the GPU."""
    return {"weights": t.weights if params else 0, "master_weights": t.master if params else 0,
            "optimizer_states": t.optimizer if optimizer else 0}


def _sum(*parts: dict) -> dict:
    out: dict[str, int] = {}
    for d in parts:
        for k, v in d.items():
            if v:
                out[k] = out.get(k, 0) + int(v)
    return out


def _split(spec, setup, m, forwards, pw, po, ref, reward, critic, engine) -> Placement:
    """OpenRLHF's separate groups: each phase's bytes are its own group's GPU's (NB: a group's own resident model
    and the generation batch it receives; the other groups' GPUs idle in that phase)."""
    p, buffers = m.policy, m.buffers
    sv = m.rollout.serving
    whole = {"weights": sv.weights, "kv_cache": sv.kv_pool, "temporaries": engine - sv.weights - sv.kv_pool}
    resident = {"policy": _states(p, True, True), "reference": {"weights": ref}, "reward": {"weights": reward},
                "critic": _states(critic.train, True, True) if critic else {}}
    parts = {WEIGHT_SYNC: max(_sum(resident["policy"], {"temporaries": largest_tensor(spec, setup)}), whole,
                              key=lambda d: sum(d.values())),
             Phase.GENERATE.value: whole}
    if forwards:
        unit = int(p.detail.get("zero3_gathered_params", 0)) if setup.zero == 3 else 0  # (as colocated)
        parts[Phase.SCORE.value] = max((_sum(resident[role], {"inputs": buffers, "temporaries": f + unit * (
            role in ("policy", "reference"))}) for role, f in forwards.items()), key=lambda d: sum(d.values()))
    for name in PHASES:
        step = dict(p.at_peak) if name == p.peak_phase else {"temporaries": p.phases[name]}
        parts[name] = _sum(step, {"inputs": buffers})
    if critic is not None:
        parts[Phase.CRITIC_STEP.value] = _sum(dict(critic.train.at_peak), {"inputs": buffers})
    phases = {k: int(sum(v.values())) for k, v in parts.items()}
    groups = {"actor": setup.dp, "rollout": setup.dp}
    for role in ("reference", "reward", "critic"):
        if any(o.role == role for o in m.others):
            groups[role] = setup.dp
    return Placement(phases, groups, 0, {}, _sync_bytes(spec, setup, m), parts)


def _sync_bytes(spec, setup, m) -> int:
    """The policy's weights one GPU receives per step to refresh the engine: under --zero 3 the full tensors are
    all-gathered from the --dp shards ((dp − 1)/dp of the stored weights); OpenRLHF's split placement broadcasts
    every parameter from the actor's rank 0 to the engines (broadcast_to_vllm) in the engine's dtype. A colocated
    replica (--zero 0-2) hands its own tensors to the engine over CUDA IPC (update_weights_from_ipc): no link."""
    if not m.rollout.engine:
        return 0
    from .params import count_params

    n = count_params(spec).total
    stored = n * DTYPE_BYTES[PRECISIONS[setup.precision].weight]
    gathered = stored * (setup.dp - 1) / setup.dp if setup.zero == 3 else 0
    sent = n * DTYPE_BYTES[PRECISIONS[setup.precision].compute] if setup.rl_placement == "split" else 0
    return int(gathered + sent)


def seconds(pl: Placement, setup, gpu) -> dict[str, float]:
    """Per step: the offloads' copies over the GPU's host link (kernels.toml host_link, pinned copies at the PCIe
    line rate; each transfer crosses it twice, to the host and back) and the weight sync over the GPUs' link
    (NVLink inside a node; the NIC when the placement's GPUs span nodes).
    NB: the copies are counted exposed (verl loads and offloads around each phase, synchronously) and at the line
    rate (optimistic: pinned cudaMemcpy reaches ~80-90 %); NB: non-pinned (pageable) copies are slower still."""
    from .roofline import kernels_for

    out = {}
    moved = 2 * sum(pl.transfers.values())
    if moved:
        link = kernels_for(gpu).host_link
        if link <= 0:
            from ..errors import SetupError
            raise SetupError(f"--actor-param-offload / --vllm-sleep-level 1: no host link bandwidth is known for "
                             f"{gpu.name} (kernels.toml host_link); use a catalog GPU")
        out["offload"] = moved / link
    if pl.sync_bytes:
        bw = gpu.intra_node_bandwidth if pl.gpus <= gpu.gpus_per_node else gpu.inter_node_bandwidth
        out[WEIGHT_SYNC] = pl.sync_bytes / bw
    return out


def host_per_node(pl: Placement, gpu) -> int:
    """The offloaded bytes of the GPUs one node holds (NB: a full node of gpus_per_node, or every GPU of a smaller
    job; excludes the processes' own host memory — Ray, the dataloader, CUDA contexts: under)."""
    return int(pl.host_per_gpu * min(pl.gpus, gpu.gpus_per_node))


def describe(pl: Placement, setup, peak_phase: str, gpu) -> list[str]:
    """The estimate's notes on the placement: the layout, what moves between phases, the peak phase's cause."""
    from ..units import fmt_bytes

    engines = f"{setup.dp // setup.rollout_tp} vLLM engine(s) of --rollout-tp {setup.rollout_tp}" \
        if setup.rollout == "vllm" else "transformers' generate on each GPU"
    if setup.rl_placement == "split":
        out = ["split placement (OpenRLHF without --colocate_*): " + ", ".join(f"{g} on {n} GPU(s)" for g, n in
                                                                               pl.groups.items())
               + f", {pl.gpus} GPUs in all; each phase's bytes are its group's busiest GPU's"]
    else:
        moved = [n for n, on in (("the actor's parameters", setup.actor_param_offload),
                                 ("the actor's optimizer states", setup.actor_optimizer_offload),
                                 ("the reference's weights", setup.ref_param_offload)) if on]
        out = [f"colocated on {setup.dp} GPU(s) (verl's hybrid engine, OpenRLHF's --train.colocate_all): the actor, "
               f"the frozen models and {engines} take turns; "
               + (f"offloaded to host memory between phases: {', '.join(moved)}" if moved else "nothing offloaded")
               + (f"; the engine sleeps at level {setup.vllm_sleep_level} outside generation (its CUDA graphs stay)"
                  if setup.vllm_sleep_level else "; the engine holds its whole budget in every phase (no sleep mode)")]
    if peak_phase == WEIGHT_SYNC and not setup.vllm_sleep_level and setup.rl_placement == "colocated":
        out.append("the peak is the switch to generation: the engine's KV pool is still allocated while the actor's "
                   "parameters are back on the GPU; --vllm-sleep-level 1 or 2 frees it (verl's free_cache_engine)")
    if pl.host_per_gpu:
        node = f", {fmt_bytes(host_per_node(pl, gpu))} per node of {min(pl.gpus, gpu.gpus_per_node)} GPUs" \
            if gpu is not None else ""
        out.append(f"host memory: {fmt_bytes(pl.host_per_gpu)} per GPU offloaded between phases{node} "
                   "(verl's copies are non_blocking .to('cpu'); OpenRLHF's DeepSpeed sleep pins them; vLLM's level-1 "
                   "sleep keeps a CPU backup of the weights); NB: the processes' own host memory is not counted")
    return out
