"""The model and layout limits every engine enforces at its own entry (no torch): what a stack's own model
builds (check_stack_model), and whether a parallel layout, pipeline split and sequence fit the model
(validate_layout). The analytic engine, the trace engine, the measure engine and the stacks' steps all call these,
so every route refuses the same setups with the same line."""
from __future__ import annotations

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec
from .liger import check_family
from .moe_imbalance import forced_by
from .parallel import pipeline
from .stacks import model_for


def check_stack_model(spec: ModelSpec, setup: Setup) -> None:
    """The models a stack builds (every engine): SetupError where the stack's model does not build `spec`
    (analytic/stacks: torchtitan builds its llama3 Transformer only)."""
    model_for(setup).check_model(spec, setup)


def check_generates(spec: ModelSpec, setup: Setup) -> None:
    """Serving and RL generate tokens (a KV cache, decode steps): an encoder does not."""
    if spec.causal or setup.mode not in ("serve", "rl"):
        return
    if setup.mode == "serve":  # vLLM's pooling runner (--runner pooling) and SGLang's embedding mode: no KV, no decode
        raise SetupError(f"--mode serve models a generating server (KV cache, decode); {spec.name} is an encoder, "
                         "which vLLM and SGLang serve only as a pooling (embedding/classification) model, not "
                         "modelled: use --mode infer")
    raise SetupError(f"--mode rl samples completions from the policy; {spec.name} is an encoder, which does not "
                     "generate: use a causal language model (see `trainfit models`)")


def validate_layout(spec: ModelSpec, setup: Setup) -> None:
    check_stack_model(spec, setup)
    check_generates(spec, setup)
    t, p = setup.tp, setup.pp
    # --mode rl's vLLM engine shards the same heads over --rollout-tp GPUs, which vLLM's own check refuses likewise
    # (config/model.py verify_with_parallel_config: num_attention_heads % tensor_parallel_size)
    for flag, size in (("--tp", t), ("--rollout-tp", getattr(setup, "rollout_tp", 1))):
        if spec.heads % size:
            raise SetupError(f"{flag} {size} does not divide the {spec.heads} attention heads of {spec.name}; use a "
                             f"divisor of {spec.heads}")
        if spec.kv_heads % size and size % spec.kv_heads:
            raise SetupError(f"{flag} {size} and the {spec.kv_heads} key/value heads of {spec.name} do not divide one "
                             "another")
    n = getattr(setup, "ulysses", 1)  # DeepSpeed's Ulysses (ulysses_sp.py:147-153)
    if n > 1 and spec.heads % n:
        raise SetupError(f"--ulysses {n} does not divide the {spec.heads} attention heads of {spec.name}; use a "
                         f"divisor of {spec.heads}")
    if n > 1 and spec.kv_heads % n and n % spec.kv_heads:
        raise SetupError(f"--ulysses {n} and the {spec.kv_heads} key/value heads of {spec.name} do not divide one "
                         "another (DeepSpeed repeats kv heads only by a whole factor)")
    if getattr(setup, "tiled_mlp", None) is not None and (not spec.gated_mlp or spec.moe is not None):
        raise SetupError(f"--tiled-mlp patches a gated MLP's forward (down(act(gate(x)) * up(x)), ArcticTraining's "
                         f"tiled_compute.py:86-91); {spec.name}'s MLP is not one: drop --tiled-mlp")
    if getattr(setup, "liger", False):
        check_family(spec)
    if spec.intermediate and spec.intermediate % t:
        raise SetupError(f"--tp {t} does not divide the MLP width {spec.intermediate} of {spec.name}")
    if p > spec.layers:
        raise SetupError(f"--pp {p} exceeds the {spec.layers} layers of {spec.name}; use --pp {spec.layers} or less")
    try:
        pipeline.check(spec, setup)  # Megatron's split and interleaving checks (parallel/pipeline.py)
    except SetupError as e:
        raise SetupError(f"{spec.name}: {e}") from None
    if setup.ep > 1 and not spec.is_moe:
        raise SetupError(f"--ep {setup.ep} splits the experts of a mixture-of-experts model; {spec.name} is dense "
                         "(Megatron: transformer_config.py:1048-1049): use --ep 1")
    if getattr(setup, "etp", None) is not None and not spec.is_moe:
        raise SetupError(f"--etp {setup.etp} sets the experts' tensor parallelism; {spec.name} is dense: drop --etp")
    kept = getattr(setup, "bf16_first_layers", 0) + getattr(setup, "bf16_last_layers", 0)
    if kept > spec.layers:
        raise SetupError(f"--bf16-first-layers and --bf16-last-layers keep {kept} layers in bf16, more than the "
                         f"{spec.layers} of {spec.name}; give at most {spec.layers} in all (all of them: the step "
                         "without --low-precision)")
    routing = [f for f, v in (("--moe-imbalance", getattr(setup, "moe_imbalance", None)),
                              ("--moe-force-balance", getattr(setup, "moe_force_balance", False)),
                              ("--moe-capacity-factor", getattr(setup, "moe_capacity_factor", None)))
               if v not in (None, False)]
    if routing and not spec.is_moe:
        raise SetupError(f"{routing[0]} sets how a mixture-of-experts router loads its experts; {spec.name} is dense: "
                         "drop it")
    # (the load they set is the busiest expert-parallel rank's, analytic/moe_imbalance.py: 1 at --ep 1, whatever they
    # say; a forced balance by random logits also adds the router's noise kernels, timed at any --ep:
    # ops/megatron_moe.py)
    noise = forced_by(setup) == "random-logits"
    loads = [f for f in routing if not (f == "--moe-force-balance" and noise)]
    if loads and setup.ep <= 1:
        raise SetupError(f"{loads[0]} sets the busiest expert-parallel rank's load (analytic/moe_imbalance.py); at "
                         "--ep 1 every rank holds every expert and none is busier, so the estimate would not read "
                         "it: add --ep N, or drop it")
    if setup.ep > 1 and spec.moe.num_experts % setup.ep:
        raise SetupError(f"--ep {setup.ep} does not divide the {spec.moe.num_experts} experts of {spec.name} (Megatron: "
                         f"moe/moe_layer.py:101); use a divisor of {spec.moe.num_experts}")
    longest = spec.longest_sequence(setup.mode)
    # (serve's context is --max-model-len, which the server's own rule holds to the positions: serving.knobs)
    if longest is not None and setup.mode != "serve" and setup.seq > longest:
        extra = spec.max_positions - longest  # the decode position
        raise SetupError(f"{spec.name} has {spec.max_positions} learned positions; --seq {setup.seq} needs "
                         f"{setup.seq + extra}{' (decode writes position --seq)' if extra else ''}: "
                         f"use --seq {longest} or less")
    if setup.mode == "train" and p > 1 and setup.grad_accum < p:
        raise SetupError(f"--pp {p} needs at least {p} micro-batches per step to fill the pipeline: set --grad-accum >= {p}")


def model_takes(spec: ModelSpec, **settings) -> bool:
    """Whether the model takes these settings (validate_layout: Liger's families, gated MLPs), for the planner's
    and the fit advice's knobs."""
    try:
        validate_layout(spec, Setup(**settings))
    except SetupError:
        return False
    return True
