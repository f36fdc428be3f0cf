"""The settings registry: each setting declared once on `Setup` (how the model is run) or `RunSettings` (the
question: GPU, utilisation, budget) with its type, default, help, choices, bounds and modes; `SETTINGS` lists them
and `check_value` / `parse_value` / `refuse_inapplicable` read those declarations."""
from __future__ import annotations

import math
import os as _os
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Callable, Optional

from .. import limits
from .. import low_precision as _low_precision
from .. import precision as _precision
from .. import stacks as _stacks
from .. import serving_versions as _serving_versions
from ..errors import SetupError
from ..units import parse_count
from .parsers import (parse_byte_count,
                      _check_alloc_conf, check_cuda_graph_scope, check_lora_targets, check_pp_split, check_recompute, check_recompute_modules,
                      parse_shards,
                      combine_offload)
from .vocab import (GROUPS, ATTENTION, DEFAULT_SEQ, DEFAULT_TARGET_SEQ, DEVICES, HEADS, INFER_PRECISIONS, KV_DTYPES, SERVE_KV_DTYPES, LORA_DTYPES, LOSSES, LOSS_FUSIONS, MODES, MOE_DISPATCHERS,
                    OFFLOAD_VALUES, OPTIMIZER_IMPLS, OPTIMIZERS, QUANTS, RECOMPUTE, RL_ALGOS, RL_PLACEMENTS, RL_STEP, ROLLOUTS, SERVE_PRECISIONS,
                    SERVE_QUANTS, KBIT_PREPS, SERVERS, SGLANG_ONLY, SPECULATIVE_ALGORITHMS, STACKS, STEP_MODES, TRAIN_PRECISIONS,
                    TRAINING, VLLM_ONLY)


@dataclass(frozen=True)
class Meta:
    """What a setting means and accepts (dataclass field metadata under the key "setting")."""

    help: str
    choices: tuple | None = None  # allowed values (for precision: by mode, see `choices_for`)
    minimum: float | None = None  # inclusive lower bound for numbers
    maximum: float | None = None  # inclusive upper bound
    above: float | None = None  # exclusive lower bound (e.g. mfu > 0)
    modes: tuple[str, ...] = STEP_MODES  # the modes the setting applies to (setting(): its group's by default)
    group: str = "step"  # its concern (vocab.GROUPS): the modes it applies to by default, the web form's fieldsets
    short: str | None = None  # one-letter CLI alias
    auto: str | None = None  # the request default is None, resolved later (how, in words, for --help)
    parse: Callable[[str], Any] | None = None  # CLI/web text -> value (e.g. "15T" -> 1.5e13)
    example: str = ""  # a valid value, for error messages
    check: Callable[[Any], None] | None = None  # a value rule beyond choices and bounds (raises SetupError)
    suggestions: tuple = ()  # common values of a free-form setting (the web form offers them)
    repeatable: bool = False  # the flag may be given several times (or "a,b"): `parse` combines the values
    aliases: tuple[str, ...] = ()  # other CLI names (an engine's own flag name)
    names_model: bool = False  # the value names a model, resolved by models.resolve.load_model (and its rule)


def setting(default, help: str, group: str, **meta) -> Any:
    """A setting of `group` (vocab.GROUPS: its concern); it applies to the group's modes unless `modes` says
    otherwise."""
    meta.setdefault("modes", GROUPS[group][1])
    return field(default=default, metadata={"setting": Meta(help, group=group, **meta)})


@dataclass(frozen=True)
class Setup:
    """How the model is run: batch, sequence, precision, optimizer, recompute, kernels and parallel layout."""

    batch: int = setting(1, "Micro-batch per GPU (sequences). --mode rl: prompts per optimizer step per GPU, each "
                         "sampled --group-size times (see --group-size for TRL's names).",
                         maximum=limits.TOKENS, minimum=1, short="-b",
                         example="8", modes=RL_STEP, group="step")
    seq: int = setting(DEFAULT_SEQ, "Sequence length (training) or context length (inference), tokens (--mode rl: "
                       "--prompt-len + --completion-len, not set). Encoder-decoder models: the encoder's; Whisper: its "
                       "encoder positions, half its log-mel frames (conv2's stride 2), exactly max_source_positions "
                       "(1500: 30 s of audio).", maximum=limits.TOKENS, minimum=1, short="-s",
                       auto="2048, or the model's position limit if smaller", example="4096", modes=RL_STEP, group="step")
    target_seq: Optional[int] = setting(None, "Encoder-decoder models (T5, Flan-T5, BART, Whisper): the decoder's "
                                        "(target) sequence, tokens; --seq is then the encoder's. Training: the labels' "
                                        "length. Inference: the decoder tokens already generated (the self-"
                                        "attention cache the decode step reads; 1 = generate()'s first step). "
                                        "Refused for decoder-only and encoder-only models.",
                                        maximum=limits.TOKENS, minimum=1,
                                        auto=f"{DEFAULT_TARGET_SEQ} for encoder-decoder models (the max_target_length "
                                        "of transformers' run_summarization.py); none for other models",
                                        example="128", modes=STEP_MODES, group="step")
    grad_accum: int = setting(1, "Micro-batches accumulated per optimizer step.",
                              maximum=limits.TOKENS, minimum=1, modes=TRAINING,
                              example="4", group="step")
    precision: str = setting("amp-bf16", "Precision policy. Training: " + ", ".join(
        f"{n} ({_precision.PRECISIONS[n].summary})" for n in TRAIN_PRECISIONS) + ". Inference: " + ", ".join(
        INFER_PRECISIONS) + ". Serving: the weights' dtype (bf16, fp16, fp32).", choices=INFER_PRECISIONS,
        auto="the stack's for training (hf, torchtitan: amp-bf16; megatron, deepspeed: bf16-master), bf16 for "
        "inference and serving", modes=MODES, group="step")
    optimizer: str = setting("adamw", "Optimizer. adamw-8bit, paged-adamw-8bit, paged-adamw, lion: bitsandbytes'; "
                             "adamw-torchao-8bit, -4bit, -fp8: torchao's low-bit AdamW (block-quantised states, "
                             "the HF Trainer's adamw_torch_8bit / adamw_torch_4bit).", choices=OPTIMIZERS,
                             modes=TRAINING, group="step")
    recompute: str = setting("none", "Activation checkpointing: none; full (every layer); layer:N (every N-th "
                             "layer, torchtitan); op (torchtitan's per-op SAC: saves matmul and attention outputs, "
                             "recomputes every second matmul and all else); uniform:N (Megatron: groups of N layers, "
                             "only each group's input kept) and block:N (Megatron: the first N layers of each stage "
                             "checkpointed); selective = the stack's own meaning (torchtitan: op; megatron: core "
                             "attention; hf: the attention scores, needs --attention eager).",
                             modes=TRAINING, check=lambda v: check_recompute(v), example="op",
                             suggestions=RECOMPUTE + ("layer:2", "uniform:1", "block:4"), group="step")
    recompute_modules: Optional[str] = setting(None, "Megatron's selective recompute modules under --recompute "
                                               "selective (--recompute-modules, comma-separated): core_attn, "
                                               "moe_act (the experts' activation), layernorm (norms not fused into "
                                               "a linear), mla_up_proj, mlp (dense MLPs), moe (the whole MoE "
                                               "layer, its all-to-alls again), shared_experts; --stack megatron.",
                                               auto="core_attn (Megatron's default, transformer_config.py:1193)",
                                               modes=TRAINING, check=lambda v: check_recompute_modules(v),
                                               example="layernorm,moe_act", group="step",
                                               suggestions=("core_attn", "layernorm,moe_act", "moe"))
    cuda_graph_scope: Optional[str] = setting(None, "Transformer Engine CUDA graphs of parts of each layer (Megatron's "
                                              "--cuda-graph-impl transformer_engine --cuda-graph-scope, comma-"
                                              "separated): attn (the norm and self-attention), moe_router (the pre-MLP "
                                              "norm and the router), moe_preprocess (the dispatcher's preprocess and "
                                              "permute; with moe_router). Each graphed part's forward and backward "
                                              "launch as one graph each; --stack megatron.",
                                              modes=TRAINING, check=lambda v: check_cuda_graph_scope(v),
                                              example="moe_router,moe_preprocess", group="step",
                                              suggestions=("moe_router,moe_preprocess",
                                                           "attn,moe_router,moe_preprocess"))
    doc_len: Optional[int] = setting(None, "Sequence packing: each --seq row packs documents of this token-weighted "
                                     "mean length (sum of d² over sum of d), each attending within itself "
                                     "(transformers' DataCollatorWithFlattening, TRL's padding_free/packing, "
                                     "FlashAttention's varlen kernel): the attention core costs per document; "
                                     "--stack hf with --attention flash2.", minimum=1, maximum=limits.TOKENS,
                                     auto="--seq (one document per sequence, no packing)", example="512",
                                     modes=("train",), group="step")
    attention: str = setting("auto", "Attention kernel: eager (stores s×s scores), sdpa, flash (the fused kernel "
                             "torch's SDPA picks: cuDNN on H100/H200 from torch 2.9); flash2 = FlashAttention-2 (SDPA "
                             "before torch 2.9, or the flash-attn package; CUDA, 16-bit); triton = FlashAttention in "
                             "Triton (llm-foundry's attn_impl: triton; CUDA, 16-bit, --stack hf; saves what flash "
                             "saves, runs slower); auto = flash on cuda, sdpa on cpu.",
                             choices=ATTENTION, modes=RL_STEP, group="step")
    dp: int = setting(1, "Data-parallel degree.", maximum=limits.RANKS, minimum=1, example="8",
                      modes=("train", "rl"), group="parallel")
    tp: int = setting(1, "Tensor-parallel degree (divides heads).",
                      maximum=limits.RANKS, minimum=1, example="8", modes=MODES, group="parallel")
    pp: int = setting(1, "Pipeline-parallel degree (1F1B schedule; layers split per --pp-split).",
                      maximum=limits.RANKS, minimum=1,
                      example="4", modes=MODES, group="parallel")
    vpp: int = setting(1, "Virtual pipeline stages per pipeline rank (Megatron's interleaved 1F1B: each rank holds "
                       "--vpp model chunks).", maximum=limits.RANKS, minimum=1, example="3", group="parallel")
    pp_split: str = setting("even", "How layers are split over pipeline stages: even; embedding-loss (Megatron's "
                            "account_for_embedding/loss_in_pipeline_split: the embedding and the loss each count as "
                            "one layer, so the first and last stages hold one layer fewer); first:N,last:M (Megatron's "
                            "decoder_first/last_pipeline_num_layers, the rest even); or Megatron's layout string "
                            "(--pipeline-model-parallel-layout, e.g. Et*3|(tt|)*29,m|L: E embedding, t decoder "
                            "layer, m MTP layer, L loss, '|' between the pp × vpp stages).", check=lambda v: check_pp_split(v),
                            example="embedding-loss", suggestions=("even", "embedding-loss"), modes=STEP_MODES,
                            group="parallel")
    mtp_layers: Optional[int] = setting(None, "Multi-token-prediction layers trained after the decoder (Megatron's "
                                        "--mtp-num-layers: each an eh_proj, one decoder layer and the LM head and "
                                        "loss once more, on the last pipeline stage or where a --pp-split layout "
                                        "puts 'm'); --stack megatron.", minimum=0, maximum=limits.LAYERS,
                                        auto="the config's num_nextn_predict_layers on --stack megatron "
                                        "(DeepSeek-V3: 1), 0 on stacks that drop them", example="1",
                                        modes=("train",), group="parallel")
    cp: int = setting(1, "Context-parallel degree (ring attention: each rank holds --seq / cp tokens of every "
                      "sequence; Megatron's, or torch's under --stack torchtitan).", maximum=limits.RANKS, minimum=1, example="2", group="parallel")
    ulysses: int = setting(1, "DeepSpeed-Ulysses sequence-parallel degree (ALST; DeepSpeed's UlyssesSPAttentionHF on "
                           "an HF model): each rank of a group of N holds --seq / N tokens of every sequence, and "
                           "all-to-alls over the group swap the split to heads around the attention core (N divides "
                           "the attention heads). The groups are carved out of --dp (DeepSpeed: consecutive ranks, "
                           "ZeRO still shards over all --dp ranks), so --dp / N ranks train different sequences. "
                           "--stack deepspeed, or hf through its DeepSpeed integration.", maximum=limits.RANKS,
                           minimum=1, example="8", group="parallel")
    ep: int = setting(1, "Expert-parallel degree for MoE models (experts split over ep ranks, carved out of dp × cp × "
                      "tp).", maximum=limits.RANKS, minimum=1, example="8", group="parallel")
    etp: Optional[int] = setting(None, "Expert tensor-parallel degree (each expert's matrices split over etp ranks).",
                                 maximum=limits.RANKS, minimum=1, auto="--tp (Megatron's default; torchtitan's is 1)",
                                 example="1", group="parallel")
    moe_dispatcher: Optional[str] = setting(None, "MoE token dispatcher (Megatron's --moe-token-dispatcher-type, "
                                            "with flex: --moe-flex-dispatcher-backend; torchtitan's "
                                            "expert_parallel_comm_backend: alltoall or deepep): alltoall (each "
                                            "token's top-k "
                                            "copies to their experts' ranks), allgather (every rank gathers the "
                                            "etp × ep group's tokens), deepep / hybridep (each token once per "
                                            "destination node over RDMA, then over NVLink to its experts' GPUs).",
                                            choices=MOE_DISPATCHERS, modes=("train",),
                                            auto="alltoall (Megatron-Bridge's performance recipes; Megatron-Core's "
                                            "own default is allgather)", example="deepep", group="parallel")
    overlap_moe_comm: bool = setting(False, "Hide the expert-parallel dispatch/combine behind another micro-batch's "
                                     "compute (Megatron's --overlap-moe-expert-parallel-comm: 1F1B with the "
                                     "forward of one micro-batch beside the backward of another); needs --ep > 1, "
                                     "--grad-accum > 1 to hide anything.", modes=("train",),
                                     aliases=("--overlap-moe-expert-parallel-comm",), group="parallel")
    moe_dispatcher_sms: Optional[int] = setting(None, "SMs the deepep / hybridep dispatcher's kernels run on "
                                                "(Megatron's --moe-deepep-num-sms, --moe-hybridep-num-sms): under "
                                                "--overlap-moe-comm the compute hidden beside an exchange runs on the "
                                                "others.", minimum=1, maximum=1024, modes=("train",),
                                                auto="Megatron-Core's: 20 for deepep, 16 for hybridep", example="32",
                                                group="parallel")
    overlap_param_gather: bool = setting(False, "Megatron's --overlap-param-gather: the distributed optimizer's "
                                         "parameter all-gather is dispatched bucket by bucket as the next step's "
                                         "first forward reaches each bucket's modules, hidden behind that forward "
                                         "(without it the all-gather runs whole after optimizer.step()); needs "
                                         "--zero 1 or more.", modes=("train",), group="parallel")
    overlap_comm: bool = setting(False, "DeepSpeed's zero_optimization.overlap_comm at --zero 1 or 2: the gradient "
                                 "reduction runs on its own stream beside the backward, with a second reduce bucket "
                                 "of reduce_bucket_size elements; without it (DeepSpeed's default there) the "
                                 "reduction runs on the backward's stream and the step waits for it. ZeRO-3 "
                                 "overlaps by default.", modes=("train",), group="parallel")
    tp_comm_overlap: bool = setting(False, "Run the tensor-parallel all-gathers and reduce-scatters chunk by chunk "
                                    "beside the GEMMs they feed (Megatron's --tp-comm-overlap, Transformer Engine's "
                                    "userbuffers; torchtitan: async TP, with --compile); needs --tp > 1 and "
                                    "--sequence-parallel.", modes=("train",), group="parallel")
    moe_imbalance: Optional[float] = setting(None, "Routing imbalance under --ep: the routed tokens the busiest "
                                             "expert-parallel rank receives over the mean (>= 1), per micro-batch "
                                             "and layer. Its expert GEMMs scale by it and every rank waits for it "
                                             "at the combine all-to-all; the routed activations a stage holds over "
                                             "n (micro-batch, layer) pairs by 1 + (X - 1)/sqrt(n) (the busiest rank "
                                             "changes from pair to pair). With --ep 1 every rank holds every expert, "
                                             "so none is busier: refused there.", minimum=1, maximum=1024,
                                             auto="1.91 for dropless learned routing (fitted on calibration C8, "
                                             "a benchmark's early steps; analytic/moe_imbalance.py), "
                                             "at least the sampling floor of the uniform draw; that floor with "
                                             "--moe-force-balance; at most --moe-capacity-factor",
                                             example="1.3", modes=("train",), group="parallel")
    moe_force_balance: bool = setting(False, "The router's forced balance (benchmark runs): Megatron's "
                                      "--moe-router-force-load-balancing (random logits: the busiest rank's excess "
                                      "is sampling noise only), torchtitan's _debug_force_load_balance (round-robin).",
                                      modes=("train",), group="parallel")
    moe_capacity_factor: Optional[float] = setting(None, "Megatron's --moe-expert-capacity-factor: each expert "
                                                   "takes at most this factor times its balanced share of a rank's "
                                                   "routed tokens, the rest dropped; caps --moe-imbalance (needs --ep > "
                                                   "1, as it). NB: --moe-pad-expert-input-to-capacity is not "
                                                   "modelled.",
                                                   above=0, maximum=1024, example="1.25", modes=("train",),
                                                   group="parallel")
    zero: int = setting(0, "ZeRO stage over --dp ranks: 0 (DDP), 1 (optimizer), 2 (+gradients), 3 (+weights, "
                        "= FSDP). On --stack megatron: 1 is the distributed optimizer, 2 and 3 Megatron-FSDP's "
                        "optim_grads and optim_grads_params (--use-megatron-fsdp).", choices=(0, 1, 2, 3),
                        modes=("train", "rl"), group="parallel")
    fsdp_version: Optional[int] = setting(None, "FSDP implementation under --zero 2/3: 2 = torch's fully_shard "
                                          "(per-parameter DTensor shards, copied into and out of the collectives' flat "
                                          "buffers), 1 = FullyShardedDataParallel (one FlatParameter per wrapped "
                                          "layer, gathered into and reduced from directly; limit_all_gathers, "
                                          "BACKWARD_PRE prefetch): accelerate's fsdp_version; --stack hf.",
                                          choices=(1, 2), auto="2 (fully_shard, as accelerate's FSDP2 runs it)",
                                          example="1", modes=("train",), group="parallel")
    fsdp_param_dtype: Optional[str] = setting(None, "FSDP mixed-precision policy: the dtype the sharded fp32 "
                                              "parameters are all-gathered and computed in (FSDP's "
                                              "MixedPrecision(Policy) param_dtype, accelerate's "
                                              "mixed_precision_policy, torchtitan's mixed_precision_param); none = "
                                              "no policy: gathered in fp32, cast per op by autocast (older "
                                              "FSDP wrappers). Needs --zero 2/3 and an amp-* precision.",
                                              choices=("none", "bf16", "fp16", "fp32"),
                                              auto="the stack's: the amp dtype (hf: accelerate's policy; "
                                              "torchtitan: bf16)", example="none", modes=("train",), group="parallel")
    fsdp_reduce_dtype: Optional[str] = setting(None, "FSDP mixed-precision policy: the dtype gradients are "
                                               "reduce-scattered in (reduce_dtype, torchtitan's "
                                               "mixed_precision_reduce); none = the gathered parameters' dtype "
                                               "(torch's default when reduce_dtype is unset). Needs --zero 2/3 and "
                                               "an amp-* precision.", choices=("none", "bf16", "fp16", "fp32"),
                                               auto="the stack's (hf: the amp dtype; torchtitan: fp32)",
                                               example="fp32", modes=("train",), group="parallel")
    sequence_parallel: bool = setting(False, "Megatron sequence parallelism (shards norm/dropout activations "
                                      "over --tp ranks).", group="parallel")
    grad_reduce_in_bf16: bool = setting(False, "Megatron's --grad-reduce-in-bf16 (Megatron-Bridge's "
                                        "ddp.grad_reduce_in_fp32 = False, as its performance recipes set it): "
                                        "gradients accumulated and reduced in the bf16 param dtype instead of the "
                                        "fp32 main-grad buffer --bf16 otherwise keeps; the distributed optimizer "
                                        "then steps fp32 copies of its shard of them. --stack megatron, --precision "
                                        "bf16-master.", modes=("train",), group="step")
    stack: str = setting("hf", "Training stack whose step is modelled: hf (HF Trainer/accelerate: torch.autocast, "
                         "fused AdamW, HF RMSNorm in fp32), torchtitan (FSDP2 mixed precision: bf16 all-gather and "
                         "fp32 reduce; fused AdamW; per-op SAC), megatron (Megatron-Core: 16-bit weights, fp32 "
                         "main grads and distributed optimizer (--zero 1; Megatron-FSDP: --zero 2/3), fused kernels, "
                         "TP/SP/PP/CP/EP) or "
                         "deepspeed (ZeRO 0-3 with FusedAdam, bucketed reduction, offload). Facts and sources: "
                         "trainfit/stacks/*.toml.",
                         choices=STACKS, modes=("train",), group="step")
    stack_release: Optional[str] = setting(None, "An earlier release of --stack whose facts differ from the pinned "
                                           "one's, for a run made with that checkout (trainfit/stacks/*.toml "
                                           "[releases]: torchtitan 2025-03, loss not compiled; 2025-08-sm100, "
                                           "cuDNN attention not saved by per-op SAC on B200).",
                                           auto="the version the stack's facts pin", example="2025-03",
                                           modes=("train",), group="step")
    compile: bool = setting(False, "torch.compile the model (inductor), as the stack does it: torchtitan compiles each "
                            "block and the loss, the HF Trainer's torch_compile the whole model. Its partitioner saves "
                            "matmul/attention outputs and recomputes pointwise chains in backward (modelled for "
                            "Llama-style blocks and the loss).", modes=("train",), group="step")
    compile_loss: bool = setting(False, "torch.compile the loss only, the blocks eager: torchtitan's compile.enable "
                                 "with compile.components = ['loss'] (config/job_config.py:721-727). The compiled "
                                 "cross-entropy fuses the fp32 upcast and log-softmax: no fp32 logits are saved. "
                                 "--compile already compiles the loss on stacks that do.", modes=("train",),
                                 group="step")
    tf32: bool = setting(False, "fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = True, "
                         "HF TrainingArguments tf32=True). Off is PyTorch's default: fp32 matmuls then run at the GPU's "
                         "fp32 rate, 7x slower than TF32 on an H100. Time only; --precision fp32.", group="step")
    low_precision: str = setting(_low_precision.NONE, "Low-precision training of the projections' GEMMs, as the "
                                 "stack runs it: tensorwise, rowwise, rowwise_with_gw_hp (torchao float8 on --stack "
                                 "torchtitan), delayed, blockwise (Transformer Engine on --stack megatron; tensorwise "
                                 "is TE's current scaling there), mxfp8, nvfp4 (Blackwell). The GPU needs the "
                                 "recipe's tensor cores. Formats: trainfit/low_precision.py; what each stack keeps: "
                                 "stacks/<stack>.toml [low_precision].", choices=_low_precision.CHOICES,
                                 modes=("train",), example="tensorwise", group="step")
    mx_scale: str = setting("floor", "How --low-precision mxfp8 rounds each 32-element block's scale on --stack "
                            "torchtitan: floor (torchao's mxfp8_cublas, the default) or rceil (mxfp8_cublas_rceil). "
                            "Same memory; rceil's dim0 cast kernel runs slower (ops/torchao_casts.py).",
                            choices=_low_precision.MX_SCALES, modes=("train",), example="rceil", group="step")
    fp8_all_gather: bool = setting(False, "Gather the sharded weights in the recipe's format instead of bf16: "
                                   "torchtitan's enable_fsdp_float8_all_gather (--zero 3), Megatron's "
                                   "--fp8-param-gather (fp8 weights as the primary copy). Needs --low-precision and "
                                   "--dp > 1.", modes=("train",), group="step")
    bf16_first_layers: int = setting(0, "Transformer layers at the start of the model kept in bf16 under "
                                     "--low-precision (Megatron --num-layers-at-start-in-bf16).", minimum=0,
                                     maximum=limits.LAYERS, modes=("train",), example="1", group="step")
    bf16_last_layers: int = setting(0, "Transformer layers at the end of the model kept in bf16 under "
                                    "--low-precision (Megatron --num-layers-at-end-in-bf16; torchtitan's "
                                    "filter_fqns of the last blocks, as NVFP4 recipes do).", minimum=0,
                                    maximum=limits.LAYERS, modes=("train",), example="5", group="step")
    offload: str = setting("none", "What lives in host memory: optimizer (DeepSpeed ZeRO-Offload: fp32 master and "
                           "optimizer states, the step on the CPU; --zero >= 1; --stack deepspeed; on one GPU with --stack hf: "
                           "torchao's CPUOffloadOptimizer, states, gradient and parameter copies in pinned host "
                           "memory, AdamW on the CPU), params "
                           "(ZeRO-Infinity: the 16-bit weights too; --zero 3; --stack deepspeed) or activations "
                           "(torchtune's activation offloading: saved tensors to pinned host memory in forward, back "
                           "in backward; --stack hf, analytic engine; on --stack deepspeed ArcticTraining's variant under --recompute "
                           "full: each checkpointed layer's input copied to host memory and back). Repeatable: --offload optimizer --offload "
                           "params is ZeRO-Infinity's pair, the same as params; --offload activations --offload params "
                           "(or optimizer) offloads both, written activations+params.", choices=OFFLOAD_VALUES,
                           modes=("train",),
                           repeatable=True, parse=lambda v: combine_offload(v), example="optimizer", group="step")
    offload_layers: int = setting(0, "Megatron's activation CPU offloading (--cpu-offloading-num-layers N, Transformer "
                                  "Engine's offload context): the saved activations of the first N transformer "
                                  "layers copied to pinned host memory during the forward, on a side stream beside "
                                  "the next layers' compute, and back during the backward; fewer than the model's "
                                  "layers, no pipeline, no recompute, no CUDA graphs; --stack megatron.", minimum=0,
                                  maximum=limits.LAYERS, modes=("train",), example="40",
                                  aliases=("--cpu-offloading-num-layers",), group="step")
    optimizer_impl: Optional[str] = setting(None, "Optimizer kernel: for-loop, foreach (multi-tensor, with "
                                            "temporaries) or fused (in place).", choices=OPTIMIZER_IMPLS,
                                            modes=TRAINING,
                                            auto="the stack's (fused for Adam/AdamW/SGD; torch's "
                                            "default otherwise: foreach on cuda, for-loop on cpu)", group="step")
    max_grad_norm: Optional[float] = setting(None, "Gradient clipping before each optimizer step: the "
                                             "gradients are scaled to at most this total L2 norm, as the stack "
                                             "does it: torch.nn.utils.clip_grad_norm_ (HF Trainer's max_grad_norm, "
                                             "torchtitan's training.max_norm: a norm pass and a scale pass over "
                                             "every gradient), Megatron's clip_grad (multi_tensor_l2norm over the "
                                             "fp32 main grads, an all-reduce of the norm, a scale pass when the "
                                             "norm is above it) or DeepSpeed's gradient_clipping (folded into its "
                                             "optimizer's unscale pass). 0 turns clipping off (Megatron's and "
                                             "DeepSpeed's optimizers still take the norm, which they log); "
                                             "torchtitan always clips: a positive value.", minimum=0, modes=TRAINING,
                                             auto="the stack's: 1.0 (hf, torchtitan, megatron, deepspeed); none "
                                             "with --optimizer-in-backward", example="0", suggestions=(0, 0.5, 1.0), group="step")
    head: Optional[str] = setting(None, "Task head trained: causal-lm, masked-lm, seq-cls (sequence "
                                  "classification), token-cls (token classification); labels from the config's "
                                  "num_labels/id2label (default 2).", choices=HEADS, modes=("train",),
                                  auto="the config's architectures (e.g. BertForSequenceClassification -> seq-cls), "
                                  "else the family's LM head", example="seq-cls", group="step")
    lora_rank: int = setting(0, "LoRA adapter rank (peft's LoraConfig r): the base weights are frozen and only the "
                             "adapters train; 0 = full fine-tuning. Alpha does not change memory; lora_dropout 0. "
                             "Runs over --dp with --zero (hf: ZeRO-1 / FSDP2, the frozen base sharded and gathered "
                             "like a full model, gradients and optimizer states of the adapters only; --stack "
                             "deepspeed: ZeRO 0-3, adapters in the model dtype with fp32 masters).",
                             maximum=limits.RANK_ROWS, minimum=0, example="16",
                             suggestions=(0, 8, 16, 64), group="fine-tune")
    lora_targets: str = setting("all-linear", "Linear layers that get adapters: all-linear (peft's: every Linear "
                                "but the output head), attention (q/k/v/o projections) or comma-separated module "
                                "names (e.g. q_proj,v_proj); needs --lora-rank.",
                                check=lambda v: check_lora_targets(v), example="q_proj,v_proj",
                                suggestions=("all-linear", "attention", "q_proj,v_proj"), group="fine-tune")
    dora: bool = setting(False, "DoRA (weight-decomposed LoRA, peft use_dora): a trainable magnitude per output "
                         "feature of each adapted Linear; needs --lora-rank.", group="fine-tune")
    quant: Optional[str] = setting(None, "Frozen base weights quantised by bitsandbytes, as transformers' "
                                   "BitsAndBytesConfig loads them: nf4 or fp4 (4-bit, blocks of 64, double "
                                   "quantisation, compute dtype = the matmul dtype) or int8 (LLM.int8); every "
                                   "Linear but the output head; with --lora-rank this is QLoRA; --stack hf or deepspeed "
                                   "(under --zero 3 / FSDP the packed weights are sharded, stored in a float dtype "
                                   "as bnb_4bit_quant_storage=bf16 sets them; their quant state whole per rank). "
                                   "Serving (vLLM's --quantization): fp8, or awq / gptq (4-bit, groups of 128).",
                                   choices=QUANTS + SERVE_QUANTS, modes=("train", "serve"), example="nf4", group="fine-tune")
    kbit_prep: Optional[str] = setting(None, "How the parameters --quant leaves unquantised are prepared: peft "
                                       "(peft's prepare_model_for_kbit_training: every fp16/bf16 parameter, i.e. the "
                                       "embedding, the LM head and the norms, upcast to fp32; it also turns gradient "
                                       "checkpointing on by default: give --recompute full), norms (the norm weights "
                                       "only: how TRL's SFTTrainer (0.x, bf16=True) leaves a 4-bit model) or none "
                                       "(all in the precision's weight dtype); needs --quant.", choices=KBIT_PREPS,
                                       auto="the stack's recipe: peft on --stack hf (peft's and "
                                       "transformers' QLoRA recipe)", example="none", group="fine-tune")
    lora_dtype: str = setting("fp32", "dtype of the LoRA adapters (their gradients and optimizer states follow): "
                              "fp32 (peft's default autocast_adapter_dtype=True) or weight (the precision's weight "
                              "dtype, as torchtune builds them); needs --lora-rank.", choices=LORA_DTYPES, group="fine-tune")
    loss: str = setting("full", "Loss kernel: full (the model's own: whole logits, upcast to fp32) or fused-linear "
                        "(Liger's fused linear cross-entropy, as TRL's use_liger_kernel applies it: the LM head and the "
                        "loss run chunk by chunk, the logits never whole, the head's gradients made in forward) or "
                        "chunked-logprob (TRL's fused LM head, what its GRPO trainer trains with: per-token "
                        "log-probs from [4096 × 32768] logits tiles, recomputed in backward; --mode rl uses it) or "
                        "tiled (DeepSpeed's TiledFusedLogitsLoss as ArcticTraining runs it under Ulysses: the model's "
                        "own head and loss on slices of about 1 GiB of fp32 logits, each slice's backward run in the "
                        "forward) or xentropy (flash-attn's fused softmax cross-entropy, CrossEntropyLoss of flash_attn.losses, as "
                        "llm-foundry's loss_fn fused_crossentropy runs it: the 16-bit logits saved, no fp32 copy, an "
                        "fp32 loss and log-sum-exp per token, the gradient a new 16-bit tensor); fused-linear, tiled "
                        "and xentropy on --stack hf and deepspeed, analytic engine.", choices=LOSSES, modes=("train",), group="step")
    loss_fusion: str = setting("none", "Megatron's fused vocab-parallel cross-entropy (--cross-entropy-loss-fusion "
                               "with --cross-entropy-fusion-impl): none (Megatron-LM's default: the logits upcast "
                               "to fp32, the fp32 softmax saved), native (megatron-core's torch.compile'd kernels: "
                               "the same buffers, fewer passes) or te (Transformer Engine's Triton kernels: no fp32 "
                               "copy, the gradient written into the 16-bit logits in the forward and saved; CUDA); "
                               "--stack megatron.", choices=LOSS_FUSIONS, modes=("train",), example="te",
                               group="step")
    liger: bool = setting(False, "Liger's kernels for the model's family, as TRL's use_liger_kernel and "
                          "ArcticTraining's model.type liger apply them (apply_liger_kernel_to_llama and its mistral, "
                          "qwen2, qwen3 copies): its RMSNorm (saves the input and one fp32 per row), SwiGLU (saves "
                          "gate and up only, recomputes silu in backward) and RoPE (in place) kernels, plus its fused "
                          "linear cross-entropy: --loss full becomes fused-linear (Liger's fused_linear_cross_entropy="
                          "True default); --loss tiled or chunked-logprob keep theirs. --stack hf or deepspeed, "
                          "analytic engine; dense llama, mistral, qwen2, qwen3 models.", modes=("train",),
                          group="step")
    tiled_mlp: Optional[int] = setting(None, "ArcticTraining's tiled MLP (DeepSpeed's TiledMLP): each layer's MLP "
                                       "runs on N slices of the sequence without saving its intermediates, and its "
                                       "backward re-runs one slice at a time; auto = ArcticTraining's ceil(tokens "
                                       "per rank / hidden). --stack deepspeed or hf (a monkey-patch of the HF "
                                       "model's MLP), gated (SwiGLU) MLPs, analytic engine; 0 = auto.", minimum=0,
                                       maximum=limits.TOKENS, parse=lambda v: parse_shards(v), auto="off",
                                       example="auto", suggestions=("auto", 4, 16), modes=("train",), group="step")
    optimizer_in_backward: bool = setting(False, "Step the optimizer inside the backward pass, one parameter at a "
                                          "time as its gradient is ready, and free that gradient at once (torchtune's "
                                          "optimizer_in_bwd): gradients never all live. Needs --grad-accum 1 and one "
                                          "GPU (no --dp).", modes=("train",), group="step")
    image_size: Optional[int] = setting(None, "Image side in pixels (vision models: resnet, convnext, vit; the "
                                        "batch is images). Vision-language models: each image's side, a multiple of "
                                        "patch x merge (qwen2.5-vl 28, qwen3-vl 32) as the processor resizes to; "
                                        "gemma-3 takes 896 only; llama-3.2-vision (mllama) splits "
                                        "an image into ceil(h / 560) x ceil(w / 560) tiles of 560 pixels, at most "
                                        "max_num_tiles 4 (a square image: 1 tile up to 560, else 2 x 2), and pads "
                                        "every image to 4 tiles, so the size sets the masks, not the memory.",
                                        minimum=1, maximum=8192,
                                        auto="the config's image_size (224 for the ImageNet models, 896 for "
                                        "gemma-3; 448 for the Qwen vision-language models; 560, one tile, "
                                        "for llama-3.2-vision)", example="224", group="vision")
    images: Optional[int] = setting(None, "Images per sample (vision-language models): each adds (image / (patch x "
                                    "merge))^2 tokens to the language model's sequence (qwen2.5-vl: (image / 28)^2), "
                                    "which is then --seq text tokens + images x tokens per image; the vision tower "
                                    "runs on (image / patch)^2 patches per image. llama-3.2-vision (mllama): one <|image|> token per "
                                    "image in the sequence; the tower runs on 4 tiles x ((560 / 14)^2 + 1) tokens "
                                    "per image, which the cross-attention layers read. Refused for models without a "
                                    "vision tower.", minimum=0, maximum=1024,
                                    auto="1 for a vision-language model", example="2",
                                    group="vision")
    channels_last: bool = setting(False, "Run a vision model in the channels-last memory format (NHWC; the same "
                                  "bytes, other kernels).", group="vision")
    device: str = setting("cuda", "Kernel semantics: cuda (flash SDPA, the CUDA allocator's 512-byte rounding, "
                          "torch's foreach optimizer default) or cpu (PyTorch CPU kernels, for-loop default).",
                          choices=DEVICES, modes=MODES, group="step")
    mode: str = setting("train", "train (a training step), infer (prefill + one decode step), serve (a serving "
                        "engine's memory: its KV-cache capacity in tokens and concurrent sequences) or rl (an RL "
                        "post-training step, GRPO or PPO: generate, score, train; docs/rl.md).", choices=MODES,
                        modes=MODES, group="step")
    kv_dtype: Optional[str] = setting(None, "KV-cache dtype (default: the activation dtype; vLLM's "
                                      f"--kv-cache-dtype): {', '.join(KV_DTYPES)} with --mode infer (and --mode rl's "
                                      f"--rollout hf); {', '.join(SERVE_KV_DTYPES)} with --mode serve and --rollout "
                                      "vllm (SGLang: fp16 only with --precision fp16).", choices=KV_DTYPES, modes=("infer", "serve", "rl"),
                                      aliases=("--kv-cache-dtype",), group="step")
    server: str = setting("vllm", "Serving engine modelled, ENGINE or ENGINE==VERSION: vllm (vLLM's start-up "
                          "profiling and paged KV cache) or sglang (SGLang's static memory fraction and token pool); "
                          "plain ENGINE is its current release, ==VERSION one of the releases listed in "
                          "data/servers.toml (an unlisted one is refused with the list).",
                          check=_serving_versions.check, suggestions=SERVERS + _serving_versions.suggestions(),
                          example="vllm==0.11.0", group="serve")
    mem_fraction_static: Optional[float] = setting(None, "SGLang's --mem-fraction-static: the share of the free "
                                                   "memory for the weights and the KV pool (--server sglang).",
                                                   above=0, maximum=1, example="0.85",
                                                   auto="SGLang's own for the GPU, TP and PP (its memory_hook.py)", group="serve")
    gpu_memory_utilization: Optional[float] = setting(None, "Fraction of the GPU's memory the engine may take (vLLM's "
                                            "--gpu-memory-utilization; weights, activations and CUDA graphs come "
                                            "out of it, the rest is KV cache).", above=0, maximum=1, example="0.9",
                                            auto="the --server version's default: 0.92 for vLLM 0.33.0, 0.9 for "
                                            "0.11.0 (data/servers.toml)", group="serve")
    max_model_len: Optional[int] = setting(None, "Longest request (prompt + output) served, tokens (vLLM's "
                                           "--max-model-len).", maximum=limits.TOKENS, minimum=1,
                                           auto="the model's max_position_embeddings", example="8192", group="serve")
    max_num_batched_tokens: Optional[int] = setting(None, "Tokens per engine step (vLLM's "
                                                    "--max-num-batched-tokens; the profile run's size).",
                                                    maximum=limits.TOKENS, minimum=1, auto="vLLM's for the GPU: 8192 on H100/H200, "
                                                    "16384 from 160 GB, else 2048", example="8192", group="serve")
    max_num_seqs: Optional[int] = setting(None, "Sequences per engine step (vLLM's --max-num-seqs).",
                                          maximum=limits.TOKENS, minimum=1, auto="vLLM's for the GPU: 1024 on H100/H200 and up, "
                                          "else 256", example="256", group="serve")
    # vLLM's BlockSize: Literal[1, 8, 16, 32, 64, 128] (docs.vllm.ai/en/v0.9.2/api/vllm/config.html), 256 added by
    # the later releases (vllm/config/cache.py BlockSize), the --block-size choices its argument parser offers
    block_size: int = setting(16, "KV-cache block size, tokens (vLLM's --block-size).",
                              choices=(1, 8, 16, 32, 64, 128, 256), example="16", group="serve")
    concurrency: Optional[int] = setting(None, "Requests kept in flight by the clients (vllm bench serve's "
                                         "--max-concurrency): TTFT, TPOT and output tokens/s are timed at it, with "
                                         "--prompt-len and --completion-len tokens per request.", maximum=limits.TOKENS,
                                         minimum=1, auto="as many as the engine holds at once (--max-num-seqs, or "
                                         "the KV cache's requests)", example="64", group="serve")
    request_rate: Optional[float] = setting(None, "Requests per second offered to the deployment (vllm bench serve's "
                                            "--request-rate), each of --prompt-len + --completion-len tokens: "
                                            "`trainfit plan --mode serve` sizes the replicas so that each serves its "
                                            "share within --ttft-ms and --tpot-ms; an estimate names the replicas of "
                                            "its engine that rate needs.", above=0, maximum=1e9, example="10",
                                            group="serve")
    ttft_ms: Optional[float] = setting(None, "The most time to first token, milliseconds: plan --mode serve keeps "
                                       "each replica's load within it; an estimate says whether its TTFT meets it.",
                                       above=0, maximum=1e9, example="500", group="serve")
    enforce_eager: bool = setting(False, "No CUDA graphs (vLLM's --enforce-eager): no graph memory out of the "
                                  "budget.", group="serve")
    kv_cache_memory: Optional[int] = setting(None, "Bytes of KV cache per GPU, fixed (vLLM's --kv-cache-memory-bytes; "
                                             "K, M, G suffixes of 1000): the engine takes it as it is instead of "
                                             "gpu_memory_utilization less the profiled memory (the profile run "
                                             "still runs); too large a value does not fit the device.",
                                             parse=parse_byte_count, minimum=1, maximum=limits.Bound(limits.INT64_MAX, limits.INT64_BYTES),
                                             aliases=("--kv-cache-memory-bytes",), auto="profiled (gpu_memory_"
                                             "utilization)", example="40G", group="serve")
    draft_model: Optional[str] = setting(None, "Speculative decoding with a draft model (a catalog name or "
                                         "config.json; vLLM's --speculative-config model, SGLang's "
                                         "--speculative-draft-model-path): its weights and its KV cache share the "
                                         "engine's budget. Needs the target's vocabulary.", example="llama-3.2-1b", names_model=True, group="serve")
    speculative_algorithm: Optional[str] = setting(None, "SGLang's --speculative-algorithm: eagle or eagle3 (a "
                                                   "draft head given by --draft-model, sharing the target's "
                                                   "embedding), nextn (the target's own MTP layers, DeepSeek's "
                                                   "num_nextn_predict_layers; no --draft-model) or standalone (a "
                                                   "whole draft model).", choices=SPECULATIVE_ALGORITHMS,
                                                   auto="standalone with --draft-model, else none", group="serve")

    rl_algo: str = setting("grpo", "RL algorithm: grpo (TRL's GRPOTrainer: group-relative advantages, no critic) or "
                           "ppo (verl/OpenRLHF's PPO: a critic (value model) trained beside the policy).",
                           choices=RL_ALGOS, group="rl")
    group_size: int = setting(8, "Completions sampled per prompt (TRL's num_generations, default 8: "
                              "grpo_config.py:480; verl's rollout.n). With --batch P prompts and --grad-accum A, "
                              "each GPU generates P × group completions at once and trains on them in A "
                              "micro-batches of P × group / A (TRL's per_device_train_batch_size, which counts "
                              "completions).", maximum=limits.TOKENS, minimum=1, example="8", group="rl")
    prompt_len: int = setting(512, "Prompt tokens per sequence (the dataset's; TRL pads a batch's prompts to its "
                              "longest). --mode serve: each request's prompt (vllm bench serve's "
                              "--random-input-len).", maximum=limits.TOKENS, minimum=1, example="1024", group="rl",
                              modes=("rl", "serve"))
    completion_len: int = setting(512, "Generated tokens per completion (TRL's max_completion_length, default 512: "
                                  "grpo_config.py:494; modelled at full length: no early EOS). --mode serve: each "
                                  "request's output tokens (vllm bench serve's --random-output-len).",
                                  maximum=limits.TOKENS, minimum=1, example="4096", group="rl", modes=("rl", "serve"))
    rollout: str = setting("hf", "Who generates: hf (transformers' generate in the training process, TRL's default) "
                           "or vllm (a vLLM engine colocated on the same GPU with --vllm-gpu-memory-utilization of it, "
                           "TRL's vllm_mode='colocate', verl's hybrid engine).", choices=ROLLOUTS, group="rl")
    vllm_gpu_memory_utilization: float = setting(0.3, "--rollout vllm: the fraction of the GPU's memory the colocated "
                                                 "vLLM engine takes for its weights, activations, CUDA graphs and "
                                                 "KV cache (TRL's vllm_gpu_memory_utilization, default 0.3: "
                                                 "grpo_config.py:656).", above=0, maximum=1,
                                                 example="0.4", group="rl")
    beta: float = setting(0.0, "KL coefficient (TRL's beta, default 0.0: grpo_config.py:681). Above 0 a frozen "
                          "reference model is loaded and scores every completion (grpo_trainer.py:985-1003, "
                          "2709-2739); with --lora-rank the policy with its adapters disabled is the reference.",
                          minimum=0, example="0.04", group="rl")
    critic_model: Optional[str] = setting(None, "--rl-algo ppo: the critic (value model), a catalog name or "
                                          "config.json, trained beside the policy.",
                                          auto="the policy's model (the critic initialised from the policy's "
                                          "checkpoint; verl's critic.yaml takes its own model.path)",
                                          example="qwen2.5-0.5b", names_model=True, group="rl")
    reward_model: Optional[str] = setting(None, "A reward model scoring each completion (a catalog name or "
                                          "config.json; a sequence classifier, frozen).",
                                          auto="none: rule-based reward functions (TRL's reward_funcs)",
                                          example="qwen2.5-0.5b", names_model=True, group="rl")
    rl_placement: str = setting("colocated", "--mode rl on --dp GPUs: colocated (verl's hybrid engine "
                                "actor_rollout_ref, OpenRLHF's --train.colocate_all: the actor, reference, critic and "
                                "the vLLM engines share every GPU and take turns) or split (OpenRLHF's default "
                                "placement: the actor, reference, critic, reward model and vLLM engines each on "
                                "their own group of --dp GPUs).", choices=RL_PLACEMENTS, group="rl")
    rollout_tp: int = setting(1, "--rollout vllm: the engine's tensor-parallel size (verl's "
                              "rollout.tensor_model_parallel_size, OpenRLHF's --vllm.tensor_parallel_size); each "
                              "engine spans this many GPUs and generates their prompts together.",
                              maximum=limits.RANKS, minimum=1, example="2", group="rl")
    actor_param_offload: bool = setting(False, "--rl-placement colocated: the actor's (policy's) parameters go to "
                                        "host memory outside its own phases (verl's "
                                        "actor.fsdp_config.param_offload).", group="rl")
    actor_optimizer_offload: bool = setting(False, "--rl-placement colocated: the actor's optimizer states go to "
                                            "host memory outside its update (verl's "
                                            "actor.fsdp_config.optimizer_offload).", group="rl")
    ref_param_offload: bool = setting(False, "--rl-placement colocated: the reference model's weights go to host "
                                      "memory outside its scoring (verl's ref.fsdp_config.param_offload).",
                                      group="rl")
    vllm_sleep_level: int = setting(0, "--rollout vllm: the engine's sleep mode between generations: 0 (held, "
                                    "TRL's default), 1 (weights to host memory, KV cache freed: OpenRLHF's "
                                    "--vllm.enable_sleep) or 2 (weights and KV cache freed, weights re-synced from "
                                    "the actor: verl's free_cache_engine with vLLM >= 0.8.5).", choices=(0, 1, 2),
                                    group="rl")

    def __post_init__(self) -> None:
        self._settle()

    # The dataclass's own equality and hash, read off the instance's __dict__, which holds its fields and nothing else,
    # in their order (__init__ sets them in order; Setup.copied, keyed and the setters replace values in place): the
    # same answers without building two tuples of ~100 attributes (every memo of the engines and the planner is keyed
    # on setups; tests/test_settings.py test_setup_equality_and_hash_are_the_dataclass_fields)
    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self.__dict__ == other.__dict__
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.__dict__.values()))

    def _settle(self, changed: frozenset | None = None) -> None:
        """The normalisations, every rule (rules.validate), the stack's meaning of selective. `changed`: the fields
        set on a copy of a validated setup of the same mode (Setup._replaced): only their values (and those the
        normalisations write) are checked one by one again; None: every field."""
        if self.mode == "rl" and isinstance(self.prompt_len, int) and isinstance(self.completion_len, int):
            # an RL step's sequences are its prompts and completions: --seq follows them
            object.__setattr__(self, "seq", self.prompt_len + self.completion_len)
        if self.liger and self.loss == "full" and self.mode == "train":  # --liger's loss: Liger's fused linear cross-entropy (liger.py)
            object.__setattr__(self, "loss", "fused-linear")
        _rules.validate(self, changed)
        if self.recompute == "selective":  # the stack's own meaning, resolved once (stacks/*.toml [recompute])
            stack = _stacks.get_stack(self.stack)
            meaning = stack.fact("recompute", "selective")
            if meaning in stack.policies:  # another policy's name (torchtitan: op); else selective's own kind
                object.__setattr__(self, "recompute", meaning)

    @property
    def target_tokens(self) -> int:
        """An encoder-decoder model's decoder tokens: --target-seq, else the default (vocab.DEFAULT_TARGET_SEQ)."""
        return self.target_seq or DEFAULT_TARGET_SEQ

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree: --etp, else the stack's default ([expert_parallel] etp_default: torchtitan's
        expert_tensor_parallel_degree = 1), else --tp (Megatron's expert_tensor_parallel_size default)."""
        if self.etp is not None:
            return self.etp
        default = self.stack_facts.etp_default
        return self.tp if default is None else default

    @property
    def expert_dp(self) -> int:
        """Data-parallel ranks an expert is replicated on: the dp × cp × tp ranks of a stage over ep × etp
        (Megatron-Core parallel_state.py: expert layout etp × ep × expert-dp × pp = world)."""
        return self.dp * self.cp * self.tp // (self.ep * self.expert_tp)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step across all data-parallel ranks."""
        # --ulysses N: the N ranks of a sequence-parallel group share each sequence (UlyssesSPDataLoaderAdapter)
        return self.batch * self.seq * self.grad_accum * self.dp // self.ulysses

    @property
    def attention_kernel(self) -> str:
        """The kernel actually assumed: 'auto' resolves to flash on CUDA and sdpa (HF default) on CPU."""
        if self.attention != "auto":
            return self.attention
        return "flash" if self.device == "cuda" else "sdpa"

    @property
    def stack_facts(self) -> _stacks.Stack:
        return _stacks.get_stack(self.stack, self.stack_release)

    @property
    def optimizer_kernel(self) -> str:
        """for-loop, foreach or fused: the setting, else the stack's default, else torch.optim's own default
        (torch/optim/optimizer.py _default_to_fused_or_foreach: foreach for CUDA tensors, for-loop on CPU)."""
        impl = self.optimizer_impl or self.stack_facts.optimizer_impl(self.optimizer)
        if impl == "default":
            return "foreach" if self.device == "cuda" else "for-loop"
        return impl

    @property
    def grad_clip_norm(self) -> float:
        """The norm clip_grad_norm_ clips the gradients to before each optimizer step, 0.0 for no clipping (what
        the steps run and the analytic optimizer time prices): --max-grad-norm, else the stack's [grad_clip]
        max_norm (stacks/*.toml); none without an optimizer step or with --optimizer-in-backward."""
        if self.mode not in TRAINING or self.optimizer_in_backward:
            return 0.0
        if self.max_grad_norm is not None:
            return float(self.max_grad_norm)
        return self.stack_facts.max_grad_norm

    @property
    def recompute_policy(self) -> str:
        """The policy's name without its N: none, selective, full, op, layer, uniform, block."""
        return self.recompute.split(":", 1)[0]

    @property
    def recompute_layers(self) -> int:
        """N of layer:N, uniform:N and block:N (1 for full, 0 otherwise)."""
        if ":" in self.recompute:
            return int(self.recompute.split(":", 1)[1])
        return 1 if self.recompute == "full" else 0

    @property
    def layers_every(self) -> int:
        """N of `layer:N` (1 for full, 0 when no layer is checkpointed whole)."""
        if self.recompute.startswith("layer:"):
            return self.recompute_layers
        return 1 if self.recompute == "full" else 0

    @property
    def offload_state(self) -> str:
        """The model states --offload puts in host memory: none, optimizer or params (its activations part apart)."""
        return self.offload.removeprefix("activations").lstrip("+") or "none"

    @property
    def offload_activations(self) -> bool:
        """Whether --offload puts the saved activations in host memory (alone or with a state offload)."""
        return self.offload.startswith("activations")

    @property
    def policy(self) -> _precision.Precision:
        """The precision policy's dtypes (trainfit.precision)."""
        return _precision.PRECISIONS[self.precision]

    def with_(self, **changes) -> "Setup":
        """This setup with `changes`, validated (a new Setup). Memoised on this object and the changes: the
        engines derive the same setups again and again (recompute.layer_setup per layer kind, the fit advice's
        and the planner's variants), each a full validation (~100 µs). A Setup never changes once built (frozen;
        with_micro_batches and compute_time.op_list_setup alter fresh copies only), so the setup derived from one
        is the same every time; the memo holds the object it was derived from, so its id is not reused while the
        entry lives. Keyed by identity and the values' types, never by equality (2 == 2.0 == True: an equal setup
        of other types would hand back a setup of its types), and on the stack folders (validate reads them)."""
        try:
            key = (id(self), tuple((k, type(v), v) for k, v in changes.items()),
                   _os.environ.get(_stacks.PATH_VARIABLE))
            hit = _DERIVED.get(key)
        except TypeError:  # an unhashable value: not memoised
            return self._replaced(changes)
        if hit is not None and hit[0] is self:
            return hit[1]
        new = self._replaced(changes)
        if len(_DERIVED) >= _DERIVED_MAX:  # bounded: the oldest entry goes
            _DERIVED.pop(next(iter(_DERIVED)), None)
        _DERIVED[key] = (self, new)
        return new

    def copied(self) -> "Setup":
        """copy.copy(self) without its pickle-protocol round trip (__reduce_ex__, copyreg): a Setup is its fields'
        __dict__ (no slots, no state of its own), so a new object with that dict copied is the same copy. For the
        callers that set fields on the copy before anyone sees it (with_micro_batches, keyed)."""
        new = object.__new__(Setup)
        new.__dict__.update(self.__dict__)
        return new

    def keyed(self, fixed: tuple) -> "Setup":
        """This setup with the (setting, value) pairs of `fixed` set, unchecked: a memo key standing for every setup
        that differs from this one only in those settings (the engines' "never reads" lists: memory.NOT_IN_MEMORY,
        compute_time.NOT_IN_OP_LISTS, the planner's bounds, batch_free), never run; this setup itself where they
        already hold."""
        if all(getattr(self, k) == v for k, v in fixed):
            return self
        key = self.copied()
        for k, v in fixed:
            object.__setattr__(key, k, v)
        return key

    def _replaced(self, changes: dict) -> "Setup":
        """dataclasses.replace(self, **changes) without its keyword round trip through __init__ (~90 fields, each
        set through object.__setattr__): this setup's fields copied, the changes set, then __post_init__ (its
        normalisations and every rule, as __init__ runs them) on the result. Same fields in, same object out:
        replace passes __init__ this setup's field values, which is what the copy holds. An unknown name: replace's
        own TypeError."""
        if not changes.keys() <= _SETUP_FIELDS:
            return replace(self, **changes)
        new = self.copied()
        for k, v in changes.items():
            object.__setattr__(new, k, v)
        # the other fields' values passed check_value in this setup, for the same mode (a function of the setting,
        # the value and the mode alone: check_value) — but --stack's, whose choices are the stack folders'
        new._settle(None if "mode" in changes else frozenset(changes) | _SETTLED)
        return new

    def with_exchange(self, **changes) -> "Setup":
        """This setup with other expert-exchange settings (rules.EXCHANGE: the MoE dispatcher, its SMs,
        --overlap-moe-comm): the Setup `with_(**changes)` builds, checked by the rules those settings take part in
        (rules.exchange_rules) rather than by every rule again (the planner derives each group's dispatchers:
        plan/space.py TIMED). Other changes: `with_`."""
        if not changes.keys() <= set(_rules.EXCHANGE):
            return self.with_(**changes)
        new = self.copied()  # (no __init__: the other fields are this validated setup's)
        for k, v in changes.items():
            object.__setattr__(new, k, v)
        _rules.exchange_rules(new, frozenset(changes))
        return new

    def with_micro_batches(self, batch: int, grad_accum: int | None = None) -> "Setup":
        """This training setup with another micro-batch (and accumulation): the Setup `with_(batch=...,
        grad_accum=...)` builds, checked by the rules those two settings take part in (micro_batch_rules) rather
        than by every rule again (validate: ~35 µs; the planner derives hundreds of setups per search). Other modes
        (rl ties the batch to its completions): `with_`."""
        grad_accum = self.grad_accum if grad_accum is None else grad_accum
        if self.mode != "train":
            return self.with_(batch=batch, grad_accum=grad_accum)
        new = self.copied()  # (no __init__: the other fields are this validated setup's)
        object.__setattr__(new, "batch", batch)
        object.__setattr__(new, "grad_accum", grad_accum)
        _rules.micro_batch_rules(new)
        return new


_SETUP_FIELDS = frozenset(f.name for f in fields(Setup) if f.init)  # (Setup._replaced)
# the fields Setup._settle may write (its normalisations) or whose check reads more than the value: checked again on
# every derived setup
_SETTLED = frozenset({"seq", "loss", "recompute", "stack"})

# Setup.with_'s memo: (id(setup), changes, stack folders) -> (setup, derived setup); a few KB an entry
_DERIVED: dict = {}
_DERIVED_MAX = 2048


@dataclass(frozen=True)
class RunSettings:
    """Settings of the question rather than of the step: which GPU, what utilisation, what budget."""

    gpu: Optional[str] = setting(None, "GPU to check the fit and time against: a catalog name (see `trainfit "
                                 "gpus`) or a .json/.toml file with the catalog's fields.", example="H100-80GB", group="run")
    gpu_memory: Optional[float] = setting(None, "GiB of device memory per GPU as CUDA reports it "
                                          "(torch.cuda.mem_get_info()[1], vLLM's total_gpu_memory), replacing the "
                                          "GPU's own (a MIG slice, a memory cap, a variant the catalog lacks); needs "
                                          "--gpu.",
                                          above=0, maximum=4096, example="40", group="run")
    mfu: Optional[float] = setting(None, "Override the step-time model with a flat model-FLOPs utilisation "
                                   "(0 < mfu <= 1). --mode infer and serve: the prefill's only; decode stays "
                                   "timed op by op. --mode rl: the training steps' only; generation and scoring "
                                   "stay timed op by op.", above=0, maximum=1, example="0.4",
                                   modes=RL_STEP + ("serve",), group="run")
    tokens: Optional[float] = setting(None, "Training budget in tokens (e.g. 1e12, 15T): time, GPU-hours, cost "
                                      "and energy.", above=0, modes=("train",), parse=parse_count, example="15T", group="run")
    price: Optional[float] = setting(None, "GPU price per hour in USD (overrides the catalog; needs --gpu): the cost "
                                     "of a --tokens budget.", minimum=0,
                                     example="2.5", modes=("train",), group="run")
    power_limit: Optional[float] = setting(None, "Board power cap per GPU in W (nvidia-smi -pl): replaces the "
                                           "GPU's TDP for the run; below the power its kernel rates were measured "
                                           "at it lowers the SM clock and so the compute rates (power_clock), and "
                                           "the energy is the cap's. At most the TDP; needs --gpu.",
                                           above=0, example="700", group="run")
    cluster: Optional[str] = setting(None, "The nodes the GPUs sit in: a catalog cluster (dgx-a100, dgx-h100, "
                                     "dgx-h200, dgx-b200, gb200-nvl72, mi300x-node; data/clusters.toml) or a .toml "
                                     "file with their fields (GPUs per NVLink domain, NICs and their rate, NVLS, "
                                     "SHARP; docs/distributed.md). It sets the GPUs per node and the rails each "
                                     "collective runs over. Default: the GPU's usual node (one NIC per GPU, "
                                     "gpus.json). Needs --gpu.", example="dgx-h100", modes=TRAINING, group="run")
    host_memory: Optional[float] = setting(None, "GiB of host (CPU) memory per node, replacing the cluster's "
                                           "(--cluster; data/clusters.toml host_memory): a training step whose "
                                           "offloaded states and pinned buffers on the node's GPUs need more does "
                                           "not fit. Without either, the host memory is reported, not judged. "
                                           "Needs --gpu.", above=0, maximum=1048576, example="2048",
                                           modes=("train",), group="run")
    reserve: float = setting(0.0, "Extra GiB per GPU kept free when judging the fit (the CUDA context, cuBLAS "
                             "workspace and NCCL buffers are already taken off the capacity): other processes on "
                             "the GPU, a safety margin.", minimum=0, maximum=1024, example="2",
                             modes=RL_STEP, group="run")
    alloc_conf: Optional[str] = setting(None, "The CUDA caching allocator's settings for the trace's reserved and "
                                        "required, in "
                                        "PYTORCH_CUDA_ALLOC_CONF syntax (max_split_size_mb, expandable_segments, "
                                        "roundup_power2_divisions, garbage_collection_threshold); the analytic "
                                        "engine models expandable_segments of a training step.",
                                        auto="torch's defaults", check=lambda v: _check_alloc_conf(v),
                                        example="expandable_segments:True", modes=STEP_MODES, group="run")


# -- the registry -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    name: str
    type: Any  # the Python annotation (int, str, bool, Optional[...])
    default: Any  # the Setup/RunSettings default
    meta: Meta
    owner: type  # Setup or RunSettings
    base_type: type  # int, float, str or bool (Optional stripped)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def request_default(self) -> Any:
        return None if self.meta.auto else self.default

    def as_flag(self, value) -> str:
        """The CLI text that sets `value` ("" at the default; a switch by its flag alone)."""
        if value == self.default:
            return ""
        return self.flag if value is True else f"{self.flag} {value}"


def _base_type(annotation) -> type:
    t = eval(annotation, {"Optional": Optional}) if isinstance(annotation, str) else annotation  # postponed annotations
    args = getattr(t, "__args__", None)
    return next(a for a in args if a is not type(None)) if args else t  # Optional[X] -> X


def settings() -> tuple[Setting, ...]:
    """Every setting, in declaration order (Setup's, then RunSettings')."""
    out = []
    for owner in (Setup, RunSettings):
        for f in fields(owner):
            meta = f.metadata.get("setting")
            if meta is not None:
                out.append(Setting(f.name, f.type, f.default if f.default is not MISSING else None, meta, owner,
                                   _base_type(f.type)))
    return tuple(out)


SETTINGS = settings()
BY_NAME = {s.name: s for s in SETTINGS}
SETUP_NAMES = tuple(s.name for s in SETTINGS if s.owner is Setup)
_SETUP_SETTINGS = tuple(s for s in SETTINGS if s.owner is Setup)
_RUN_SETTINGS = tuple(s for s in SETTINGS if s.owner is RunSettings)


def choices_for(s: Setting, mode: str) -> tuple | None:
    if s.name == "stack":
        return _stacks.names()
    if s.name == "precision":
        return {"train": TRAIN_PRECISIONS, "rl": TRAIN_PRECISIONS, "serve": SERVE_PRECISIONS}.get(mode,
                                                                                                INFER_PRECISIONS)
    if s.name == "quant":
        return {"train": QUANTS, "serve": SERVE_QUANTS}.get(mode, s.meta.choices)
    return s.meta.choices


def _example(s: Setting) -> str:
    """" (e.g. --flag VALUE)" for a setting with an example, "" without (for its error messages)."""
    return f" (e.g. {s.flag} {s.meta.example})" if s.meta.example else ""


# Values check_value passed, as (setting, value's type, value, mode): the check is a function of those alone (its
# choices, bounds and `check` rules read no state) but --stack's, whose choices are the stack folders' (not kept).
# Every Setup built checks its ~90 settings again (Setup.with_, the planner's setups): most values recur.
_PASSED: set = set()
_PASSED_MAX = 8192


def check_value(s: Setting, v: Any, mode: str = "train") -> None:
    """One setting's value: its type, bounds and allowed choices (None: its default, where it has no value of its
    own: an optional setting's, or one the model or the stack decides)."""
    if v is None:
        if s.request_default is not None:
            raise SetupError(f"{s.flag} needs a value, not None{_example(s) or f' (default {s.default!r})'}")
        return
    try:
        key = (s.name, type(v), v, mode)
        if key in _PASSED:
            return
    except TypeError:  # an unhashable value: checked, not kept
        key = None
    _check_value(s, v, mode)
    if key is not None and s.name != "stack":
        if len(_PASSED) >= _PASSED_MAX:
            _PASSED.clear()
        _PASSED.add(key)


def _check_value(s: Setting, v: Any, mode: str) -> None:
    m = s.meta
    t = s.base_type
    if t is bool:
        if not isinstance(v, bool):
            raise SetupError(f"{s.flag} is a switch (true/false), got {v!r}")
        return
    if t is str and not isinstance(v, str):
        raise SetupError(f"{s.flag} must be text, got {v!r}{_example(s)}")
    if t is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SetupError(f"{s.flag} must be an integer, got {v!r}{_example(s)}")
    if t is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SetupError(f"{s.flag} must be a number, got {v!r}{_example(s)}")
        if not math.isfinite(v):
            raise SetupError(f"{s.flag} must be a finite number, got {v!r}{_example(s)}")
    allowed = choices_for(s, mode)
    if allowed is not None and v not in allowed:
        hint = f" ({mode} mode)" if s.name == "precision" else ""
        raise SetupError(f"{s.flag} {v!r} is not supported{hint}; choose one of: {', '.join(map(str, allowed))}")
    if m.check is not None:
        m.check(v)
    if t in (int, float):
        low = m.minimum if m.minimum is not None else m.above
        if (m.minimum is not None and v < m.minimum) or (m.above is not None and v <= m.above):
            what = "a positive integer" if t is int and low == 1 else (
                f"greater than {m.above:g}" if m.above is not None else f"at least {m.minimum:g}")
            raise SetupError(f"{s.flag} must be {what}, got {v!r}{_example(s)}")
        if m.maximum is not None and v > m.maximum:
            why = f"; {m.maximum.why}" if isinstance(m.maximum, limits.Bound) else ""
            raise SetupError(f"{s.flag} must be at most {m.maximum:,}, got {v!r}{_example(s)}{why}")


_INAPPLICABLE: dict = {}  # (id(settings), mode) -> (settings, those of them that do not apply to mode)


def _inapplicable(settings, mode: str) -> tuple:
    """The settings of `settings` (a tuple, as the registry's are) that do not apply to `mode`, in order;
    remembered per tuple object and mode, the entry holding the tuple (its id is not reused while it lives)."""
    hit = _INAPPLICABLE.get((id(settings), mode))
    if hit is not None and hit[0] is settings:
        return hit[1]
    out = tuple(s for s in settings if mode not in s.meta.modes)
    if isinstance(settings, tuple):  # (a list could change: not kept)
        if len(_INAPPLICABLE) >= 64:
            _INAPPLICABLE.clear()
        _INAPPLICABLE[(id(settings), mode)] = (settings, out)
    return out


def parse_value(s: Setting, value: Any) -> Any:
    """Text from the CLI or the web -> the setting's value, with a one-line error naming the flag."""
    if s.meta.repeatable and not isinstance(value, str):  # the flag given several times (or not at all)
        value = ",".join(value) if value else s.request_default
    if value is None or s.meta.parse is None or not isinstance(value, str):
        return value
    try:
        return s.meta.parse(value)
    except (ValueError, ArithmeticError) as e:
        raise SetupError(f"{s.flag} {value!r}: {e}{_example(s)}") from None


def refuse_inapplicable(values, settings, mode: str, only: frozenset | None = None) -> None:
    """Flags set away from their default that do not apply to `mode` are refused, not ignored (named at once).
    `only`: those names alone (the others' values passed for this mode already: a function of the setting, its value
    and the mode)."""
    _refuse_off([s for s in _inapplicable(settings, mode) if (only is None or s.name in only)
                 and getattr(values, s.name) != s.default], mode)


def given_flags(values, names) -> list[str]:
    """The flags of the settings `names` that `values` (a Request) sets away from their defaults, in that order."""
    return [BY_NAME[n].flag for n in names if getattr(values, n) != BY_NAME[n].default]


def refuse_unread(names, what: str, read: tuple[str, ...] | None = None) -> None:
    """The keywords `names` a Python API call was given: one that is no setting is named with the closest one, and
    with `read` (the settings `what` reads) one it does not read is refused, never ignored."""
    from difflib import get_close_matches

    for n in names:
        if n not in BY_NAME:
            near = get_close_matches(n, list(BY_NAME), n=1)
            raise SetupError(f"{what}: {n!r} is no setting{f'; did you mean {near[0]!r}?' if near else ''} "
                             "(trainfit.SETTINGS lists them)")
    off = [n for n in names if read is not None and n not in read]
    if off:
        raise SetupError(f"{what} does not read {', '.join(map(repr, off))}: drop "
                         f"{'them' if len(off) > 1 else 'it'} (it reads {', '.join(read)})")


def refuse_written(names: frozenset, mode: str, rollout: str | None = None, server: str | None = None) -> None:
    """The flags the user wrote (`names`: the CLI's command line) that do not apply to `mode` are refused at any
    value, their default included (a value alone cannot tell a written default from an unwritten flag); so are those
    of the other rollout engine (--mode rl) or serving engine (--mode serve) than `rollout` / `server` name, which
    rules.py refuses away from their defaults."""
    _refuse_off([s for s in _inapplicable(SETTINGS, mode) if s.name in names], mode)
    if mode == "rl" and rollout is not None and rollout != "vllm":
        off = [BY_NAME[n].flag for n in VLLM_ROLLOUT if n in names]
        if off:
            raise SetupError(f"{' and '.join(off)} {'set' if len(off) > 1 else 'sets'} the vLLM rollout engine: "
                             f"{'they need' if len(off) > 1 else 'it needs'} --rollout vllm (this is --rollout "
                             f"{rollout})")
    if mode == "serve" and server is not None:
        refuse_other_server([BY_NAME[n] for n in other_server_settings(server) if n in names], server)


def other_server_settings(server: str) -> tuple[str, ...]:
    """The settings only the other serving engine than --server's reads (vLLM's under SGLang, SGLang's under vLLM)."""
    return VLLM_ONLY if _serving_versions.engine_of(server) == "sglang" else SGLANG_ONLY


def refuse_other_server(off: list, server: str) -> None:
    """`off` (settings of the other serving engine, given) refused in one line; under SGLang the memory flags get
    their counterpart named."""
    if off:
        sglang = _serving_versions.engine_of(server) == "sglang"
        fraction = sglang and any(s.name in ("gpu_memory_utilization", "kv_cache_memory") for s in off)
        raise SetupError(f"{' and '.join(s.flag for s in off)} {'do' if len(off) > 1 else 'does'} not apply to "
                         f"--server {server}: drop {'them' if len(off) > 1 else 'it'}"
                         + (" (SGLang sizes its memory with --mem-fraction-static)" if fraction else ""))


# --mode rl: the settings of TRL's / verl's colocated vLLM engine (rules.py _validate_rl, _validate_rl_placement)
VLLM_ROLLOUT = ("vllm_gpu_memory_utilization", "rollout_tp", "vllm_sleep_level")


def _refuse_off(off: list, mode: str) -> None:
    if off:
        flags, them = " and ".join(s.flag for s in off), "them" if len(off) > 1 else "it"
        where = {"/".join(s.meta.modes) for s in off}
        if len(where) > 1:
            raise SetupError(f"{flags} do not apply to --mode {mode}: drop {them}")
        raise SetupError(f"{flags} {'apply' if len(off) > 1 else 'applies'} to {where.pop()} only, not --mode "
                         f"{mode}: drop {them}")


# (imported last, as the module, not its names: rules.py imports this module; a function-level import costs its
# resolution on every call, and this one sits on the engine's and the planner's hot path)
from . import rules as _rules  # noqa: E402
