"""A Megatron-LM launch: `torchrun ... pretrain_gpt.py --flag value ...` (a command line or a shell script).

Megatron-LM's own parser (megatron/training/arguments.py parse_args) is not importable here: megatron-core 0.16.1's
wheel ships no megatron.training, and the file needs Megatron-LM's global state. So the flags are parsed with an
argparse parser built from the cited flag list: the flags plan/emit_megatron.py writes (their arguments.py lines
there) and Megatron-LM core_v0.16.1's other common flags, with argparse's own prefix matching off, as Megatron-LM
sets it (arguments.py:89-90 allow_abbrev=False), --clip-grad's default 1.0 (:1825), and sequence parallelism off at
tp 1 (:907-913). Any other flag is listed as not modelled or unknown."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SetupError
from . import Reading
from .cmdline import launcher_world, leftover_flags, parse_flags, split

INT_FLAGS = ("num-layers", "hidden-size", "num-attention-heads", "kv-channels", "ffn-hidden-size", "seq-length",
             "max-position-embeddings", "micro-batch-size", "global-batch-size", "tensor-model-parallel-size",
             "pipeline-model-parallel-size", "context-parallel-size", "num-query-groups",
             "virtual-pipeline-model-parallel-size", "decoder-first-pipeline-num-layers",
             "decoder-last-pipeline-num-layers", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
             "expert-model-parallel-size", "moe-shared-expert-intermediate-size", "expert-tensor-parallel-size",
             "moe-router-num-groups", "moe-router-group-topk", "mtp-num-layers", "recompute-num-layers",
             "num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16", "train-iters", "train-samples",
             "vocab-size", "cpu-offloading-num-layers", "moe-deepep-num-sms", "moe-hybridep-num-sms")
STR_FLAGS = ("pipeline-model-parallel-layout", "moe-token-dispatcher-type", "moe-flex-dispatcher-backend",
             "data-parallel-sharding-strategy", "ckpt-format", "recompute-granularity", "recompute-method",
             "cuda-graph-impl", "fp8-format", "fp8-recipe", "fp4-format", "fp4-recipe", "tokenizer-type",
             "tokenizer-model", "cross-entropy-fusion-impl")
LIST_FLAGS = ("recompute-modules", "cuda-graph-scope")
SWITCHES = ("group-query-attention", "swiglu", "disable-bias-linear", "untie-embeddings-and-output-weights",
            "sequence-parallel", "account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split",
            "moe-grouped-gemm", "overlap-moe-expert-parallel-comm", "use-distributed-optimizer", "use-megatron-fsdp",
            "bf16", "fp16", "grad-reduce-in-bf16", "fp8-param-gather", "fp4-param-gather", "first-last-layers-bf16",
            "moe-router-force-load-balancing", "tp-comm-overlap", "cross-entropy-loss-fusion", "overlap-param-gather",
            "overlap-grad-reduce", "recompute-activations", "moe-router-fusion", "moe-permute-fusion",
            "use-torch-fsdp2", "torch-fsdp2-no-reshard-after-forward", "use-precision-aware-optimizer",
            "accumulate-allreduce-grads-in-fp32")
# flags with no effect on a step's memory or time (data, checkpoint paths, logging, learning rate, initialisation)
NO_EFFECT = ("lr", "min-lr", "lr-", "weight-decay", "adam-", "init-method-std", "seed", "train-samples", "data-path",
             "split", "save", "load", "save-interval", "log-", "tensorboard-", "wandb-", "eval-", "vocab-file",
             "merge-file", "tokenizer-", "no-load-", "exit-", "timing-log-", "use-mcore-models", "distributed-backend",
             "hidden-dropout", "attention-dropout", "mock-data", "num-workers", "dataloader-type", "decoupled-",
             "data-cache-path", "tiktoken-pattern", "no-mmap-bin-files", "fp8-amax-compute-algo", "rotary-percent",
             "apply-layernorm-1p", "no-create-attention-mask-in-dataloader")
# flags trainfit does not model, with the direction of their effect (Megatron-LM core_v0.16.1 arguments.py)
EFFECT = {"manual-gc": "less time: no garbage-collection pauses mid-step",
          "use-flash-attn": "trainfit models Megatron's fused attention already",
          "attention-backend": "time and memory of the attention kernel",
          "transformer-impl": "trainfit models the transformer_engine layers",
          "calculate-per-token-loss": "no effect on memory",
          "rotary-base": "no effect on memory or time", "norm-epsilon": "no effect on memory or time",
          "use-rope-scaling": "no effect on memory or time", "rope-scaling-factor": "no effect on memory or time",
          "empty-unused-memory-level": "more time, less reserved memory: the cache emptied each step",
          "fp8-amax-history-len": "a little memory: the delayed recipe's amax history per tensor", "no-masked-softmax-fusion": "more time",
          "no-bias-swiglu-fusion": "more time", "no-rope-fusion": "more time",
          "no-gradient-accumulation-fusion": "more time: separate weight-gradient accumulation"}
# flags of the model's own architecture, which the estimate takes from --model (its config.json or catalog entry): its
# norm, positions, q/k norms and biases, dense and MoE layers, multi-latent attention and YaRN (arguments.py:2723-2740),
# the router's scores, softmax order, expert bias and top-k scaling (transformer_config.py:617-634) — said as the
# model's, not as settings trainfit does not model
MODEL_FLAGS = ("normalization", "position-embedding-type", "qk-layernorm", "add-qkv-bias", "moe-layer-freq",
               "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
               "v-head-dim", "rope-type", "rotary-scaling-factor", "mscale", "mscale-all-dim",
               "moe-router-score-function", "moe-router-enable-expert-bias", "moe-router-topk-scaling-factor",
               "moe-shared-expert-gate", "moe-router-pre-softmax")
# --use-precision-aware-optimizer's dtype flags and the values Megatron-LM takes (core_v0.16.1 arguments.py:2844-2857)
PRECISION_AWARE_DTYPES = {"main-grads-dtype": ("fp32", "bf16"), "main-params-dtype": ("fp32", "fp16"),
                          "exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
                          "exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8")}
# the model's shape: checked against the model trainfit resolves
SHAPE = {"num-layers": "layers", "hidden-size": "hidden", "num-attention-heads": "heads", "kv-channels": "head_dim",
         "ffn-hidden-size": "intermediate", "vocab-size": "vocab"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    for f in INT_FLAGS:
        p.add_argument(f"--{f}", type=int)
    for f in STR_FLAGS:
        p.add_argument(f"--{f}")
    for f in LIST_FLAGS:
        p.add_argument(f"--{f}", nargs="+")
    for f in SWITCHES:
        p.add_argument(f"--{f}", action="store_true")
    p.add_argument("--clip-grad", type=float, default=1.0)  # arguments.py: default 1.0
    # TransformerConfig.moe_expert_capacity_factor (megatron-core 0.16.1 transformer_config.py:690, Optional[float]),
    # a flag through arguments.py:1621 ArgumentGroupFactory(TransformerConfig)
    p.add_argument("--moe-expert-capacity-factor", type=float)
    # the router's load-balancing loss: types and coefficients, Megatron-LM's defaults aux_loss and 0.0
    # (arguments.py:2705-2710)
    p.add_argument("--moe-router-load-balancing-type", nargs="+", default=["aux_loss"],
                   choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"))
    p.add_argument("--moe-aux-loss-coeff", type=float, nargs="+", default=[0.0])
    # OptimizerConfig.optimizer ('adam', megatron-core 0.16.1 optimizer_config.py:209) and sgd_momentum (0.9, :255)
    p.add_argument("--optimizer")
    p.add_argument("--sgd-momentum", type=float)
    # the precision-aware optimizer's dtypes, with Megatron-LM's choices and defaults (arguments.py:2844-2857)
    for f, choices in PRECISION_AWARE_DTYPES.items():
        p.add_argument(f"--{f}", choices=choices, default="fp32")
    return p




def read(path: Path, text: str, dp: int | None = None) -> Reading:
    before, argv = split(text, str(path), lambda w: w.endswith("pretrain_gpt.py") or w.endswith("pretrain_mamba.py"))
    r = Reading(f"{path} (Megatron-LM core_v0.16.1 flags, argparse)")
    a, rest = parse_flags(parser(), argv, path)
    world = launcher_world(before)
    _settings(a, r, world)
    if world is None and dp is None:  # (an srun/mpirun launch: the ranks are the scheduler's; torchtitan's alike)
        r.not_modelled.append("data-parallel size: the world size is not in the command (torchrun's --nproc-per-node "
                              "× --nnodes): read as 1, the global batch as accumulation on one rank; give --dp")
    for k, v in leftover_flags(rest):
        if any(k == p or (p.endswith("-") and k.startswith(p)) for p in NO_EFFECT):
            r.skip(f"--{k}", v, "no effect on a step's memory or time")
        elif k in EFFECT:
            r.skip(f"--{k}", v, EFFECT[k])
        elif k in MODEL_FLAGS:
            r.of_model.append(f"--{k}")
        else:
            r.unknown.append(k if k.startswith("-") else f"--{k}")
    return r


def _load_balancing(a, r: Reading) -> None:
    """The router's load-balancing loss, whose kernels the step is timed with (stacks/megatron.toml [moe] aux_loss):
    TopKRouter runs them in training where a loss type has a positive coefficient (megatron-core 0.16.1
    router.py:253-273, :598); Megatron-LM's default coefficient 0.0 runs none. Sinkhorn routing replaces the top-k
    (:220-251, :570-571)."""
    kinds, coeffs = a.moe_router_load_balancing_type, a.moe_aux_loss_coeff
    if "sinkhorn" in kinds:
        r.skip("--moe-router-load-balancing-type", "sinkhorn", "time: Sinkhorn routing in place of the fused top-k "
                                                             "trainfit times")
    elif not any(c > 0 for k, c in zip(kinds, coeffs) if k != "none"):
        r.skip("--moe-aux-loss-coeff", " ".join(f"{c:g}" for c in coeffs), "less time: no load-balancing loss, whose "
               "kernels trainfit times (stacks/megatron.toml [moe] aux_loss)")


def _optimizer(a, r: Reading) -> None:
    """--optimizer sgd: megatron-core builds SGD (TE's or apex's FusedSGD, else torch's: optimizer/__init__.py:14-31,
    as [optimizer_impl] fused has it) with momentum sgd_momentum (:401-407;
    default 0.9, optimizer_config.py:255): trainfit's momentum (one state per parameter), or sgd at momentum 0.
    adam (the default) is what trainfit estimates; another name megatron-core refuses (:409-410)."""
    if a.optimizer in (None, "adam"):
        if a.sgd_momentum is not None:
            r.skip("--sgd-momentum", a.sgd_momentum, "no effect: read by --optimizer sgd only")
        return
    if a.optimizer != "sgd":
        raise SetupError(f"--optimizer {a.optimizer}: megatron-core 0.16.1 builds adam or sgd (optimizer/__init__.py"
                         ":409-410 'optimizer is not supported'); use one of those")
    momentum = 0.9 if a.sgd_momentum is None else a.sgd_momentum
    r.set("optimizer", "momentum" if momentum else "sgd", "--optimizer sgd" + (
        f" --sgd-momentum {a.sgd_momentum:g}" if a.sgd_momentum is not None else ""))


def _torch_fsdp2(a, r: Reading) -> None:
    """--use-torch-fsdp2: Megatron-LM wraps the model (16-bit under --bf16: training.py:1261-1263) in torch's
    fully_shard (core_v0.16.1 training.py:1277-1289; megatron-core 0.16.1 distributed/
    torch_fully_sharded_data_parallel.py:81-84, :128-146: each TransformerLayer, the embedding and the output layer,
    with no mixed-precision policy, so the gradients are reduced in the weights' dtype, with no fp32 main-grad buffer)
    under the non-distributed optimizer (Float16OptimizerWithFloat16Params, optimizer/__init__.py:461: fp32 main
    params of each rank's shards; Megatron-LM refuses the distributed one with it, arguments.py:612-613, and pp or ep
    > 1, gradient accumulation fusion, fp16, tied embeddings, a --ckpt-format other than torch_dist/torch_dcp:
    :605-621). trainfit's Megatron stack models Megatron-FSDP's buffers (stacks/megatron.toml [megatron_fsdp]), not
    these."""
    if a.use_torch_fsdp2:
        raise SetupError("--use-torch-fsdp2: trainfit does not model Megatron-LM on torch's FSDP2 (fully_shard of the "
                         "model's layers under the non-distributed optimizer, megatron-core torch_fully_sharded_data_"
                         "parallel.py); it models Megatron-FSDP: check the line with --use-megatron-fsdp "
                         "--data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor instead "
                         "(trainfit's --zero 3)")
    if a.torch_fsdp2_no_reshard_after_forward:  # (read by the torch FSDP2 wrapper only: training.py:1287-1289)
        r.skip("--torch-fsdp2-no-reshard-after-forward", True, "no effect without --use-torch-fsdp2")


def _precision_aware(a, r: Reading) -> None:
    """--use-precision-aware-optimizer: TE's FusedAdam keeps Adam's states in --exp-avg-dtype / --exp-avg-sq-dtype
    (megatron-core 0.16.1 optimizer/__init__.py:365-370, distrib_optimizer.py:797-798) and, unless the FP8 recipe is
    one other than delayed with fp32 main params (optimizer_config.py:355-362), the master weights in
    --main-params-dtype, under --bf16 as 16-bit remainders of the bf16 weights (store_param_remainders, on by default
    with TE >= 2.1: :192, :383-384; distrib_optimizer.py:800-806), stepping the 16-bit gradients with no fp32 copies
    (:2411-2417). trainfit, which has no setting for these, counts fp32 master weights and states: listed as less
    memory. --main-grads-dtype bf16 under --bf16 leaves the gradients in bf16 as --grad-reduce-in-bf16 does
    (Megatron-LM core_v0.16.1 arguments.py:716-724). Megatron refuses the dtypes without the flag, and the flag with
    another optimizer than adam or without the distributed optimizer (optimizer_config.py:375-381, :414-426)."""
    lowered = {f: getattr(a, f.replace("-", "_")) for f in PRECISION_AWARE_DTYPES}
    lowered = {f: v for f, v in lowered.items() if v != "fp32"}
    if not a.use_precision_aware_optimizer:
        if lowered:
            f, v = next(iter(lowered.items()))
            raise SetupError(f"--{f} {v} without --use-precision-aware-optimizer: Megatron refuses it ("
                             f"{f.replace('-', '_')} can only be fp32 when not using precision-aware optimizer, "
                             "megatron-core 0.16.1 optimizer_config.py:414-426): add the flag or drop this one")
        return
    if (a.optimizer or "adam") != "adam":
        raise SetupError(f"--use-precision-aware-optimizer with --optimizer {a.optimizer}: Megatron refuses it (only "
                         "supported with adam, optimizer_config.py:375-378): drop one")
    if not a.use_distributed_optimizer:
        raise SetupError("--use-precision-aware-optimizer without --use-distributed-optimizer: Megatron refuses it "
                         "(only supported with distributed optimizer, optimizer_config.py:379-381): add it")
    if a.bf16 and a.main_grads_dtype == "bf16":
        r.set("grad_reduce_in_bf16", True, "--main-grads-dtype bf16")
    size = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
    what = [f"Adam's states in {a.exp_avg_dtype} and {a.exp_avg_sq_dtype} "
            f"({size[a.exp_avg_dtype] + size[a.exp_avg_sq_dtype]} bytes; trainfit counts 8)"]
    if (a.bf16 or a.fp16) and (a.main_params_dtype != "fp32" or a.fp8_recipe in (None, "delayed")):
        what.append("the master weights as 16-bit remainders of the bf16 weights (2 bytes with TE >= 2.1; trainfit "
                    "counts 4) and no fp32 gradient copies" if a.bf16 else
                    f"the master weights in {a.main_params_dtype} ({size[a.main_params_dtype]} bytes; trainfit "
                    "counts 4) and no fp32 gradient copies")
    r.skip("--use-precision-aware-optimizer", True, f"less memory: TE's FusedAdam keeps {', '.join(what)}, per "
           "parameter of the rank's optimizer shard: the estimate is high")


def _fp32_grads(a, r: Reading) -> None:
    """--accumulate-allreduce-grads-in-fp32 (the DDP config's grad_reduce_in_fp32: training.py:1295): under --bf16
    Megatron's own default (arguments.py:722-723), turned off by --grad-reduce-in-bf16 (:720-721) and refused beside
    --main-grads-dtype bf16 (:716-718); under --fp16 an fp32 gradient buffer where trainfit counts the 16-bit one
    (parallel/megatron.py grad_buffer_bytes: no setting of its own)."""
    flag = "--accumulate-allreduce-grads-in-fp32"
    if not a.accumulate_allreduce_grads_in_fp32:
        return
    if a.bf16 and a.main_grads_dtype == "bf16":
        raise SetupError(f"{flag} with --main-grads-dtype bf16: Megatron refuses it (--main-grads-dtype can only be "
                         "fp32 when --accumulate-allreduce-grads-in-fp32 is set, arguments.py:716-718): drop one")
    if a.bf16:
        r.skip(flag, True, "no effect: --grad-reduce-in-bf16 turns it off (arguments.py:720-721)"
               if a.grad_reduce_in_bf16 else "no effect: Megatron's own default under --bf16 (arguments.py:722-723)")
    elif a.fp16:
        r.skip(flag, True, "more memory: an fp32 gradient buffer (4 bytes per parameter) where trainfit counts "
                           "--fp16's 16-bit one (2 bytes), and its reduction in fp32")
    else:
        r.skip(flag, True, "no effect: fp32 weights' gradients are fp32 already")


def _settings(a, r: Reading, world: int | None) -> None:
    r.set("stack", "megatron", "pretrain_gpt.py")
    if a.tokenizer_type == "HuggingFaceTokenizer" and a.tokenizer_model:  # the hub id the tokenizer comes from
        r.model = a.tokenizer_model
        # (the tokenizer's: the flags build the model, and checks hold --model to them)
        r.same_model = lambda ref: True
    tp, pp, cp = a.tensor_model_parallel_size or 1, a.pipeline_model_parallel_size or 1, a.context_parallel_size or 1
    for flag, name, v in (("--seq-length", "seq", a.seq_length), ("--micro-batch-size", "batch", a.micro_batch_size),
                          ("--tensor-model-parallel-size", "tp", tp), ("--pipeline-model-parallel-size", "pp", pp),
                          ("--context-parallel-size", "cp", cp)):
        if v is not None:
            r.set(name, v, flag)
    if world is not None:  # Megatron's data-parallel size: world / (tp × pp × cp) (parallel_state.py)
        r.set("dp", world // (tp * pp * cp), "torchrun --nproc-per-node × --nnodes")
    _optimizer(a, r)
    if a.global_batch_size is not None:  # global = micro × accumulation × dp (arguments.py)
        r.global_batch = a.global_batch_size
    if a.sequence_parallel and tp > 1:  # arguments.py:907-913: off at tp 1
        r.set("sequence_parallel", True, "--sequence-parallel")
    elif a.sequence_parallel:
        r.skip("--sequence-parallel", True, "no effect at tp 1: Megatron-LM turns it off (arguments.py:907-913)")
    if a.tp_comm_overlap:  # (Megatron-LM refuses it without sequence parallelism, arguments.py:915-916: so does Setup)
        r.set("tp_comm_overlap", True, "--tp-comm-overlap")
    if world is not None and world // (tp * pp) > 1 and not a.overlap_grad_reduce:
        # (with it: what trainfit models, parallel/zero.py dp_comm, the reduce hidden behind the last backward)
        r.skip("--overlap-grad-reduce", False, "more time: without it Megatron reduces the gradients after the "
                                               "backward, where trainfit hides them behind it")
    if a.overlap_param_gather:  # (Megatron-LM refuses it without the distributed optimizer, arguments.py:597-599)
        if not a.overlap_grad_reduce:  # arguments.py:600-601
            raise SetupError("--overlap-param-gather without --overlap-grad-reduce: Megatron-LM refuses to start "
                             "(arguments.py:600-601); add --overlap-grad-reduce")
        r.set("overlap_param_gather", True, "--overlap-param-gather")
    if a.cpu_offloading_num_layers:  # arguments.py:1236-1237: cpu_offloading on with N > 0 (Setup refuses as Megatron)
        r.set("offload_layers", a.cpu_offloading_num_layers, "--cpu-offloading-num-layers")
    if a.cross_entropy_loss_fusion:  # model_parallel_config.py:241-249: the impl defaults to native
        r.set("loss_fusion", a.cross_entropy_fusion_impl or "native", "--cross-entropy-loss-fusion")
    elif a.cross_entropy_fusion_impl:
        r.skip("--cross-entropy-fusion-impl", a.cross_entropy_fusion_impl,
               "no effect without --cross-entropy-loss-fusion (language_module.py:140)")
    if a.virtual_pipeline_model_parallel_size:
        r.set("vpp", a.virtual_pipeline_model_parallel_size, "--virtual-pipeline-model-parallel-size")
    if a.pipeline_model_parallel_layout:
        r.set("pp_split", a.pipeline_model_parallel_layout, "--pipeline-model-parallel-layout")
    elif a.account_for_embedding_in_pipeline_split and a.account_for_loss_in_pipeline_split:
        r.set("pp_split", "embedding-loss", "--account-for-embedding-in-pipeline-split")
    elif a.decoder_first_pipeline_num_layers or a.decoder_last_pipeline_num_layers:
        parts = [f"{k}:{n}" for k, n in (("first", a.decoder_first_pipeline_num_layers),
                                         ("last", a.decoder_last_pipeline_num_layers)) if n]
        r.set("pp_split", ",".join(parts), "--decoder-first/last-pipeline-num-layers")
    elif a.account_for_embedding_in_pipeline_split or a.account_for_loss_in_pipeline_split:
        r.skip("--account-for-embedding/loss-in-pipeline-split", True, "memory: one of the two; trainfit models both")
    if a.num_experts:
        r.set("ep", a.expert_model_parallel_size or 1, "--expert-model-parallel-size")
        if a.expert_tensor_parallel_size is not None:
            r.set("etp", a.expert_tensor_parallel_size, "--expert-tensor-parallel-size")
        how = a.moe_token_dispatcher_type or "allgather"  # Megatron-LM's own default (transformer_config.py:675)
        if (a.expert_model_parallel_size or 1) > 1:
            r.set("moe_dispatcher", a.moe_flex_dispatcher_backend if how == "flex" else how,
                  "--moe-token-dispatcher-type")
        elif a.moe_token_dispatcher_type:  # (at ep 1 --moe-dispatcher is refused: no expert-parallel rank to send to)
            etp = a.expert_tensor_parallel_size or tp  # model_parallel_config.py:413-414: None is tp
            r.skip("--moe-token-dispatcher-type", how,
                   "time: at --expert-model-parallel-size 1 trainfit times the expert-TP group's gather as the "
                   "alltoall dispatcher's" if etp > 1 else
                   "no effect at --expert-model-parallel-size 1 and expert TP 1: no token leaves the rank")
        # TransformerConfig.moe_deepep_num_sms / moe_hybridep_num_sms, flags through arguments.py:1621's
        # ArgumentGroupFactory(TransformerConfig) (transformer_config.py:722, 725); each read by its own backend
        for backend in ("deepep", "hybridep"):
            n = getattr(a, f"moe_{backend}_num_sms")
            if n is None:
                continue
            if how == "flex" and a.moe_flex_dispatcher_backend == backend:
                r.set("moe_dispatcher_sms", n, f"--moe-{backend}-num-sms")
            else:
                r.skip(f"--moe-{backend}-num-sms", n, f"no effect: the dispatcher is not {backend}")
        if a.overlap_moe_expert_parallel_comm:
            r.set("overlap_moe_comm", True, "--overlap-moe-expert-parallel-comm")
        if a.moe_router_force_load_balancing:
            r.set("moe_force_balance", True, "--moe-router-force-load-balancing")
        cf = a.moe_expert_capacity_factor
        if cf is not None and cf < 0:  # transformer_config.py:1106-1107: a negative factor is None, dropless
            r.skip("--moe-expert-capacity-factor", cf, "no effect: a negative factor drops no token "
                                                       "(transformer_config.py:1106-1107)")
        elif cf is not None and (a.expert_model_parallel_size or 1) > 1:
            r.set("moe_capacity_factor", cf, "--moe-expert-capacity-factor")
        elif cf is not None:  # (Setup's moe_capacity_factor caps the busiest expert-parallel rank's load: --ep > 1)
            r.skip("--moe-expert-capacity-factor", cf, "less time: at --ep 1 trainfit models no expert's excess "
                                                       "load, so no dropped tokens")
        if not a.moe_grouped_gemm:
            r.skip("--moe-grouped-gemm", False, "more time: sequential expert GEMMs (trainfit models TEGroupedMLP)")
        _load_balancing(a, r)
        for fused in ("router", "permute"):  # transformer_config.py:708, :711: off unless given
            if not getattr(a, f"moe_{fused}_fusion"):
                r.skip(f"--moe-{fused}-fusion", False, f"more time: the unfused {fused} kernels (trainfit models "
                                                       "the fused ones, stacks/megatron.toml [moe])")
    if a.mtp_num_layers:
        r.set("mtp_layers", a.mtp_num_layers, "--mtp-num-layers")
    _torch_fsdp2(a, r)
    if a.use_megatron_fsdp:  # fully_shard.py:41-53; arguments.py:2307-2309 (default no_shard)
        zero = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3, "no_shard": 0}.get(
            a.data_parallel_sharding_strategy or "no_shard")
        if zero is None:
            raise SetupError(f"--data-parallel-sharding-strategy {a.data_parallel_sharding_strategy!r}: use no_shard, "
                             "optim, optim_grads or optim_grads_params")
        r.set("zero", zero, "--data-parallel-sharding-strategy")
    else:
        r.set("zero", 1 if a.use_distributed_optimizer else 0, "--use-distributed-optimizer")
    if a.bf16 and a.fp16:  # (megatron-core 0.16.1 transformer_config.py:915-918 raises)
        raise SetupError("--bf16 with --fp16: Megatron refuses it (Only one of self.fp16 and self.bf16 should be "
                         "True, transformer_config.py:915-918): keep one")
    r.set("precision", "bf16-master" if a.bf16 else "fp16-master" if a.fp16 else "fp32", "--bf16/--fp16")
    if a.grad_reduce_in_bf16:
        r.set("grad_reduce_in_bf16", True, "--grad-reduce-in-bf16")
    _fp32_grads(a, r)
    _precision_aware(a, r)
    r.set("max_grad_norm", a.clip_grad, "--clip-grad")
    r.set("recompute", _recompute(a),
          "--recompute-activations" if a.recompute_activations else "--recompute-granularity")
    if a.recompute_modules:
        r.set("recompute_modules", ",".join(a.recompute_modules), "--recompute-modules")
    if a.cuda_graph_scope:
        r.set("cuda_graph_scope", ",".join(a.cuda_graph_scope), "--cuda-graph-scope")
    # FP8/FP4 run only with a format: TransformerConfig.fp8 / fp4 are --fp8-format / --fp4-format (default None;
    # transformer_config.py:429-431, :510-512), which fp8_utils.py:612 / fp4_utils.py:131 get_fp8/fp4_context test;
    # the recipe alone (default delayed / nvfp4, :436-438, :516) changes nothing
    if a.fp8_format:
        r.set("low_precision", a.fp8_recipe or "delayed", "--fp8-recipe")
        if a.fp8_format != "hybrid":
            r.skip("--fp8-format", a.fp8_format, "time: trainfit models the hybrid format")
    elif a.fp8_recipe:
        r.skip("--fp8-recipe", a.fp8_recipe, "no effect without --fp8-format (FP8 is off)")
    if a.fp4_format:
        r.set("low_precision", a.fp4_recipe or "nvfp4", "--fp4-recipe")
    elif a.fp4_recipe:
        r.skip("--fp4-recipe", a.fp4_recipe, "no effect without --fp4-format (FP4 is off)")
    if a.fp8_param_gather or a.fp4_param_gather:
        r.set("fp8_all_gather", True, "--fp8-param-gather")
    if a.first_last_layers_bf16:
        r.set("bf16_first_layers", a.num_layers_at_start_in_bf16 or 1, "--num-layers-at-start-in-bf16")
        r.set("bf16_last_layers", a.num_layers_at_end_in_bf16 or 1, "--num-layers-at-end-in-bf16")
    if a.train_iters and a.global_batch_size and a.seq_length:
        r.set("tokens", float(a.train_iters * a.global_batch_size * a.seq_length), "--train-iters")
    elif a.train_samples and a.seq_length:
        r.set("tokens", float(a.train_samples * a.seq_length), "--train-samples")
    r.checks.append(lambda spec, a=a: _check_shape(a, spec))


def _recompute(a) -> str:
    """transformer_config.py recompute_granularity / method / num_layers (emit_megatron._recompute's inverse);
    --recompute-activations is selective granularity (Megatron-LM arguments.py validate_args: `if
    args.recompute_activations: args.recompute_granularity = 'selective'`, over any --recompute-granularity).
    The combinations TransformerConfig raises on are refused with its reason (megatron-core 0.16.1
    transformer_config.py:1161-1185)."""
    granularity = "selective" if a.recompute_activations else a.recompute_granularity
    if granularity is None:
        return "none"
    if granularity == "selective":
        if a.recompute_num_layers is not None:  # :1179-1185
            raise SetupError(f"--recompute-num-layers {a.recompute_num_layers} with selective recompute: Megatron "
                             "refuses it (recompute_num_layers must be None, transformer_config.py:1179-1185): drop "
                             "it, or use --recompute-granularity full")
        return "selective"
    if a.recompute_method is None or a.recompute_num_layers is None:  # :1166-1178
        raise SetupError(f"--recompute-granularity {granularity} without --recompute-method and "
                         "--recompute-num-layers: Megatron refuses it (transformer_config.py:1166-1178): add "
                         "--recompute-method uniform|block and --recompute-num-layers N")
    method, n = a.recompute_method, a.recompute_num_layers
    return "full" if (method, n) == ("uniform", 1) else f"{method}:{n}"


def _check_shape(a, spec) -> None:
    """The model flags must describe the model trainfit resolved (the file's shape is what Megatron builds)."""
    want = {flag: getattr(spec, attr) for flag, attr in SHAPE.items()}
    if a.group_query_attention:
        want["num-query-groups"] = spec.kv_heads
    if a.num_experts:
        want.update({"num-experts": spec.moe.num_experts if spec.moe else None,
                     "moe-router-topk": spec.moe.top_k if spec.moe else None})
    for flag, v in want.items():
        got = getattr(a, flag.replace("-", "_"))
        if got is not None and got != v:
            raise SetupError(f"--{flag} {got}: {spec.name} has {v}; the command line builds another model: pass "
                             "--model naming the model it builds")
    switches = {"swiglu": spec.gated_mlp and spec.activation in ("silu", "swish"),
                "untie_embeddings_and_output_weights": not spec.tied_embeddings,
                "disable_bias_linear": not (spec.qkv_bias or spec.out_bias or spec.mlp_bias)}
    for name, has in switches.items():
        if a.num_layers is not None and getattr(a, name) != has:  # (a line without the model's flags: not checked)
            flag = "--" + name.replace("_", "-")
            raise SetupError(f"{flag} {'is missing' if has else 'is given'}: {spec.name} is built "
                             f"{'with' if has else 'without'} it; the command line builds another model: pass "
                             "--model naming the model it builds")
