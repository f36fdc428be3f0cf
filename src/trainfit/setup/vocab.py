"""The words the settings take: modes, precisions, optimizers, recompute policies, stacks, ... (no torch)."""
from __future__ import annotations

from .. import heads as _heads
from .. import precision as _precision
from .. import stacks as _stacks

MODES = ("train", "infer", "serve", "rl")
STEP_MODES = ("train", "infer")  # a setting applies to these unless it says otherwise
# the modes with a policy update: a training step, and an RL step, which runs one (analytic/rl.py)
TRAINING = ("train", "rl")
# the settings of a training step or an inference step that an RL step runs too
RL_STEP = ("train", "infer", "rl")
RL_ALGOS = ("grpo", "ppo")  # --rl-algo
ROLLOUTS = ("hf", "vllm")  # --rollout: HF generate in the trainer, or a colocated vLLM engine
RL_PLACEMENTS = ("colocated", "split")  # --rl-placement: every model on every GPU, or each on its own GPUs
SERVERS = ("vllm", "sglang")  # --server: the serving engine modelled (analytic/serving.py, serving_sglang.py)
# settings one server reads and the other has no counterpart for (refused under the other: _validate_serve)
VLLM_ONLY = ("gpu_memory_utilization", "block_size", "max_num_batched_tokens", "max_num_seqs", "kv_cache_memory")
SGLANG_ONLY = ("mem_fraction_static", "speculative_algorithm")
# --speculative-algorithm (SGLang 0.5.23's builtins that keep a draft KV pool beside the target's:
# sglang/srt/arg_groups/fields/spec.py:31-34; analytic/serving_sglang_spec.py)
SPECULATIVE_ALGORITHMS = ("eagle", "eagle3", "nextn", "standalone")
SERVE_PRECISIONS = ("bf16", "fp16", "fp32")  # vLLM's --dtype (no autocast: the weights' dtype)
TRAIN_PRECISIONS = _precision.TRAIN_PRECISIONS
INFER_PRECISIONS = _precision.INFER_PRECISIONS
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor", "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion",
              "adamw-torchao-8bit", "adamw-torchao-4bit", "adamw-torchao-fp8")
# built by bitsandbytes (bnb.optim.AdamW / Lion with optim_bits and is_paged), as the HF Trainer builds its
# adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit and lion_32bit (transformers 5.23 trainer_optimizer.py:246-292)
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion")
# torchao 0.18's torchao.optim.AdamW8bit, AdamW4bit, AdamWFp8 (the HF Trainer's adamw_torch_8bit / adamw_torch_4bit:
# transformers 5.24 trainer_optimizer.py:450-476; torchtune configs' _component_: torchao.optim.AdamW8bit ...)
TORCHAO_OPTIMIZERS = ("adamw-torchao-8bit", "adamw-torchao-4bit", "adamw-torchao-fp8")
# patterns beside these names (see `check_recompute`): "layer:N" (torchtitan: every N-th layer checkpointed whole),
# "uniform:N" and "block:N" (Megatron's recompute_method with recompute_num_layers N)
RECOMPUTE = ("none", "selective", "full", "op")
RECOMPUTE_PATTERNS = ("layer", "uniform", "block")
COMMON_RECOMPUTE = ("none", "selective", "full")  # every stack's own meaning (selective: stacks/*.toml [recompute])
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")  # --moe-dispatcher (analytic/parallel/expert.py)
OFFLOAD = ("none", "optimizer", "params", "activations")  # what one --offload names
# --offload's values (parsers.combine_offload): the saved activations and the model states go to the host apart, so
# the activations combine with either state offload (Setup.offload_activations, Setup.offload_state read them)
OFFLOAD_VALUES = OFFLOAD + ("activations+optimizer", "activations+params")
QUANTS = ("nf4", "fp4", "int8")  # --quant: bitsandbytes formats of the frozen base (step/quant.py)
SERVE_QUANTS = ("fp8", "awq", "gptq")  # --quant in --mode serve: vLLM's weight formats (analytic/serving.py)
KBIT_PREPS = ("peft", "norms", "none")  # --kbit-prep: the unquantised parameters of a --quant base (analytic/kbit_prep.py)
LORA_DTYPES = ("fp32", "weight")  # --lora-dtype
LOSSES = ("full", "fused-linear", "chunked-logprob", "tiled", "xentropy")  # --loss
LOSS_FUSIONS = ("none", "native", "te")  # --loss-fusion: Megatron's cross-entropy (analytic/megatron_loss.py)
STACKS = _stacks.BUILT_IN  # (--stack's help; choices_for reads every stack found: stacks.names())
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
HEADS = _heads.HEADS
ATTENTION = ("auto", "eager", "sdpa", "flash", "flash2", "triton")
DEVICES = ("cuda", "cpu")
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
# the KV dtypes of a serving engine (--mode serve, --rollout vllm): vLLM's CacheDType has no fp32 or int8 (its
# config/cache.py), SGLang's --kv-cache-dtype neither (fields/model.py:197-219; fp16 only as the model's own)
SERVE_KV_DTYPES = ("bf16", "fp16", "fp8")
DEFAULT_SEQ = 2048
# an encoder-decoder model's decoder (target) tokens when --target-seq is not given: transformers' seq2seq example
# scripts' max_target_length (examples/pytorch/summarization/run_summarization.py, default 128)
DEFAULT_TARGET_SEQ = 128

# Each setting's concern (settings.py `setting(..., group=)`): its title in the web form, and the modes its settings
# apply to unless one says otherwise
GROUPS = {
    "step": ("The step", STEP_MODES),
    "parallel": ("Parallelism", ("train",)),
    "fine-tune": ("Fine-tuning", TRAINING),
    "serve": ("Serving (--mode serve)", ("serve",)),
    "rl": ("RL post-training (--mode rl)", ("rl",)),
    "vision": ("Vision models", ("train", "infer")),  # image classifiers train only (vision_setup.py); VLMs infer too
    "run": ("The GPU and the budget", MODES),
}

