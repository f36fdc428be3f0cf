"""THE one definition of a run's settings (no torch).

Each setting is declared once, here, with its type, default, help text, allowed values, bounds and the modes it
applies to. Everything else is generated from these declarations:
  * `Setup`  — how the model is run (what the engines read);
  * `Request` — a model plus every setting, flat (the Python API's, CLI's and web API's view), built by
    `make_request_class` below;
  * the CLI options of every command (trainfit.cli.options), the web form and the web API's schema (trainfit.web).
Adding a setting = one field below (plus the formula that uses it).

Validation happens once, in `validate`: positive integers, finite numbers within bounds, allowed choices, and
flags that do not apply to the mode (refused, never silently ignored).
"""
from __future__ import annotations

import copy
import math
from dataclasses import MISSING, dataclass, field, fields, make_dataclass, replace
from typing import Any, Callable, Optional

from . import heads as _heads
from . import precision as _precision
from . import stacks as _stacks
from . import limits
from .errors import SetupError
from .units import parse_count

MODES = ("train", "infer", "serve", "rl")
STEP_MODES = ("train", "infer")  # a setting applies to these unless it says otherwise
# the modes with a policy update: a training step, and an RL step, which runs one (analytic/rl.py)
TRAINING = ("train", "rl")
# the settings of a training step or an inference step that an RL step runs too
RL_STEP = ("train", "infer", "rl")
RL_ALGOS = ("grpo", "ppo")  # --rl-algo
ROLLOUTS = ("hf", "vllm")  # --rollout: HF generate in the trainer, or a colocated vLLM engine
SERVERS = ("vllm", "sglang")  # --server: the serving engine modelled (analytic/serving.py, serving_sglang.py)
# settings one server reads and the other has no counterpart for (refused under the other: _validate_serve)
VLLM_ONLY = ("gpu_memory_utilization", "block_size", "max_num_batched_tokens", "max_num_seqs")
SGLANG_ONLY = ("mem_fraction_static", "speculative_algorithm")
# --speculative-algorithm (SGLang 0.5.23's builtins that keep a draft KV pool beside the target's:
# sglang/srt/arg_groups/fields/spec.py:31-34; analytic/serving_sglang_spec.py)
SPECULATIVE_ALGORITHMS = ("eagle", "eagle3", "nextn", "standalone")
SERVE_PRECISIONS = ("bf16", "fp16", "fp32")  # vLLM's --dtype (no autocast: the weights' dtype)
TRAIN_PRECISIONS = _precision.TRAIN_PRECISIONS
INFER_PRECISIONS = _precision.INFER_PRECISIONS
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor", "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion")
# built by bitsandbytes (bnb.optim.AdamW / Lion with optim_bits and is_paged), as the HF Trainer builds its
# adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit and lion_32bit (transformers 5.23 trainer_optimizer.py:246-292)
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion")
# patterns beside these names (see `check_recompute`): "layer:N" (torchtitan: every N-th layer checkpointed whole),
# "uniform:N" and "block:N" (Megatron's recompute_method with recompute_num_layers N)
RECOMPUTE = ("none", "selective", "full", "op")
RECOMPUTE_PATTERNS = ("layer", "uniform", "block")
COMMON_RECOMPUTE = ("none", "selective", "full")  # every stack's own meaning (selective: stacks/*.toml [recompute])
OFFLOAD = ("none", "optimizer", "params", "activations")
QUANTS = ("nf4", "fp4", "int8")  # --quant: bitsandbytes formats of the frozen base (step/quant.py)
SERVE_QUANTS = ("fp8", "awq", "gptq")  # --quant in --mode serve: vLLM's weight formats (analytic/serving.py)
LORA_DTYPES = ("fp32", "weight")  # --lora-dtype
LOSSES = ("full", "fused-linear", "chunked-logprob")  # --loss
STACKS = _stacks.BUILT_IN  # (--stack's help; choices_for reads every stack found: stacks.names())
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
HEADS = _heads.HEADS
ATTENTION = ("auto", "eager", "sdpa", "flash", "flash2", "triton")
DEVICES = ("cuda", "cpu")
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
DEFAULT_SEQ = 2048


def combine_offload(text: str) -> str:
    """--offload given several times ("optimizer,params"): one of OFFLOAD. DeepSpeed's offload_param comes with
    offload_optimizer in trainfit's model (ZeRO-Infinity, analytic/parallel/deepspeed.py), so the pair is `params`;
    torchtune's activation offloading and DeepSpeed's offload are two stacks' features, and one run has one stack."""
    if not text.strip(", "):
        raise ValueError(f"choose from {', '.join(OFFLOAD)}")
    parts = {p.strip() for p in text.split(",") if p.strip()} - {"none"}
    unknown = parts - set(OFFLOAD)
    if unknown:
        raise ValueError(f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(OFFLOAD)}")
    if "activations" in parts and len(parts) > 1:
        raise ValueError("activations (torchtune's offloading, --stack hf) cannot be combined with DeepSpeed's "
                         "optimizer/params offload (--stack deepspeed): choose one")
    return "params" if "params" in parts else (parts.pop() if parts else "none")


@dataclass(frozen=True)
class Meta:
    """What a setting means and accepts (dataclass field metadata under the key "setting")."""

    help: str
    choices: tuple | None = None  # allowed values (for precision: by mode, see `choices_for`)
    minimum: float | None = None  # inclusive lower bound for numbers
    maximum: float | None = None  # inclusive upper bound
    above: float | None = None  # exclusive lower bound (e.g. mfu > 0)
    modes: tuple[str, ...] = STEP_MODES  # the modes the setting applies to
    short: str | None = None  # one-letter CLI alias
    auto: str | None = None  # the request default is None, resolved later (how, in words, for --help)
    parse: Callable[[str], Any] | None = None  # CLI/web text -> value (e.g. "15T" -> 1.5e13)
    example: str = ""  # a valid value, for error messages
    check: Callable[[Any], None] | None = None  # a value rule beyond choices and bounds (raises SetupError)
    suggestions: tuple = ()  # common values of a free-form setting (the web form offers them)
    repeatable: bool = False  # the flag may be given several times (or "a,b"): `parse` combines the values
    aliases: tuple[str, ...] = ()  # other CLI names (an engine's own flag name)
    names_model: bool = False  # the value names a model, resolved by models.resolve.load_model (and its rule)


def setting(default, help: str, **meta) -> Any:
    return field(default=default, metadata={"setting": Meta(help, **meta)})


@dataclass(frozen=True)
class Setup:
    """How the model is run: batch, sequence, precision, optimizer, recompute, kernels and parallel layout."""

    batch: int = setting(1, "Micro-batch per GPU (sequences). --mode rl: prompts per optimizer step per GPU, each "
                         "sampled --group-size times (see --group-size for TRL's names).",
                         maximum=limits.TOKENS, minimum=1, short="-b",
                         example="8", modes=RL_STEP)
    seq: int = setting(DEFAULT_SEQ, "Sequence length (training) or context length (inference), tokens (--mode rl: "
                       "--prompt-len + --completion-len, not set).", maximum=limits.TOKENS, minimum=1, short="-s",
                       auto="2048, or the model's position limit if smaller", example="4096", modes=RL_STEP)
    grad_accum: int = setting(1, "Micro-batches accumulated per optimizer step.",
                              maximum=limits.TOKENS, minimum=1, modes=TRAINING,
                              example="4")
    precision: str = setting("amp-bf16", "Precision policy. Training: " + ", ".join(
        f"{n} ({_precision.PRECISIONS[n].summary})" for n in TRAIN_PRECISIONS) + ". Inference: " + ", ".join(
        INFER_PRECISIONS) + ". Serving: the weights' dtype (bf16, fp16, fp32).", choices=INFER_PRECISIONS,
        auto="the stack's for training (hf, torchtitan: amp-bf16; megatron, deepspeed: bf16-master), bf16 for "
        "inference and serving", modes=MODES)
    optimizer: str = setting("adamw", "Optimizer.", choices=OPTIMIZERS, modes=TRAINING)
    recompute: str = setting("none", "Activation checkpointing: none; full (every layer); layer:N (every N-th "
                             "layer, torchtitan); op (torchtitan's per-op SAC: saves matmul and attention outputs, "
                             "recomputes every second matmul and all else); uniform:N (Megatron: groups of N layers, "
                             "only each group's input kept) and block:N (Megatron: the first N layers of each stage "
                             "checkpointed); selective = the stack's own meaning (torchtitan: op; megatron: core "
                             "attention; hf: the attention scores, needs --attention eager).",
                             modes=TRAINING, check=lambda v: check_recompute(v), example="op",
                             suggestions=RECOMPUTE + ("layer:2", "uniform:1", "block:4"))
    attention: str = setting("auto", "Attention kernel: eager (stores s×s scores), sdpa, flash (the fused kernel "
                             "torch's SDPA picks: cuDNN on H100/H200 from torch 2.9); flash2 = FlashAttention-2 (SDPA "
                             "before torch 2.9, or the flash-attn package; CUDA, 16-bit); triton = FlashAttention in "
                             "Triton (llm-foundry's attn_impl: triton; CUDA, 16-bit, --stack hf; saves what flash "
                             "saves, runs slower); auto = flash on cuda, sdpa on cpu.",
                             choices=ATTENTION, modes=RL_STEP)
    dp: int = setting(1, "Data-parallel degree.", maximum=limits.RANKS, minimum=1, modes=("train",), example="8")
    tp: int = setting(1, "Tensor-parallel degree (divides heads).",
                      maximum=limits.RANKS, minimum=1, example="8", modes=MODES)
    pp: int = setting(1, "Pipeline-parallel degree (1F1B schedule; layers split per --pp-split).",
                      maximum=limits.RANKS, minimum=1,
                      example="4", modes=MODES)
    vpp: int = setting(1, "Virtual pipeline stages per pipeline rank (Megatron's interleaved 1F1B: each rank holds "
                       "--vpp model chunks).", maximum=limits.RANKS, minimum=1, modes=("train",), example="3")
    pp_split: str = setting("even", "How layers are split over pipeline stages: even; embedding-loss (Megatron's "
                            "account_for_embedding/loss_in_pipeline_split: the embedding and the loss each count as "
                            "one layer, so the first and last stages hold one layer fewer); first:N,last:M (Megatron's "
                            "decoder_first/last_pipeline_num_layers, the rest even).", check=lambda v: check_pp_split(v),
                            example="embedding-loss", suggestions=("even", "embedding-loss"))
    cp: int = setting(1, "Context-parallel degree (Megatron's ring attention: each rank holds --seq / cp tokens of "
                      "every sequence).", maximum=limits.RANKS, minimum=1, modes=("train",), example="2")
    ep: int = setting(1, "Expert-parallel degree for MoE models (experts split over ep ranks, carved out of dp × cp × "
                      "tp).", maximum=limits.RANKS, minimum=1, modes=("train",), example="8")
    etp: Optional[int] = setting(None, "Expert tensor-parallel degree (each expert's matrices split over etp ranks).",
                                 maximum=limits.RANKS, minimum=1, modes=("train",), auto="--tp (Megatron's default)",
                                 example="1")
    zero: int = setting(0, "ZeRO stage over --dp ranks: 0 (DDP), 1 (optimizer), 2 (+gradients), 3 (+weights, "
                        "= FSDP).", choices=(0, 1, 2, 3), modes=("train",))
    sequence_parallel: bool = setting(False, "Megatron sequence parallelism (shards norm/dropout activations "
                                      "over --tp ranks).", modes=("train",))
    stack: str = setting("hf", "Training stack whose step is modelled: hf (HF Trainer/accelerate: torch.autocast, "
                         "fused AdamW, HF RMSNorm in fp32), torchtitan (FSDP2 mixed precision: bf16 all-gather and "
                         "fp32 reduce; fused AdamW; per-op SAC), megatron (Megatron-Core: 16-bit weights, fp32 "
                         "main grads and distributed optimizer (--zero 1), fused kernels, TP/SP/PP/CP/EP) or "
                         "deepspeed (ZeRO 0-3 with FusedAdam, bucketed reduction, offload). Facts and sources: "
                         "trainfit/stacks/*.toml.",
                         choices=STACKS, modes=("train",))
    compile: bool = setting(False, "torch.compile the model (inductor), as the stack does it: torchtitan compiles each "
                            "block and the loss, the HF Trainer's torch_compile the whole model. Its partitioner saves "
                            "matmul/attention outputs and recomputes pointwise chains in backward (modelled for "
                            "Llama-style blocks and the loss).", modes=("train",))
    tf32: bool = setting(False, "fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = True, "
                         "HF TrainingArguments tf32=True). Off is PyTorch's default: fp32 matmuls then run at the GPU's "
                         "fp32 rate, 7x slower than TF32 on an H100. Time only; --precision fp32.")
    float8: bool = setting(False, "Float8 training of the linear layers (torchao Float8Linear, tensorwise dynamic "
                           "scaling, fp8 FSDP all-gather), as torchtitan applies it: --stack torchtitan; fp8 GEMMs "
                           "need a GPU with fp8 tensor cores (H100/H200/B200/L4/L40S...).", modes=("train",))
    offload: str = setting("none", "What lives in host memory: optimizer (DeepSpeed ZeRO-Offload: fp32 master and "
                           "optimizer states, the step on the CPU; --zero >= 1; --stack deepspeed), params "
                           "(ZeRO-Infinity: the 16-bit weights too; --zero 3; --stack deepspeed) or activations "
                           "(torchtune's activation offloading: saved tensors to pinned host memory in forward, back "
                           "in backward; --stack hf, analytic engine). Repeatable: --offload optimizer --offload "
                           "params is ZeRO-Infinity's pair, the same as params.", choices=OFFLOAD, modes=("train",),
                           repeatable=True, parse=lambda v: combine_offload(v), example="optimizer")
    optimizer_impl: Optional[str] = setting(None, "Optimizer kernel: for-loop, foreach (multi-tensor, with "
                                            "temporaries) or fused (in place).", choices=OPTIMIZER_IMPLS,
                                            modes=TRAINING,
                                            auto="the stack's (fused for Adam/AdamW/SGD; torch's "
                                            "default otherwise: foreach on cuda, for-loop on cpu)")
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
                                             "with --optimizer-in-backward", example="0", suggestions=(0, 0.5, 1.0))
    head: Optional[str] = setting(None, "Task head trained: causal-lm, masked-lm, seq-cls (sequence "
                                  "classification), token-cls (token classification); labels from the config's "
                                  "num_labels/id2label (default 2).", choices=HEADS, modes=("train",),
                                  auto="the config's architectures (e.g. BertForSequenceClassification -> seq-cls), "
                                  "else the family's LM head", example="seq-cls")
    lora_rank: int = setting(0, "LoRA adapter rank (peft's LoraConfig r): the base weights are frozen and only the "
                             "adapters train; 0 = full fine-tuning. Alpha does not change memory; lora_dropout 0.",
                             maximum=limits.RANK_ROWS, minimum=0, modes=TRAINING, example="16",
                             suggestions=(0, 8, 16, 64))
    lora_targets: str = setting("all-linear", "Linear layers that get adapters: all-linear (peft's: every Linear "
                                "but the output head), attention (q/k/v/o projections) or comma-separated module "
                                "names (e.g. q_proj,v_proj); needs --lora-rank.", modes=TRAINING,
                                check=lambda v: check_lora_targets(v), example="q_proj,v_proj",
                                suggestions=("all-linear", "attention", "q_proj,v_proj"))
    dora: bool = setting(False, "DoRA (weight-decomposed LoRA, peft use_dora): a trainable magnitude per output "
                         "feature of each adapted Linear; needs --lora-rank.", modes=TRAINING)
    quant: Optional[str] = setting(None, "Frozen base weights quantised by bitsandbytes, as transformers' "
                                   "BitsAndBytesConfig loads them: nf4 or fp4 (4-bit, blocks of 64, double "
                                   "quantisation, compute dtype = the matmul dtype) or int8 (LLM.int8); every "
                                   "Linear but the output head; with --lora-rank this is QLoRA; --stack hf. "
                                   "Serving (vLLM's --quantization): fp8, or awq / gptq (4-bit, groups of 128).",
                                   choices=QUANTS + SERVE_QUANTS, modes=("train", "serve"), example="nf4")
    lora_dtype: str = setting("fp32", "dtype of the LoRA adapters (their gradients and optimizer states follow): "
                              "fp32 (peft's default autocast_adapter_dtype=True) or weight (the precision's weight "
                              "dtype, as torchtune builds them); needs --lora-rank.", choices=LORA_DTYPES,
                              modes=TRAINING)
    loss: str = setting("full", "Loss kernel: full (the model's own: whole logits, upcast to fp32) or fused-linear "
                        "(Liger's fused linear cross-entropy, as TRL's use_liger_kernel applies it: the LM head and the "
                        "loss run chunk by chunk, the logits never whole, the head's gradients made in forward) or "
                        "chunked-logprob (TRL's fused LM head, what its GRPO trainer trains with: per-token "
                        "log-probs from [4096 × 32768] logits tiles, recomputed in backward; --mode rl uses it); "
                        "--stack hf, analytic engine.", choices=LOSSES, modes=("train",))
    optimizer_in_backward: bool = setting(False, "Step the optimizer inside the backward pass, one parameter at a "
                                          "time as its gradient is ready, and free that gradient at once (torchtune's "
                                          "optimizer_in_bwd): gradients never all live. Needs --grad-accum 1 and one "
                                          "GPU (no --dp).", modes=("train",))
    image_size: Optional[int] = setting(None, "Image side in pixels (vision models: resnet, convnext, vit); the "
                                        "batch is images.", minimum=1, maximum=8192, modes=("train",),
                                        auto="the config's image_size (224 for the ImageNet models)", example="224")
    channels_last: bool = setting(False, "Run a vision model in the channels-last memory format (NHWC; the same "
                                  "bytes, other kernels).", modes=("train",))
    device: str = setting("cuda", "Kernel semantics: cuda (flash SDPA, the CUDA allocator's 512-byte rounding, "
                          "torch's foreach optimizer default) or cpu (PyTorch CPU kernels, for-loop default).",
                          choices=DEVICES, modes=MODES)
    mode: str = setting("train", "train (a training step), infer (prefill + one decode step), serve (a serving "
                        "engine's memory: its KV-cache capacity in tokens and concurrent sequences) or rl (an RL "
                        "post-training step, GRPO or PPO: generate, score, train; docs/rl.md).", choices=MODES,
                        modes=MODES)
    kv_dtype: Optional[str] = setting(None, "KV-cache dtype (default: the activation dtype; vLLM's "
                                      "--kv-cache-dtype).", choices=KV_DTYPES, modes=("infer", "serve", "rl"),
                                      aliases=("--kv-cache-dtype",))
    server: str = setting("vllm", "Serving engine modelled: vllm (vLLM 0.33's start-up profiling and paged KV "
                          "cache) or sglang (SGLang 0.5.23's static memory fraction and token pool).",
                          choices=SERVERS, modes=("serve",))
    mem_fraction_static: Optional[float] = setting(None, "SGLang's --mem-fraction-static: the share of the free "
                                                   "memory for the weights and the KV pool (--server sglang).",
                                                   above=0, maximum=1, modes=("serve",), example="0.85",
                                                   auto="SGLang's own for the GPU, TP and PP (its memory_hook.py)")
    gpu_memory_utilization: float = setting(0.92, "Fraction of the GPU's memory the engine may take (vLLM's "
                                            "--gpu-memory-utilization; weights, activations and CUDA graphs come "
                                            "out of it, the rest is KV cache).", above=0, maximum=1,
                                            modes=("serve",), example="0.9")
    max_model_len: Optional[int] = setting(None, "Longest request (prompt + output) served, tokens (vLLM's "
                                           "--max-model-len).", maximum=limits.TOKENS, minimum=1, modes=("serve",),
                                           auto="the model's max_position_embeddings", example="8192")
    max_num_batched_tokens: Optional[int] = setting(None, "Tokens per engine step (vLLM's "
                                                    "--max-num-batched-tokens; the profile run's size).",
                                                    maximum=limits.TOKENS, minimum=1,
                                                    modes=("serve",), auto="vLLM's for the GPU: 8192 on H100/H200, "
                                                    "16384 from 160 GB, else 2048", example="8192")
    max_num_seqs: Optional[int] = setting(None, "Sequences per engine step (vLLM's --max-num-seqs).",
                                          maximum=limits.TOKENS, minimum=1,
                                          modes=("serve",), auto="vLLM's for the GPU: 1024 on H100/H200 and up, "
                                          "else 256", example="256")
    block_size: int = setting(16, "KV-cache block size, tokens (vLLM's --block-size).",
                              maximum=limits.TOKENS, minimum=1,
                              modes=("serve",), example="16")
    enforce_eager: bool = setting(False, "No CUDA graphs (vLLM's --enforce-eager): no graph memory out of the "
                                  "budget.", modes=("serve",))
    draft_model: Optional[str] = setting(None, "Speculative decoding with a draft model (a catalog name or "
                                         "config.json; vLLM's --speculative-config model, SGLang's "
                                         "--speculative-draft-model-path): its weights and its KV cache share the "
                                         "engine's budget. Needs the target's vocabulary.",
                                         modes=("serve",), example="llama-3.2-1b", names_model=True)
    speculative_algorithm: Optional[str] = setting(None, "SGLang's --speculative-algorithm: eagle or eagle3 (a "
                                                   "draft head given by --draft-model, sharing the target's "
                                                   "embedding), nextn (the target's own MTP layers, DeepSeek's "
                                                   "num_nextn_predict_layers; no --draft-model) or standalone (a "
                                                   "whole draft model).", choices=SPECULATIVE_ALGORITHMS,
                                                   modes=("serve",),
                                                   auto="standalone with --draft-model, else none")

    rl_algo: str = setting("grpo", "RL algorithm: grpo (TRL's GRPOTrainer: group-relative advantages, no critic) or "
                           "ppo (verl/OpenRLHF's PPO: a critic (value model) trained beside the policy).",
                           choices=RL_ALGOS, modes=("rl",))
    group_size: int = setting(8, "Completions sampled per prompt (TRL's num_generations, default 8: "
                              "grpo_config.py:480; verl's rollout.n). With --batch P prompts and --grad-accum A, "
                              "each GPU generates P × group completions at once and trains on them in A "
                              "micro-batches of P × group / A (TRL's per_device_train_batch_size, which counts "
                              "completions).", maximum=limits.TOKENS, minimum=1,
                              modes=("rl",), example="8")
    prompt_len: int = setting(512, "Prompt tokens per sequence (the dataset's; TRL pads a batch's prompts to its "
                              "longest).", maximum=limits.TOKENS, minimum=1, modes=("rl",), example="1024")
    completion_len: int = setting(512, "Generated tokens per completion (TRL's max_completion_length, default 512: "
                                  "grpo_config.py:494; modelled at full length: no early EOS).",
                                  maximum=limits.TOKENS, minimum=1,
                                  modes=("rl",), example="4096")
    rollout: str = setting("hf", "Who generates: hf (transformers' generate in the training process, TRL's default) "
                           "or vllm (a vLLM engine colocated on the same GPU with --vllm-gpu-memory-utilization of it, "
                           "TRL's vllm_mode='colocate', verl's hybrid engine).", choices=ROLLOUTS, modes=("rl",))
    vllm_gpu_memory_utilization: float = setting(0.3, "--rollout vllm: the fraction of the GPU's memory the colocated "
                                                 "vLLM engine takes for its weights, activations, CUDA graphs and "
                                                 "KV cache (TRL's vllm_gpu_memory_utilization, default 0.3: "
                                                 "grpo_config.py:656).", above=0, maximum=1, modes=("rl",),
                                                 example="0.4")
    beta: float = setting(0.0, "KL coefficient (TRL's beta, default 0.0: grpo_config.py:681). Above 0 a frozen "
                          "reference model is loaded and scores every completion (grpo_trainer.py:985-1003, "
                          "2709-2739); with --lora-rank the policy with its adapters disabled is the reference.",
                          minimum=0, modes=("rl",), example="0.04")
    critic_model: Optional[str] = setting(None, "--rl-algo ppo: the critic (value model), a catalog name or "
                                          "config.json, trained beside the policy.", modes=("rl",),
                                          auto="the policy's model (the critic initialised from the policy's "
                                          "checkpoint; verl's critic.yaml takes its own model.path)",
                                          example="qwen2.5-0.5b", names_model=True)
    reward_model: Optional[str] = setting(None, "A reward model scoring each completion (a catalog name or "
                                          "config.json; a sequence classifier, frozen).", modes=("rl",),
                                          auto="none: rule-based reward functions (TRL's reward_funcs)",
                                          example="qwen2.5-0.5b", names_model=True)

    def __post_init__(self) -> None:
        if self.mode == "rl" and isinstance(self.prompt_len, int) and isinstance(self.completion_len, int):
            # an RL step's sequences are its prompts and completions: --seq follows them
            object.__setattr__(self, "seq", self.prompt_len + self.completion_len)
        validate(self)
        if self.recompute == "selective":  # the stack's own meaning, resolved once (stacks/*.toml [recompute])
            stack = _stacks.get_stack(self.stack)
            meaning = stack.fact("recompute", "selective")
            if meaning in stack.policies:  # another policy's name (torchtitan: op); else selective's own kind
                object.__setattr__(self, "recompute", meaning)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree: --etp, else --tp (Megatron's expert_tensor_parallel_size default)."""
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Data-parallel ranks an expert is replicated on: the dp × cp × tp ranks of a stage over ep × etp
        (Megatron-Core parallel_state.py: expert layout etp × ep × expert-dp × pp = world)."""
        return self.dp * self.cp * self.tp // (self.ep * self.expert_tp)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step across all data-parallel ranks."""
        return self.batch * self.seq * self.grad_accum * self.dp

    @property
    def attention_kernel(self) -> str:
        """The kernel actually assumed: 'auto' resolves to flash on CUDA and sdpa (HF default) on CPU."""
        if self.attention != "auto":
            return self.attention
        return "flash" if self.device == "cuda" else "sdpa"

    @property
    def stack_facts(self) -> _stacks.Stack:
        return _stacks.get_stack(self.stack)

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
    def policy(self) -> _precision.Precision:
        """The precision policy's dtypes (trainfit.precision)."""
        return _precision.PRECISIONS[self.precision]

    def with_(self, **changes) -> "Setup":
        return replace(self, **changes)

    def with_micro_batches(self, batch: int, grad_accum: int | None = None) -> "Setup":
        """This training setup with another micro-batch (and accumulation): the Setup `with_(batch=...,
        grad_accum=...)` builds, checked by the rules those two settings take part in (micro_batch_rules) rather
        than by every rule again (validate: ~35 µs; the planner derives hundreds of setups per search). Other modes
        (rl ties the batch to its completions): `with_`."""
        grad_accum = self.grad_accum if grad_accum is None else grad_accum
        if self.mode != "train":
            return self.with_(batch=batch, grad_accum=grad_accum)
        new = copy.copy(self)  # (no __init__: the other fields are this validated setup's)
        object.__setattr__(new, "batch", batch)
        object.__setattr__(new, "grad_accum", grad_accum)
        micro_batch_rules(new)
        return new


def _check_alloc_conf(text) -> None:
    from .alloc.config import parse_alloc_conf

    parse_alloc_conf(text)  # a one-line SetupError on bad input


@dataclass(frozen=True)
class RunSettings:
    """Settings of the question rather than of the step: which GPU, what utilisation, what budget."""

    gpu: Optional[str] = setting(None, "GPU to check the fit and time against: a catalog name (see `trainfit "
                                 "gpus`) or a .json/.toml file with the catalog's fields.", example="H100-80GB",
                                 modes=MODES)
    gpu_memory: Optional[float] = setting(None, "GiB of device memory per GPU as CUDA reports it "
                                          "(torch.cuda.mem_get_info()[1], vLLM's total_gpu_memory), replacing the "
                                          "GPU's own (a MIG slice, a memory cap, a variant the catalog lacks); needs "
                                          "--gpu.",
                                          above=0, maximum=4096, example="40", modes=MODES)
    mfu: Optional[float] = setting(None, "Override the step-time model with a flat model-FLOPs utilisation "
                                   "(0 < mfu <= 1).", above=0, maximum=1, example="0.4",
                                   modes=RL_STEP)
    tokens: Optional[float] = setting(None, "Training budget in tokens (e.g. 1e12, 15T): time, GPU-hours, cost "
                                      "and energy.", above=0, modes=("train",), parse=parse_count, example="15T")
    price: Optional[float] = setting(None, "GPU price per hour in USD (overrides the catalog; needs --gpu).",
                                     minimum=0, example="2.5", modes=MODES)
    reserve: float = setting(0.0, "Extra GiB per GPU kept free when judging the fit (the CUDA context, cuBLAS "
                             "workspace and NCCL buffers are already taken off the capacity): other processes on "
                             "the GPU, a safety margin.", minimum=0, maximum=1024, example="2",
                             modes=RL_STEP)
    alloc_conf: Optional[str] = setting(None, "The CUDA caching allocator's settings for the trace's reserved and "
                                        "required, in "
                                        "PYTORCH_CUDA_ALLOC_CONF syntax (max_split_size_mb, expandable_segments, "
                                        "roundup_power2_divisions, garbage_collection_threshold).",
                                        auto="torch's defaults", check=lambda v: _check_alloc_conf(v),
                                        example="expandable_segments:True")


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


def check_value(s: Setting, v: Any, mode: str = "train") -> None:
    """One setting's value: its type, bounds and allowed choices."""
    m = s.meta
    if v is None:
        return
    t = s.base_type
    example = f" (e.g. {s.flag} {m.example})" if m.example else ""
    if t is bool:
        if not isinstance(v, bool):
            raise SetupError(f"{s.flag} is a switch (true/false), got {v!r}")
        return
    if t is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SetupError(f"{s.flag} must be an integer, got {v!r}{example}")
    if t is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SetupError(f"{s.flag} must be a number, got {v!r}{example}")
        if not math.isfinite(v):
            raise SetupError(f"{s.flag} must be a finite number, got {v!r}{example}")
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
            raise SetupError(f"{s.flag} must be {what}, got {v!r}{example}")
        if m.maximum is not None and v > m.maximum:
            why = f"; {m.maximum.why}" if isinstance(m.maximum, limits.Bound) else ""
            raise SetupError(f"{s.flag} must be at most {m.maximum:,}, got {v!r}{example}{why}")


def parse_value(s: Setting, value: Any) -> Any:
    """Text from the CLI or the web -> the setting's value, with a one-line error naming the flag."""
    if s.meta.repeatable and not isinstance(value, str):  # the flag given several times (or not at all)
        value = ",".join(value) if value else s.request_default
    if value is None or s.meta.parse is None or not isinstance(value, str):
        return value
    try:
        return s.meta.parse(value)
    except (ValueError, ArithmeticError) as e:
        example = f" (e.g. {s.flag} {s.meta.example})" if s.meta.example else ""
        raise SetupError(f"{s.flag} {value!r}: {e}{example}") from None


def refuse_inapplicable(values, settings, mode: str) -> None:
    """Flags set away from their default that do not apply to `mode` are refused, not ignored (named at once)."""
    off = [s for s in settings if mode not in s.meta.modes and getattr(values, s.name) != s.default]
    if off:
        flags, them = " and ".join(s.flag for s in off), "them" if len(off) > 1 else "it"
        where = {"/".join(s.meta.modes) for s in off}
        if len(where) > 1:
            raise SetupError(f"{flags} do not apply to --mode {mode}: drop {them}")
        raise SetupError(f"{flags} {'apply' if len(off) > 1 else 'applies'} to {where.pop()} only, not --mode "
                         f"{mode}: drop {them}")


def validate(setup: Setup) -> None:
    """Every Setup field, then the rules that tie settings together."""
    mode = setup.mode
    if mode not in MODES:
        raise SetupError(f"--mode {mode!r} is not supported; choose one of: {', '.join(MODES)}")
    for s in _SETUP_SETTINGS:
        check_value(s, getattr(setup, s.name), mode)
    refuse_inapplicable(setup, _SETUP_SETTINGS, mode)
    limits.check_world(setup.world_size)
    if setup.zero and setup.dp == 1:
        raise SetupError("--zero shards states over data-parallel ranks: it needs --dp > 1")
    if setup.sequence_parallel and setup.tp == 1:
        raise SetupError("--sequence-parallel splits activations over tensor-parallel ranks: it needs --tp > 1")
    stack = _stacks.get_stack(setup.stack)
    policy = setup.recompute_policy
    if policy not in stack.policies:
        # none/selective/full: every stack's own meaning; the other policies name the stacks that run them
        owners = [] if policy in COMMON_RECOMPUTE else _stacks.running(lambda st: policy in st.policies)
        raise SetupError(f"--recompute {setup.recompute} is not a {stack.name} policy; {stack.name} runs: "
                         f"{', '.join(p + (':N' if p in RECOMPUTE_PATTERNS else '') for p in stack.policies)}"
                         + (f"; use --stack {' or '.join(owners)}" if owners else ""))
    if setup.offload == "activations" and not stack.runs("activation-offload"):
        raise SetupError(f"--offload activations is torchtune's activation offloading, modelled on --stack "
                         f"{_runners('activation-offload')}; --stack {stack.name} does not run it")
    for name in ("cp", "ep", "vpp", "pp_split", "offload", "etp"):  # the axes a stack may run (stacks/*.toml)
        if name == "offload" and setup.offload == "activations":
            continue
        if getattr(setup, name) not in (1, "even", "none", None) and name not in stack.axes:
            runs = _stacks.running(lambda st: name in st.axes)
            raise SetupError(f"{BY_NAME[name].flag} is not run by --stack {stack.name}; use --stack "
                             f"{' or '.join(runs)}")
    if setup.vpp > 1 and setup.pp == 1:
        raise SetupError("--vpp interleaves model chunks over pipeline stages: it needs --pp > 1")
    if setup.pp_split != "even" and setup.pp == 1:
        raise SetupError("--pp-split splits layers over pipeline stages: it needs --pp > 1")
    if setup.cp > 1 and setup.seq % (2 * setup.cp):
        raise SetupError(f"--cp {setup.cp} splits each sequence into 2 × cp = {2 * setup.cp} load-balanced chunks: "
                         f"--seq {setup.seq} must be divisible by {2 * setup.cp}")
    why = stack.refuse(setup)  # the stack's rules that are code (stacks/<name>.py)
    if why:
        raise SetupError(why)
    if setup.offload == "optimizer" and setup.zero < 1:
        raise SetupError("--offload optimizer moves ZeRO's optimizer partitions to the host: it needs --zero 1, 2 or 3")
    if setup.offload == "params" and setup.zero < 3:
        raise SetupError("--offload params (ZeRO-Infinity) offloads the partitioned weights: it needs --zero 3")
    if setup.zero not in stack.zero_stages:
        raise SetupError(f"--zero {setup.zero} is not run by --stack {stack.name} (it runs ZeRO stages "
                         f"{', '.join(map(str, stack.zero_stages))}); use one of those or --stack hf")
    if setup.mode == "train" and setup.precision not in stack.precisions:
        raise SetupError(f"--precision {setup.precision} is not run by --stack {stack.name} (it runs "
                         f"{', '.join(stack.precisions)}); use one of those or --stack hf")
    if setup.mode == "train" and setup.optimizer not in stack.optimizers:
        raise SetupError(f"--optimizer {setup.optimizer} is not built by --stack {stack.name} (it builds "
                         f"{', '.join(stack.optimizers)}); use one of those or --stack hf")
    if setup.optimizer_impl is not None and setup.optimizer in BNB_OPTIMIZERS:
        raise SetupError(f"--optimizer-impl: --optimizer {setup.optimizer} runs bitsandbytes' own in-place kernel; "
                         "drop --optimizer-impl")
    if setup.loss != "full" and (not stack.runs("liger-loss") or setup.head not in (None, "causal-lm")):
        raise SetupError(f"--loss {setup.loss} replaces a causal LM's head and loss as Liger does in the HF stack: use "
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
    why = stack.splits_model(setup.tp, setup.pp) or (setup.compile and stack.compiles())
    if why:  # (--sequence-parallel needs --tp > 1: refused above)
        raise SetupError(why)
    if setup.float8 and not stack.fact("float8", "supported"):
        raise SetupError(f"--float8 is not run by --stack {stack.name}: {stack.fact('float8', 'why')}; use --stack "
                         "torchtitan")
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
        raise SetupError(f"--lora-rank: --stack {stack.name} does not run peft's adapters; use --stack hf")
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


def _runners(feature: str) -> str:
    """The stacks that run a [features] feature, for a refusal's "use --stack ..." (hf for trainfit's own)."""
    return " or ".join(_stacks.running(lambda st: st.runs(feature)))


def trains_any() -> list[str]:
    """The stacks that train any transformers model ([model] any): heads, vision models, a user's module."""
    return _stacks.running(lambda st: st.trains == "any")


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
    if setup.device != "cuda":
        raise SetupError("--mode serve models a serving engine on a GPU: --device cpu does not apply (trainfit measure "
                         "and trace run training and inference steps; use trainfit estimate --mode serve)")
    if setup.kv_dtype in ("fp32", "int8"):
        raise SetupError(f"--kv-cache-dtype {setup.kv_dtype}: {'SGLang' if setup.server == 'sglang' else 'vLLM'} "
                         "caches KV in bf16, fp16 or fp8; choose one of those")
    if setup.server == "sglang" and setup.kv_dtype == "fp16" and setup.precision != "fp16":
        raise SetupError("--kv-cache-dtype fp16: SGLang's KV dtypes are auto (the model's), bf16 and fp8 "
                         "(sglang/srt/arg_groups/fields/model.py:197-219); use --precision fp16 or another KV dtype")
    other = VLLM_ONLY if setup.server == "sglang" else SGLANG_ONLY
    off = [BY_NAME[n] for n in other if getattr(setup, n) != BY_NAME[n].default]
    if off:
        flags = " and ".join(s.flag for s in off)
        raise SetupError(f"{flags} {'do' if len(off) > 1 else 'does'} not apply to --server {setup.server}: drop "
                         f"{'them' if len(off) > 1 else 'it'}" + (" (SGLang's counterpart is --mem-fraction-static)"
                                                                  if setup.server == "sglang" else ""))
    if setup.quant and setup.precision == "fp32":
        raise SetupError(f"--quant {setup.quant} runs 16-bit activations in vLLM: use --precision bf16 or fp16")
    if setup.speculative_algorithm == "nextn" and setup.draft_model:
        raise SetupError("--speculative-algorithm nextn drafts with the target's own MTP layers: drop --draft-model")
    if setup.speculative_algorithm in ("eagle", "eagle3") and not setup.draft_model:
        raise SetupError(f"--speculative-algorithm {setup.speculative_algorithm} needs its draft head: add "
                         "--draft-model (the head's config.json)")


def _validate_rl(setup: Setup) -> None:
    """--mode rl: one GPU running TRL's colocated loop (analytic/rl.py); the settings of the other algorithm or
    rollout refused."""
    if setup.world_size > 1:
        raise SetupError("--mode rl is modelled on one GPU that generates, scores and trains (TRL's colocated loop): "
                         "drop --dp/--tp/--pp/--cp")
    completions = setup.batch * setup.group_size
    if completions % setup.grad_accum:
        raise SetupError(f"--mode rl: --batch {setup.batch} prompts × --group-size {setup.group_size} = {completions} "
                         f"completions do not split into --grad-accum {setup.grad_accum} equal micro-batches (TRL "
                         "requires it); choose a --grad-accum that divides them")
    if setup.critic_model is not None and setup.rl_algo != "ppo":
        raise SetupError(f"--critic-model is PPO's value model; --rl-algo {setup.rl_algo} has no critic: drop it or "
                         "use --rl-algo ppo")
    if setup.vllm_gpu_memory_utilization != BY_NAME["vllm_gpu_memory_utilization"].default and setup.rollout != "vllm":
        raise SetupError("--vllm-gpu-memory-utilization sizes the colocated vLLM engine: it needs --rollout vllm")
    if setup.rollout == "vllm":
        if setup.device != "cuda":
            raise SetupError("--rollout vllm is a GPU engine: --device cpu does not apply (use --rollout hf)")
        if setup.kv_dtype in ("fp32", "int8"):
            raise SetupError(f"--kv-cache-dtype {setup.kv_dtype}: vLLM caches KV in bf16, fp16 or fp8; choose one of "
                             "those")


def check_recompute(v: str) -> None:
    if not isinstance(v, str):
        raise SetupError(f"--recompute must be text, got {v!r} (e.g. --recompute full)")
    name, _, n = v.partition(":")
    if name in RECOMPUTE_PATTERNS:
        if not n.isdigit() or int(n) < 1:
            raise SetupError(f"--recompute {v!r}: {name}:N needs a positive integer N (e.g. {name}:2)")
        return
    if v not in RECOMPUTE:
        raise SetupError(f"--recompute {v!r} is not supported; choose one of: {', '.join(RECOMPUTE)}, "
                         + ", ".join(p + ":N" for p in RECOMPUTE_PATTERNS))


def check_lora_targets(v: str) -> None:
    """all-linear, attention, or comma-separated module names (checked against the model where it is built)."""
    if not isinstance(v, str):
        raise SetupError(f"--lora-targets must be text, got {v!r} (e.g. --lora-targets q_proj,v_proj)")
    names = [n.strip() for n in v.split(",")]
    if v in ("all-linear", "attention"):
        return
    if not all(n.isidentifier() for n in names):
        raise SetupError(f"--lora-targets {v!r}: use all-linear, attention, or comma-separated module names "
                         "(e.g. q_proj,v_proj)")


def lora_target_names(v: str) -> tuple[str, ...]:
    """The explicit module names of --lora-targets (empty for all-linear / attention)."""
    return () if v in ("all-linear", "attention") else tuple(n.strip() for n in v.split(","))


def parse_pp_split(v: str) -> tuple[int, int] | str:
    """"even", "embedding-loss", or (first, last) layer counts of "first:N,last:M" (either part may be left out:
    then -1, meaning the even share)."""
    if v in ("even", "embedding-loss"):
        return v
    first = last = -1
    for part in v.split(","):
        key, _, n = part.strip().partition(":")
        if key not in ("first", "last") or not n.isdigit() or int(n) < 1:
            raise SetupError(f"--pp-split {v!r}: use even, embedding-loss, or first:N,last:M with positive layer "
                             "counts (e.g. first:7,last:7)")
        if key == "first":
            first = int(n)
        else:
            last = int(n)
    return first, last


def check_pp_split(v: str) -> None:
    if not isinstance(v, str):
        raise SetupError(f"--pp-split must be text, got {v!r} (e.g. --pp-split embedding-loss)")
    parse_pp_split(v)


# -- the flat request ---------------------------------------------------------------------------------------
def _request_fields():
    out = [("model", str)]
    for s in SETTINGS:
        t = s.type if s.meta.auto is None else Optional[s.base_type]
        out.append((s.name, t, field(default=s.request_default)))
    return out


def _setup_of(self, spec=None) -> Setup:
    """The Setup this request describes; `spec` (a ModelSpec) resolves the model-dependent defaults."""
    values = {n: getattr(self, n) for n in SETUP_NAMES}
    mode = values["mode"]
    if values["precision"] is None:  # the stack's own default for training (stacks/*.toml [precision] default)
        stack = values["stack"] if values["stack"] in _stacks.names() else BY_NAME["stack"].default
        values["precision"] = (_stacks.get_stack(stack).facts["precision"].get("default", "amp-bf16")
                               if mode in TRAINING else serve_dtype(spec) if mode == "serve" else
                               _precision.DEFAULT.get(mode, "bf16"))
    if values["seq"] is None and not _is_vision(spec):  # (serving sizes by --max-model-len, rl by its prompts and
        # completions: not --seq)
        values["seq"] = DEFAULT_SEQ if mode in ("serve", "rl") else default_seq(spec, mode)
    from .spec import VisionSpec

    if isinstance(spec, VisionSpec):
        from .vision_setup import vision_values

        return Setup(**vision_values(spec, values, self))
    if spec is not None and (values["image_size"] is not None or values["channels_last"]):
        flag = "--image-size" if values["image_size"] is not None else "--channels-last"
        raise SetupError(f"{flag} applies to vision models (resnet, convnext, vit); {spec.name} is {spec.family}")
    if spec is not None and mode == "train":
        values["head"] = _heads.resolve(spec, values["head"], mode)  # --head, else the config's, else the family's
    setup = Setup(**values)
    if spec is not None and mode in ("train", "infer"):
        limits.check_logits(setup.batch * setup.seq, spec.vocab)
    return setup


def _is_vision(spec) -> bool:
    from .spec import VisionSpec

    return isinstance(spec, VisionSpec)


def serve_dtype(spec=None) -> str:
    """vLLM's --dtype auto (config/model.py:2423-2446): the checkpoint's dtype, fp32 ones downcast to the first
    supported dtype (bf16 on CUDA GPUs since Ampere)."""
    config = spec.config if spec is not None else {}
    return "fp16" if str(config.get("torch_dtype") or config.get("dtype")) == "float16" else "bf16"


def default_seq(spec=None, mode: str = "train") -> int:
    """2048, or fewer when the model's learned position table is shorter (GPT-2 1024, BERT 512)."""
    longest = spec.longest_sequence(mode) if spec is not None else None
    return DEFAULT_SEQ if longest is None else max(1, min(DEFAULT_SEQ, longest))


# the settings naming another model beside the one estimated (a catalog name or a config.json)
MODEL_SETTINGS = ("draft_model", "critic_model", "reward_model")
# the run settings that describe the GPU itself: they become the GPU object (api.gpu_of), not engine keywords
GPU_SETTINGS = ("gpu", "price", "gpu_memory")


def run_settings(req) -> dict:
    """The request's run settings the engines take as keywords (gpu, price and gpu_memory become the GPU object
    instead)."""
    return {s.name: getattr(req, s.name) for s in _RUN_SETTINGS if s.name not in GPU_SETTINGS}


def _request_post_init(self) -> None:
    if not isinstance(self.model, str) or not self.model.strip():
        raise SetupError("choose a model: a catalog name (see `trainfit models`), a config.json, or a hub id")
    mode = self.mode
    for s in SETTINGS:
        check_value(s, getattr(self, s.name), mode if mode in MODES else "train")
    if mode in MODES:  # (an unknown mode is refused by Setup's validation)
        refuse_inapplicable(self, _RUN_SETTINGS, mode)
    if mode == "rl" and self.seq is not None:
        raise SetupError("--seq does not apply to --mode rl: its sequences are --prompt-len + --completion-len tokens")
    if self.price is not None and self.gpu is None:
        raise SetupError("--price needs --gpu")
    if self.gpu_memory is not None and self.gpu is None:
        raise SetupError("--gpu-memory replaces a GPU's memory, which needs --gpu (see `trainfit gpus`)")
    if self.tokens is not None and self.gpu is None:
        raise SetupError("--tokens gives the time and cost of a budget, which needs a GPU: add --gpu (see `trainfit gpus`)")
    if self.mfu is not None and self.gpu is None:  # (the step time is the GPU's; without one there is none to set)
        raise SetupError("--mfu sets the step time on a GPU, which needs --gpu (see `trainfit gpus`)")
    if self.reserve != BY_NAME["reserve"].default and self.gpu is None:
        raise SetupError("--reserve keeps memory free when judging the fit on a GPU, which needs --gpu (see "
                         "`trainfit gpus`)")
    if self.price is not None and self.tokens is None:  # (the price is read only to cost a budget)
        raise SetupError("--price sets the cost of a training budget: add --tokens (e.g. --tokens 15T), or drop it")
    for name in ("gpu", *MODEL_SETTINGS):
        value = getattr(self, name)
        if isinstance(value, str) and not value.strip():
            what = "a GPU (see `trainfit gpus`)" if name == "gpu" else "a model (a catalog name or a config.json)"
            raise SetupError(f"{BY_NAME[name].flag} is empty: name {what}, or drop it")


def make_request_class():
    cls = make_dataclass("Request", _request_fields(), frozen=True, namespace={
        "setup": _setup_of, "__post_init__": _request_post_init,
        "__doc__": "A model and every setting (trainfit.setup.SETTINGS), flat: what the CLI, the web API and "
                   "scripts fill in. `.setup(spec)` gives the engines' Setup."})
    cls.__module__ = __name__
    return cls


Request = make_request_class()
