"""The rules that tie settings together (one place): `validate` checks a Setup field by field and then the
cross-field rules (layouts a stack runs, serving and RL combinations); `micro_batch_rules` the ones the micro-batch
takes part in. Model-dependent limits are analytic/layout.py's."""
from __future__ import annotations

from .. import deepep_buffers, limits
from .. import precision as _precision
from .. import stacks as _stacks
from .. import serving_versions
from ..errors import SetupError
from .settings import (_SETUP_SETTINGS, BY_NAME, Setup, check_value, other_server_settings, refuse_inapplicable,
                       refuse_other_server)
from .vocab import (BNB_OPTIMIZERS, TORCHAO_OPTIMIZERS, COMMON_RECOMPUTE, MODES, QUANTS,
                    RECOMPUTE_PATTERNS, SERVE_KV_DTYPES)


def validate(setup: Setup, changed: frozenset | None = None) -> None:
    """Every Setup field (`changed`: those only, the others having passed for this mode already: Setup._replaced),
    then the rules that tie settings together."""
    mode = setup.mode
    if mode not in MODES:
        raise SetupError(f"--mode {mode!r} is not supported; choose one of: {', '.join(MODES)}")
    for s in _SETUP_SETTINGS if changed is None else (BY_NAME[n] for n in changed):
        check_value(s, getattr(setup, s.name), mode)
    refuse_inapplicable(setup, _SETUP_SETTINGS, mode, changed)
    limits.check_world(setup.world_size)
    if setup.sequence_parallel and setup.tp == 1:
        raise SetupError("--sequence-parallel splits activations over tensor-parallel ranks: it needs --tp > 1")
    stack = _stacks.get_stack(setup.stack, setup.stack_release)
    shard_axes = stack.zero_shard_axes
    if (setup.zero and all(getattr(setup, axis) == 1 for axis in shard_axes)
            and setup.offload_state not in stack.zero_single_rank_with):
        raise SetupError(f"--zero shards states over data-parallel ranks ({' × '.join('--' + a for a in shard_axes)}"
                         f" on --stack {stack.name}): it needs --dp > 1" + (" or --cp > 1" if "cp" in shard_axes
                                                                            else "")
                         + (f", or --offload {' or '.join(stack.zero_single_rank_with)} to run it on one GPU"
                            if stack.zero_single_rank_with else ""))
    policy = setup.recompute_policy
    if policy not in stack.policies:
        # none/selective/full: every stack's own meaning; the other policies name the stacks that run them
        owners = [] if policy in COMMON_RECOMPUTE else _stacks.running(lambda st: policy in st.policies)
        raise SetupError(f"--recompute {setup.recompute} is not a {stack.name} policy; {stack.name} runs: "
                         f"{', '.join(p + (':N' if p in RECOMPUTE_PATTERNS else '') for p in stack.policies)}"
                         + (f"; use --stack {' or '.join(owners)}" if owners else ""))
    if setup.mtp_layers and not stack.runs("mtp"):
        raise SetupError(f"--mtp-layers: --stack {stack.name} does not train multi-token-prediction layers "
                         f"(transformers does not build them); use --stack {_runners('mtp')}, or drop --mtp-layers")
    if setup.recompute_modules is not None:
        if not stack.runs("recompute-modules"):
            raise SetupError(f"--recompute-modules names Megatron-Core's recompute modules; --stack {stack.name} "
                             f"chooses what to recompute with --recompute alone (or use --stack "
                             f"{_runners('recompute-modules')})")
        if setup.recompute_policy != "selective":
            raise SetupError(f"--recompute-modules applies under --recompute selective (Megatron's "
                             f"recompute_granularity 'selective'), not --recompute {setup.recompute}: add "
                             "--recompute selective, or drop --recompute-modules")
    _check_long_context(setup, stack)
    if setup.offload_activations and not stack.runs("activation-offload"):
        raise SetupError(f"--offload activations is torchtune's activation offloading, modelled on --stack "
                         f"{_runners('activation-offload')}; --stack {stack.name} does not run it")
    if setup.offload_layers and not stack.runs("cpu-offloading"):
        raise SetupError(f"--offload-layers is Megatron's activation CPU offloading (--cpu-offloading-num-layers), "
                         f"modelled on --stack {_runners('cpu-offloading')}; --stack {stack.name} does not run it"
                         + ("; --offload activations is its own" if stack.runs("activation-offload") else ""))
    if setup.loss_fusion != "none" and not stack.runs("cross-entropy-fusion"):
        raise SetupError(f"--loss-fusion is Megatron's fused cross-entropy (--cross-entropy-loss-fusion), modelled on "
                         f"--stack {_runners('cross-entropy-fusion')}; --stack {stack.name} does not run it")
    for name in ("cp", "ep", "vpp", "pp_split", "offload", "etp", *EXCHANGE, "tp_comm_overlap",
                 "overlap_param_gather", "overlap_comm", "cuda_graph_scope"):
        _check_axis(setup, stack, name)
    if setup.tp_comm_overlap and (setup.tp <= 1 or not setup.sequence_parallel):
        # the overlap splits sequence parallelism's all-gathers and reduce-scatters (Megatron-LM core_v0.16.1
        # arguments.py:915-916 asserts it; torchtitan's TP is sequence-parallel: parallel/tp_overlap.py)
        raise SetupError("--tp-comm-overlap overlaps the tensor-parallel all-gathers and reduce-scatters of sequence "
                         "parallelism: it needs --tp > 1 and --sequence-parallel")
    if setup.overlap_param_gather and setup.zero < 1:
        # Megatron-LM core_v0.16.1 arguments.py:597-599: only with the distributed optimizer or Megatron-FSDP
        raise SetupError("--overlap-param-gather overlaps the distributed optimizer's parameter all-gather: it needs "
                         "--zero 1 (or Megatron-FSDP's --zero 2 / 3)")
    if setup.overlap_comm and setup.zero not in stack.fact("overlap_comm", "choice"):
        # DeepSpeed 0.19.8 runtime/zero/config.py:384-386 (ZeRO-3 overlaps by default); ZeRO-0 reduces in
        # engine.allreduce_gradients after the backward (runtime/engine.py:3088-3095), which overlap_comm does not move
        raise SetupError("--overlap-comm overlaps DeepSpeed's ZeRO-1/2 gradient reduction with the backward: it needs "
                         "--zero 1 or 2 (ZeRO-3 overlaps by default)")
    _check_dispatcher(setup)
    if setup.vpp > 1 and setup.pp == 1:
        raise SetupError("--vpp interleaves model chunks over pipeline stages: it needs --pp > 1")
    if setup.pp_split != "even" and setup.pp == 1:
        raise SetupError("--pp-split splits layers over pipeline stages: it needs --pp > 1")
    # (a vision-language model's --seq is its text: the sequence split is the language model's, text + image tokens,
    # which analytic/vlm.py language_setup checks)
    if setup.cp > 1 and not setup.images and setup.seq % (2 * setup.cp):
        raise SetupError(f"--cp {setup.cp} splits each sequence into 2 × cp = {2 * setup.cp} load-balanced chunks: "
                         f"--seq {setup.seq} must be divisible by {2 * setup.cp}")
    why = stack.refuse(setup)  # the stack's rules that are code (stacks/<name>.py)
    if why:
        raise SetupError(why)
    if setup.offload_state == "optimizer" and setup.zero < 1 and not stack.runs("cpu-offload-optimizer"):
        raise SetupError("--offload optimizer moves ZeRO's optimizer partitions to the host: it needs --zero 1, 2 or 3")
    if setup.offload_state == "params" and setup.zero < 3:
        kind = (f"FSDP{setup.fsdp_version or 2} CPU offload" if stack.facts.get("cpu_offload") else "ZeRO-Infinity")
        raise SetupError(f"--offload params ({kind}) offloads the sharded weights: it needs --zero 3")
    if setup.zero not in stack.zero_stages:
        raise SetupError(f"--zero {setup.zero} is not run by --stack {stack.name} (it runs ZeRO stages "
                         f"{', '.join(map(str, stack.zero_stages))}); use one of those"
                         + _or_stacks(stack, lambda st: setup.zero in st.zero_stages))
    if setup.mode == "train" and setup.precision not in stack.precisions:
        raise SetupError(f"--precision {setup.precision} is not run by --stack {stack.name} (it runs "
                         f"{', '.join(stack.precisions)}); use one of those"
                         + _or_stacks(stack, lambda st: setup.precision in st.precisions))
    if setup.mode == "train" and setup.optimizer not in stack.optimizers:
        raise SetupError(f"--optimizer {setup.optimizer} is not built by --stack {stack.name} (it builds "
                         f"{', '.join(stack.optimizers)}); use one of those"
                         + _or_stacks(stack, lambda st: setup.optimizer in st.optimizers))
    if setup.optimizer_impl is not None and setup.optimizer in BNB_OPTIMIZERS:
        raise SetupError(f"--optimizer-impl: --optimizer {setup.optimizer} runs bitsandbytes' own in-place kernel; "
                         "drop --optimizer-impl")
    if setup.optimizer_impl is not None and setup.optimizer in TORCHAO_OPTIMIZERS:
        raise SetupError(f"--optimizer-impl: --optimizer {setup.optimizer} runs torchao's own compiled per-parameter "
                         "step; drop --optimizer-impl")
    if setup.liger and not stack.runs("liger-loss"):  # (the stacks that apply Liger's model patches: analytic/liger.py)
        raise SetupError(f"--liger patches an HF model with Liger's kernels (TRL, ArcticTraining): use --stack "
                         f"{_runners('liger-loss')}, or drop --liger")
    if setup.loss != "full" and (not stack.runs("liger-loss") or setup.head not in (None, "causal-lm")):
        raise SetupError(f"--loss {setup.loss}{' (--liger)' if setup.liger else ''} replaces a causal LM's head and "
                         "loss as Liger's, TRL's and flash-attn's kernels do in the HF stack: use "
                         f"--stack {_runners('liger-loss')} with a causal-lm head")
    micro_batch_rules(setup)
    if setup.optimizer_in_backward:
        if setup.dp > 1 or setup.tp > 1 or setup.pp > 1:
            raise SetupError("--optimizer-in-backward is modelled on one GPU (torchtune's single-device recipe): "
                             "drop --dp/--tp/--pp")
        if not stack.runs("optimizer-in-backward"):
            raise SetupError(f"--optimizer-in-backward: --stack {stack.name} steps the optimizer after the backward; "
                             f"use --stack {_runners('optimizer-in-backward')}")
        if setup.precision == "bf16-master":
            raise SetupError("--optimizer-in-backward steps each parameter in its own dtype: use --precision bf16 or "
                             "amp-bf16, not bf16-master")
    if setup.max_grad_norm is not None:
        _validate_grad_clip(setup, stack)
    if setup.optimizer_impl == "fused" and setup.optimizer not in _stacks.FUSABLE:
        raise SetupError(f"--optimizer-impl fused: torch.optim has no fused {setup.optimizer}; use foreach or "
                         "for-loop")
    if stack.trains != "any" and setup.head not in (None, "causal-lm"):
        raise SetupError(f"--stack {stack.name} trains causal language models, not a {setup.head} head (--head, or the "
                         f"config's architectures): use --stack {' or '.join(trains_any())}")
    # (--stack names a training stack: serving and inference split the model as their engines do)
    why = (setup.mode == "train" and stack.splits_model(setup.tp, setup.pp)) or (setup.compile and stack.compiles())
    if why:  # (--sequence-parallel needs --tp > 1: refused above)
        raise SetupError(why)
    _check_compile_loss(setup, stack)
    _check_low_precision(setup, stack)
    if setup.doc_len is not None:
        _check_packing(setup, stack)
    _check_moe_routing(setup, stack)
    if setup.grad_reduce_in_bf16:
        _check_grad_reduce(setup, stack)
    _check_fsdp(setup, stack)
    if (setup.dora or setup.lora_targets != "all-linear") and not setup.lora_rank:
        raise SetupError(f"{'--dora' if setup.dora else '--lora-targets'} configures LoRA adapters: it needs "
                         "--lora-rank R > 0")
    if mode == "serve":
        _validate_serve(setup)
        return
    if mode == "rl":
        _validate_rl(setup)
    if setup.quant and not setup.lora_rank:
        raise SetupError("--quant freezes the base weights, which leaves nothing to train without adapters: it needs "
                         "--lora-rank R > 0 (QLoRA)")
    if setup.kbit_prep is not None and setup.quant not in QUANTS:
        raise SetupError("--kbit-prep prepares a bitsandbytes-quantised base for training: it needs --quant nf4, fp4 "
                         "or int8")
    if setup.kbit_prep not in (None, "none"):
        why = inert_preparation(setup, stack)
        if why:
            raise SetupError(f"--kbit-prep {setup.kbit_prep}: {why}: drop --kbit-prep")
    if setup.quant == "int8" and setup.dora:
        raise SetupError("--dora with --quant int8: peft 0.21's DoRA fails on bitsandbytes 0.50's LLM.int8 layers "
                         "(their row scales are moved out of the weight at the first forward); use --quant nf4")
    if setup.lora_dtype != "fp32" and not setup.lora_rank:
        raise SetupError("--lora-dtype sets the LoRA adapters' dtype: it needs --lora-rank R > 0")
    if setup.tf32 and _precision.PRECISIONS[setup.precision].compute != "fp32":
        raise SetupError(f"--tf32 runs fp32 matmuls on TF32 tensor cores; --precision {setup.precision} has none: "
                         "use --precision fp32, or drop --tf32")
    if setup.quant and not stack.runs("quant"):
        raise SetupError(f"--quant: --stack {stack.name} does not load bitsandbytes-quantised models; use --stack "
                         f"{_runners('quant')}")
    if setup.lora_rank and not stack.fact("peft", "supported"):
        raise SetupError(f"--lora-rank: --stack {stack.name} does not run peft's adapters; use --stack hf or "
                         "--stack deepspeed")
    if setup.attention == "triton":
        _validate_triton_attention(setup, stack)
    if setup.attention == "flash2" and (setup.device != "cuda" or setup.precision == "fp32"):
        raise SetupError("--attention flash2 is FlashAttention-2's CUDA kernel, 16-bit only: use --device cuda with a "
                         "16-bit precision, or --attention sdpa")
    if setup.recompute == "selective" and stack.fact("recompute", "selective") == "attention" \
            and setup.attention_kernel != "eager":
        raise SetupError(f"--recompute selective recomputes the attention scores, which --attention "
                         f"{setup.attention_kernel} never stores: it would equal --recompute none; use --attention "
                         "eager, or --recompute full")


def inert_preparation(setup: Setup, stack: _stacks.Stack) -> str | None:
    """Why a k-bit preparation (--kbit-prep peft or norms) changes no dtype of the step, None where it does: its
    upcast undone by the engine's cast of every parameter (DeepSpeed 0.19.8 runtime/engine.py:2080-2088, 1859-1862),
    or nothing to upcast, since it casts bf16/fp16 parameters only (peft 0.21.2 utils/other.py:204-209). Refused
    when given (validate), and no preparation in force (analytic/kbit_prep.py in_force)."""
    if stack.casts_parameters:
        return (f"--stack {stack.name}'s engine casts every parameter to the model dtype when it wraps the model, so "
                "nothing the preparation keeps in fp32 stays fp32")
    if _precision.PRECISIONS[setup.precision].weight == "fp32":
        return (f"it casts the bf16/fp16 parameters --quant leaves to fp32; under --precision {setup.precision} they "
                "are fp32 already")
    return None


def _check_moe_routing(setup: Setup, stack: _stacks.Stack) -> None:
    """--moe-imbalance, --moe-force-balance, --moe-capacity-factor: the busiest expert-parallel rank's load
    (analytic/moe_imbalance.py), on a stack that runs expert parallelism and the router option ([moe] facts)."""
    if setup.moe_imbalance is not None and "ep" not in stack.axes:
        raise SetupError(f"--moe-imbalance is the busiest expert-parallel rank's load; --stack {stack.name} runs no "
                         "expert parallelism (every rank holds every expert, none is busier): use --stack "
                         f"{' or '.join(_stacks.running(lambda st: 'ep' in st.axes))} with --ep, or drop it")
    for name, fact in (("moe_force_balance", "force_balance"), ("moe_capacity_factor", "capacity_factor")):
        if getattr(setup, name) not in (None, False) and not stack.facts.get("moe", {}).get(fact):
            runs = _stacks.running(lambda st: bool(st.facts.get("moe", {}).get(fact)))
            raise SetupError(f"{BY_NAME[name].flag}: --stack {stack.name} has no such router option; use --stack "
                             f"{' or '.join(runs)}, or drop it")
    if setup.moe_force_balance and setup.moe_imbalance is not None:
        raise SetupError("--moe-force-balance makes routing a uniform draw, whose imbalance is derived; --moe-imbalance "
                         "sets it: give one of them")


def _check_grad_reduce(setup: Setup, stack: _stacks.Stack) -> None:
    """--grad-reduce-in-bf16: a stack whose grad buffer has the option ([grad_buffer] param_dtype_option), under the
    one precision whose buffer it changes (fp32 under --bf16; --fp16 and fp32 runs already reduce in the param
    dtype)."""
    if not stack.facts.get("grad_buffer", {}).get("param_dtype_option"):
        runs = _stacks.running(lambda st: bool(st.facts.get("grad_buffer", {}).get("param_dtype_option")))
        raise SetupError(f"--grad-reduce-in-bf16: --stack {stack.name} has no such option; use --stack "
                         f"{' or '.join(runs)}, or drop it")
    if setup.precision != "bf16-master":
        raise SetupError(f"--grad-reduce-in-bf16 keeps --precision bf16-master's gradients in bf16; under --precision "
                         f"{setup.precision} they already have the param dtype: drop it")


def _check_long_context(setup: Setup, stack: _stacks.Stack) -> None:
    """--ulysses, --tiled-mlp, --loss tiled and the stack's --offload activations variant (analytic/long_context.py):
    on the stacks whose [features] run them, with the layouts DeepSpeed's Ulysses takes (stacks/*.toml [ulysses])."""
    n = setup.ulysses
    for on, feature, flag in ((n > 1, "ulysses", f"--ulysses {n}"),
                              (setup.tiled_mlp is not None, "tiled-mlp", "--tiled-mlp"),
                              (setup.loss == "tiled", "tiled-loss", "--loss tiled")):
        if on and not stack.runs(feature):
            raise SetupError(f"{flag} is ArcticTraining's long-sequence recipe on an HF model under DeepSpeed; --stack "
                             f"{stack.name} does not run it: use --stack {_runners(feature)}")
    if (setup.tiled_mlp is not None or setup.loss == "tiled") and setup.mode != "train":
        raise SetupError("--tiled-mlp and --loss tiled tile a training step's MLP and loss: use --mode train")
    if n > 1:
        facts = stack.facts["ulysses"]
        if setup.dp % n:
            raise SetupError(f"--ulysses {n}: DeepSpeed builds its sequence-parallel groups out of the data-parallel "
                             f"ranks (world % sp == 0): --dp {setup.dp} must be a multiple of {n}")
        if setup.tp > 1 or setup.pp > 1 or setup.cp > 1:
            raise SetupError(f"--ulysses {n} is modelled on data-parallel ranks only (DeepSpeed's ZeRO engine): drop "
                             "--tp/--pp/--cp")
        if setup.seq % n:
            raise SetupError(f"--ulysses {n}: each rank takes seq / {n} tokens (UlyssesSPDataLoaderAdapter needs "
                             f"seqlen % sp == 0): --seq {setup.seq} is not a multiple of {n}")
        if setup.attention_kernel not in facts["attention"]:
            raise SetupError(f"--ulysses {n} with --attention {setup.attention_kernel}: UlyssesSPAttentionHF runs "
                             f"{', '.join(facts['attention'])} only (eager builds the full mask it drops)")
        if facts.get("precision") and setup.precision != facts["precision"]:
            raise SetupError(f"--ulysses {n} on --stack {stack.name} runs through its DeepSpeed integration: use "
                             f"--precision {facts['precision']}")
    if setup.offload_activations and stack.facts.get("activation_offload", {}).get("needs_recompute") \
            not in (None, setup.recompute):
        need = stack.facts["activation_offload"]["needs_recompute"]
        raise SetupError(f"--offload activations on --stack {stack.name} offloads each checkpointed layer's input "
                         f"(ArcticTraining's CheckpointFunction): it needs --recompute {need}")


def _check_fsdp(setup: Setup, stack: _stacks.Stack) -> None:
    """--fsdp-version, --fsdp-param-dtype, --fsdp-reduce-dtype: FSDP runs (--dp > 1, --zero 2/3) on a stack that
    names the values it runs ([fsdp] versions, param_dtypes, reduce_dtypes); the policy over fp32 shards (an amp-*
    precision) with a low-precision param_dtype that is the precision's own compute dtype."""
    given = [n for n in ("fsdp_version", "fsdp_param_dtype", "fsdp_reduce_dtype") if getattr(setup, n) is not None]
    if not given:
        return
    flags = " and ".join(BY_NAME[n].flag for n in given)
    fsdp = stack.facts.get("fsdp", {})
    if "versions" not in fsdp:
        runs = _stacks.running(lambda st: "versions" in st.facts.get("fsdp", {}))
        raise SetupError(f"{flags}: --stack {stack.name} does not run torch FSDP; use --stack {' or '.join(runs)}, "
                         "or drop it")
    if setup.dp == 1 or setup.zero < 2:
        raise SetupError(f"{flags} configures FSDP, which runs under --zero 2/3 with --dp > 1: add them, or drop it")
    for name, key in (("fsdp_version", "versions"), ("fsdp_param_dtype", "param_dtypes"),
                      ("fsdp_reduce_dtype", "reduce_dtypes")):
        value = getattr(setup, name)
        if value is not None and value not in fsdp[key]:
            raise SetupError(f"{BY_NAME[name].flag} {value}: --stack {stack.name} runs "
                             f"{', '.join(map(str, fsdp[key]))} only (stacks/{stack.name}.toml [fsdp]); use "
                             f"{'it' if len(fsdp[key]) == 1 else 'one of those'}, or drop it")
    if setup.fsdp_param_dtype is None and setup.fsdp_reduce_dtype is None:
        return
    pol = _precision.PRECISIONS[setup.precision]
    if not pol.autocast:
        raise SetupError(f"--fsdp-param-dtype/--fsdp-reduce-dtype set FSDP's mixed-precision policy over fp32 shards; "
                         f"--precision {setup.precision} has none: use --precision amp-bf16 or amp-fp16")
    if setup.fsdp_param_dtype not in (None, "none", "fp32", pol.compute):
        raise SetupError(f"--fsdp-param-dtype {setup.fsdp_param_dtype}: --precision {setup.precision} computes in "
                         f"{pol.compute}; use {pol.compute}, fp32 or none")


def _either(names) -> str:
    """'a, b or c'."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))


def _or_stacks(stack, test) -> str:
    """A refusal's "or --stack ..." naming the other stacks for which `test(stack)` holds ("" when none does): not the
    stack refused, which "--stack hf" named when it was hf (--precision fp16-master: megatron and deepspeed run it)."""
    others = [n for n in _stacks.running(test) if n != stack.name]
    return f" or --stack {' or '.join(others)}" if others else ""


def _runners(feature: str) -> str:
    """The stacks that run a [features] feature, for a refusal's "use --stack ..." (hf for trainfit's own)."""
    return " or ".join(_stacks.running(lambda st: st.runs(feature)))


def trains_any() -> list[str]:
    """The stacks that train any transformers model ([model] any): heads, vision models, a user's module."""
    return _stacks.running(lambda st: st.trains == "any")


def _check_axis(setup: Setup, stack, name: str) -> None:
    """A parallel axis or switch the stack may run (stacks/*.toml [parallel] axes); a switch left off asks for
    nothing."""
    if getattr(setup, name, None) is False:
        return
    # --offload's state part (its activations part: validate)
    value = setup.offload_state if name == "offload" else getattr(setup, name)
    if name == "offload" and value == "params" and stack.facts.get("cpu_offload") is not None:
        return  # FSDP2's CPUOffloadPolicy (analytic/parallel/fsdp_offload.py): needs --zero 3, validate
    if name == "offload" and value == "optimizer" and stack.runs("cpu-offload-optimizer"):
        cpu_offload_rules(setup)  # torchao's CPUOffloadOptimizer (analytic/torchao_optim.py)
        return
    if (value is True or value not in (1, "even", "none", None)) and name not in stack.axes:
        runs = _stacks.running(lambda st: name in st.axes)
        why = stack.axis_why_not(name)
        raise SetupError(f"{BY_NAME[name].flag} is not run by --stack {stack.name}"
                         + (f" ({why})" if why else "") + f"; use --stack {' or '.join(runs)}")


def _check_dispatcher(setup: Setup) -> None:
    """The MoE token dispatcher's own rules: expert parallelism to dispatch over, its SMs for deepep / hybridep;
    DeepEP's group sizes (deepep_buffers.groups: the keys of its config maps, which get_buffer reads over the
    dispatcher's group: megatron-core 0.16.1 moe/fused_a2a.py:33-47, over tp × ep, token_dispatcher.py:1347-1350;
    torchtitan 0.2.2 distributed/deepep/deepep.py:294-317, over ep) and its even SM count (DeepEP v1.2.1
    deep_ep/buffer.py:144-153 set_num_sms, which Megatron calls with --moe-deepep-num-sms: fused_a2a.py:258-260)."""
    if setup.moe_dispatcher is not None and setup.ep <= 1:
        raise SetupError(f"--moe-dispatcher {setup.moe_dispatcher} sends tokens to experts on other expert-parallel "
                         "ranks: it needs --ep > 1")
    if setup.moe_dispatcher == "deepep" and setup.ep > 1:
        group, runs = deepep_buffers.group(setup), deepep_buffers.groups()
        if group not in runs:
            what = f"--ep {setup.ep}" + (f" × --etp {setup.expert_tp} = {group}" if setup.expert_tp > 1 else "")
            raise SetupError(f"--moe-dispatcher deepep over {what} ranks: DeepEP runs groups of "
                             f"{', '.join(map(str, runs))} ranks only (deep_ep Buffer.get_dispatch_config "
                             "asserts it); use another --ep, or --moe-dispatcher alltoall")
    if setup.moe_dispatcher_sms is not None and setup.moe_dispatcher not in ("deepep", "hybridep"):
        raise SetupError("--moe-dispatcher-sms sets the SMs of the deepep / hybridep dispatcher's kernels: it needs "
                         "--moe-dispatcher deepep or hybridep")
    if setup.moe_dispatcher == "deepep" and (setup.moe_dispatcher_sms or 0) % 2:
        raise SetupError(f"--moe-dispatcher-sms {setup.moe_dispatcher_sms}: DeepEP takes an even SM count (deep_ep "
                         f"Buffer.set_num_sms asserts it); use {setup.moe_dispatcher_sms + 1}")


# The expert exchange's settings: how the MoE tokens move between ranks, which no other setting's rule reads
EXCHANGE = ("moe_dispatcher", "moe_dispatcher_sms", "overlap_moe_comm")


def exchange_rules(setup: Setup, changed: frozenset) -> None:
    """The rules of a validated setup whose EXCHANGE settings alone changed (Setup.with_exchange checks only these):
    their values and modes, the stack's axes, the dispatcher's rules and the stack's code rules (stacks/<name>.py
    refuse, which read them beside settings already checked: run whole)."""
    names = [n for n in EXCHANGE if n in changed]  # (validate's order: the same refusal named first)
    for name in names:
        check_value(BY_NAME[name], getattr(setup, name), setup.mode)
    refuse_inapplicable(setup, _SETUP_SETTINGS, setup.mode, changed)
    stack = _stacks.get_stack(setup.stack, setup.stack_release)
    for name in names:
        _check_axis(setup, stack, name)
    _check_dispatcher(setup)
    why = stack.refuse(setup)
    if why:
        raise SetupError(why)


def micro_batch_rules(setup: Setup) -> None:
    """The rules of a training setup that read --batch or --grad-accum (Setup.with_micro_batches checks only these):
    their values, and no accumulation with the optimizer in the backward."""
    for name in ("batch", "grad_accum"):
        check_value(BY_NAME[name], getattr(setup, name), setup.mode)
    if setup.optimizer_in_backward and setup.grad_accum > 1:
        # torchtune full_finetune_single_device.py _setup_optimizer / train: one optimizer per parameter stepped in
        # a post-accumulate-grad hook; it raises for gradient accumulation ("Gradient accumulation is not supported
        # with optimizer in bwd") since each gradient is applied the moment it is made
        raise SetupError("--optimizer-in-backward applies each gradient as soon as it is made: it cannot "
                         "accumulate micro-batches; use --grad-accum 1 (raise --batch instead)")


def _validate_grad_clip(setup: Setup, stack: _stacks.Stack) -> None:
    """--max-grad-norm: where the stack clips (stacks/*.toml [grad_clip]) and a total norm exists."""
    if not stack.max_grad_norm:
        raise SetupError(f"--max-grad-norm: --stack {stack.name} does not clip (no [grad_clip] fact); drop it")
    if setup.max_grad_norm == 0 and "zero" in stack.facts["grad_clip"]:  # a stack that cannot turn its clip off
        raise SetupError(f"--max-grad-norm 0: {stack.fact('grad_clip', 'zero')}; use a positive value")
    if setup.max_grad_norm > 0 and setup.optimizer_in_backward:
        raise SetupError("--max-grad-norm with --optimizer-in-backward: each gradient is applied as soon as it is "
                         "made, so there is no total norm to clip to (torchtune refuses clip_grad_norm with "
                         "optimizer_in_bwd); drop --max-grad-norm")


def _validate_triton_attention(setup: Setup, stack: _stacks.Stack) -> None:
    """--attention triton: Dao's FlashAttention in Triton as llm-foundry vendors it (llmfoundry/models/layers/
    flash_attn_triton.py `_flash_attn_forward`: asserts q.dtype in [float16, bfloat16]; Triton kernels run on the
    GPU only), called by MPT's attn_impl: triton (layers/attention.py triton_flash_attn_fn)."""
    if setup.device != "cuda":
        raise SetupError("--attention triton is a Triton GPU kernel: --device cpu runs sdpa or eager")
    if not stack.runs("triton-attention"):
        raise SetupError(f"--attention triton is llm-foundry's kernel, modelled on --stack "
                         f"{_runners('triton-attention')}; --stack {stack.name} runs SDPA: use --attention flash")
    if _precision.PRECISIONS[setup.precision].compute == "fp32":
        raise SetupError(f"--attention triton runs fp16/bf16 only (flash_attn_triton.py asserts it); --precision "
                         f"{setup.precision} computes in fp32: use amp-bf16, bf16 or fp16")


def _validate_serve(setup: Setup) -> None:
    """--mode serve: a GPU engine, and vLLM's own limits (config/cache.py CacheDType: no fp32 or int8 KV cache)."""
    sglang = serving_versions.engine_of(setup.server) == "sglang"
    if setup.device != "cuda":
        raise SetupError("--mode serve models a serving engine on a GPU, not a step on this CPU (--device cpu): "
                         "`trainfit estimate --mode serve --gpu GPU` answers it, without --device cpu (an inference "
                         "step here: --mode infer)")
    # (an fp32 model's own dtype is the engines' "auto" KV dtype, vLLM config/cache.py CacheDType, SGLang's
    # --kv-cache-dtype auto: what the estimate sizes and plan --emit writes as the default, emit_vllm.py)
    own = setup.kv_dtype == "fp32" and setup.precision == "fp32"
    if setup.kv_dtype is not None and setup.kv_dtype not in SERVE_KV_DTYPES and not own:
        raise SetupError(f"--kv-cache-dtype {setup.kv_dtype}: {'SGLang' if sglang else 'vLLM'} "
                         f"caches KV in {_either(SERVE_KV_DTYPES)} (or the model's own dtype: auto); choose one of "
                         "those")
    if sglang and setup.kv_dtype == "fp16" and setup.precision != "fp16":
        raise SetupError("--kv-cache-dtype fp16: SGLang's KV dtypes are auto (the model's), bf16 and fp8 "
                         "(sglang/srt/arg_groups/fields/model.py:197-219); use --precision fp16 or another KV dtype")
    refuse_other_server([BY_NAME[n] for n in other_server_settings(setup.server)
                         if getattr(setup, n) != BY_NAME[n].default], setup.server)
    if setup.quant and setup.precision == "fp32":
        raise SetupError(f"--quant {setup.quant} runs 16-bit activations in vLLM: use --precision bf16 or fp16")
    if setup.speculative_algorithm == "nextn" and setup.draft_model:
        raise SetupError("--speculative-algorithm nextn drafts with the target's own MTP layers: drop --draft-model")
    if setup.speculative_algorithm in ("eagle", "eagle3") and not setup.draft_model:
        raise SetupError(f"--speculative-algorithm {setup.speculative_algorithm} needs its draft head: add "
                         "--draft-model (the head's config.json)")


def _validate_rl(setup: Setup) -> None:
    """--mode rl: TRL's colocated loop on one GPU, or verl's / OpenRLHF's placements on --dp GPUs (analytic/rl.py,
    analytic/rl_placement.py); the settings of the other algorithm, rollout or placement refused."""
    if setup.tp > 1 or setup.pp > 1 or setup.cp > 1:
        raise SetupError("--mode rl: the actor's --tp/--pp/--cp (verl's Megatron actor) are not modelled; the actor "
                         "runs data-parallel (--dp, --zero 3 for FSDP) and the engine's tensor parallelism is "
                         "--rollout-tp")
    _validate_rl_placement(setup)
    completions = setup.batch * setup.group_size
    if completions % setup.grad_accum:
        raise SetupError(f"--mode rl: --batch {setup.batch} prompts × --group-size {setup.group_size} = {completions} "
                         f"completions do not split into --grad-accum {setup.grad_accum} equal micro-batches (TRL "
                         "requires it); choose a --grad-accum that divides them")
    if setup.critic_model is not None and setup.rl_algo != "ppo":
        raise SetupError(f"--critic-model is PPO's value model; --rl-algo {setup.rl_algo} has no critic: drop it or "
                         "use --rl-algo ppo")
    if setup.rl_algo == "ppo" and setup.lora_rank:
        # the critic trains with the policy's settings (analytic/rl.py train_setup), and the analytic LoRA is a causal
        # LM's (analytic/lora.py linears); the trace and measure engines run GRPO only
        raise SetupError("--lora-rank with --rl-algo ppo: PPO's critic, a token-classification value model, would "
                         "train adapters too, which is not modelled (LoRA is modelled on causal LMs; --engine trace "
                         "and measure run GRPO only): drop --lora-rank or use --rl-algo grpo")
    if setup.vllm_gpu_memory_utilization != BY_NAME["vllm_gpu_memory_utilization"].default and setup.rollout != "vllm":
        raise SetupError("--vllm-gpu-memory-utilization sizes the colocated vLLM engine: it needs --rollout vllm")
    if setup.rollout == "vllm":
        if setup.device != "cuda":
            raise SetupError("--rollout vllm is a GPU engine: --device cpu does not apply (use --rollout hf)")
        if setup.kv_dtype is not None and setup.kv_dtype not in SERVE_KV_DTYPES:
            raise SetupError(f"--kv-cache-dtype {setup.kv_dtype}: vLLM caches KV in {_either(SERVE_KV_DTYPES)}; "
                             "choose one of those")


def _validate_rl_placement(setup: Setup) -> None:
    """--rl-placement, --rollout-tp, the phase offloads and vLLM's sleep level (analytic/rl_placement.py)."""
    if setup.rollout_tp > 1:
        if setup.rollout != "vllm":
            raise SetupError("--rollout-tp is the vLLM engine's tensor parallelism: it needs --rollout vllm")
        if setup.dp % setup.rollout_tp:
            # OpenRLHF asserts actor GPUs == vllm.num_engines × vllm.tensor_parallel_size (train_ppo_ray.py:57-63)
            raise SetupError(f"--rollout-tp {setup.rollout_tp} does not divide --dp {setup.dp}: the engines of "
                             f"--rollout-tp GPUs each must tile the --dp GPUs; choose a --rollout-tp dividing --dp")
    if setup.rl_placement == "split" and setup.rollout != "vllm":
        raise SetupError("--rl-placement split puts the rollout on its own GPUs as vLLM engines (OpenRLHF's "
                         "--vllm.num_engines): it needs --rollout vllm")
    offloads = [BY_NAME[n].flag for n in ("actor_param_offload", "actor_optimizer_offload", "ref_param_offload")
                if getattr(setup, n)]
    if offloads and (setup.rl_placement != "colocated" or setup.rollout != "vllm"):
        raise SetupError(f"{', '.join(offloads)}: the phase offloads of verl's hybrid engine are modelled with "
                         "--rl-placement colocated and --rollout vllm; add those or drop them")
    if setup.ref_param_offload and (setup.beta == 0 or setup.lora_rank):
        raise SetupError("--ref-param-offload moves the reference model's weights, and this step loads none (--beta "
                         "0, or --lora-rank: the policy with its adapters off is the reference): drop it")
    if setup.vllm_sleep_level:
        if setup.rollout != "vllm":
            raise SetupError("--vllm-sleep-level is vLLM's sleep mode: it needs --rollout vllm")
        if setup.rl_placement != "colocated":
            raise SetupError("--vllm-sleep-level frees the engine's memory for the models sharing its GPUs; with "
                             "--rl-placement split nothing shares them: drop it")


def _check_compile_loss(setup, stack) -> None:
    """--compile-loss: a stack whose compile takes the loss as its own component ([compile] loss_only), in a
    release that compiles the loss ([compile] loss), and not beside --compile, which compiles it already."""
    if not setup.compile_loss:
        return
    if not stack.facts["compile"].get("loss_only"):
        raise SetupError(f"--compile-loss: --stack {stack.name} has no loss-only compile (its compile, where it has "
                         "one, takes the whole model or nothing): drop --compile-loss")
    if not stack.facts["compile"].get("loss", True):
        raise SetupError(f"--compile-loss: --stack {stack.name} at this --stack-release runs its loss eager (it "
                         "could not compile it): drop --compile-loss")
    if setup.compile:
        raise SetupError(f"--compile-loss with --compile: --stack {stack.name}'s --compile compiles the loss too; "
                         "drop --compile-loss")


def _check_packing(setup, stack) -> None:
    """--doc-len: the stacks whose step runs packed documents apart ([packing] in stacks/*.toml), with the kernel
    that skips the pairs across documents (analytic/packing.py), documents no longer than a sequence."""
    facts = stack.facts.get("packing", {})
    if not facts.get("supported"):
        runs = _stacks.running(lambda st: st.facts.get("packing", {}).get("supported", False))
        raise SetupError(f"--doc-len packs documents into a sequence, which trainfit models on --stack "
                         f"{' or '.join(runs)} only ({facts.get('why') or stack.name + ' has no packed-batch path here'})"
                         "; drop --doc-len")
    if setup.attention_kernel not in facts.get("kernels", ()):
        raise SetupError(f"--doc-len with --attention {setup.attention}: {facts['why_kernel']}; use --attention "
                         f"{' or '.join(facts.get('kernels', ()))}, or drop --doc-len")
    if setup.doc_len > setup.seq:
        raise SetupError(f"--doc-len {setup.doc_len} is longer than --seq {setup.seq}: a packed document fits in its "
                         "sequence; use --doc-len <= --seq")


def _check_low_precision(setup, stack) -> None:
    """--low-precision and its companions: a recipe the stack runs (stacks/<stack>.toml [low_precision] recipes),
    the fp8 all-gather where the stack has one and the layout shards weights, bf16 layers only beside a recipe."""
    lp = setup.low_precision
    if lp != "none" and lp not in stack.fact("low_precision", "recipes"):
        runs = _stacks.running(lambda st: lp in st.fact("low_precision", "recipes"))
        why = stack.facts["low_precision"].get("why") or f"it runs {', '.join(stack.fact('low_precision', 'recipes'))}"
        raise SetupError(f"--low-precision {lp} is not run by --stack {stack.name} ({why})"
                         + (f"; use --stack {' or '.join(runs)}" if runs else ""))
    if lp in stack.facts["low_precision"].get("refuse_tp_compile", ()) and setup.tp > 1 and setup.compile:
        raise SetupError(f"--low-precision {lp} with --tp > 1 and --compile is refused by --stack {stack.name} "
                         "(its converter asserts it): drop --compile or --tp")
    if setup.mx_scale != "floor":
        # (the roundings a stack runs: its [low_precision] mx_cast_kernels)
        scales = stack.facts["low_precision"].get("mx_cast_kernels", {})
        if lp != "mxfp8" or setup.mx_scale not in scales:
            runs = _stacks.running(
                lambda st: setup.mx_scale in st.facts.get("low_precision", {}).get("mx_cast_kernels", {}))
            raise SetupError(f"--mx-scale {setup.mx_scale} picks torchao's MX scale rounding: it needs --low-precision "
                             f"mxfp8 on --stack {' or '.join(runs)}; drop it")
    if (setup.bf16_first_layers or setup.bf16_last_layers) and lp == "none":
        raise SetupError("--bf16-first-layers / --bf16-last-layers keep layers out of a low-precision recipe: they "
                         "need --low-precision")
    if setup.fp8_all_gather:
        gathers = stack.fact("low_precision", "all_gather")
        if not gathers:
            raise SetupError(f"--fp8-all-gather gathers weights in a low-precision recipe's format, and --stack "
                             f"{stack.name} runs none ({stack.fact('low_precision', 'why')}): drop it")
        if lp not in gathers:
            raise SetupError(f"--fp8-all-gather: --stack {stack.name} gathers weights in the recipe's format only "
                             f"under --low-precision {' or '.join(gathers)}")
        zero = stack.fact("low_precision", "all_gather_zero")
        if setup.dp < 2 or setup.zero < zero:
            raise SetupError(f"--fp8-all-gather applies to sharded weights: it needs --dp > 1 and --zero {zero}"
                             f"{' or more' if zero < 3 else ''} on --stack {stack.name}")


def cpu_offload_rules(setup: Setup) -> None:
    """torchao's CPUOffloadOptimizer (torchao 0.18.0 optim/cpu_offload.py): "for single-GPU training" (:28), over
    torch's AdamW by default (:22, :39-40); it moves every large parameter's state to the host, so it has no ZeRO."""
    if setup.dp > 1 or setup.tp > 1 or setup.pp > 1 or setup.zero:
        raise SetupError("--offload optimizer on this stack is torchao's CPUOffloadOptimizer, for one GPU: drop "
                         "--dp/--tp/--pp/--zero, or use --stack deepspeed (ZeRO-Offload)")
    if setup.device != "cuda":
        raise SetupError("--offload optimizer: torchao's CPUOffloadOptimizer offloads from a CUDA or XPU device "
                         "(cpu_offload.py:55-59); drop --device cpu")
    if setup.optimizer not in ("adam", "adamw"):
        raise SetupError(f"--offload optimizer: torchao's CPUOffloadOptimizer is modelled over torch's AdamW (its "
                         f"default); --optimizer {setup.optimizer} is not")
    if setup.precision == "bf16-master" or setup.optimizer_in_backward or setup.lora_rank:
        raise SetupError("--offload optimizer (torchao's CPUOffloadOptimizer) is modelled for full fine-tuning with "
                         "the optimizer over the model's own parameters: drop --precision bf16-master, "
                         "--optimizer-in-backward and --lora-rank")
