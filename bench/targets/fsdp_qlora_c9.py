"""C9 of shared/calibration.md: Answer.AI's fsdp_qlora (AnswerDotAI/fsdp_qlora at 05ed9f2, benchmarks_03_2024.md),
Llama-2-7B on 2 x RTX 3090 (no NVLink, 280 W), batch 1, context 512, 1,024 dummy samples: QLoRA 4.98 GiB peak
reserved in 1,082 s, LoRA 10.24 GiB in 2,597 s (the LoRA run's peak allocated, 8.28 GiB, is in the same note).
A helper of the post-training bench (bench/targets/posttrain_published.py imports `c9_rows`). Fitted on it: the RTX
3090's link fraction (src/trainfit/data/kernels.toml: the LoRA time; the QLoRA time is its check).

What train.py runs, and the trainfit flags for it (train.py line numbers at 05ed9f2):
  * `--model_name meta-llama/Llama-2-7b-hf --batch_size 1 --context_length 512 --train_type qlora|lora
    --use_gradient_checkpointing True --reentrant_checkpointing True --use_cpu_offload False --dataset dummy
    --dataset_samples 1024` (benchmarks_03_2024.md, the template command, over the defaults at :1040-1050) ->
    llama-2-7b --batch 1 --seq 512 --recompute full; 1,024 samples over 2 ranks = 512 steps;
  * FSDP FULL_SHARD (:740-741, the default sharding_strategy "full_shard", :1047) over 2 GPUs -> --dp 2 --zero 3; the
    wrap policy makes each decoder layer and each trainable LoRA Linear its own FSDP unit (:466-500, :734, :754-765);
    NB: that is FSDP1 (flat parameters, use_orig_params=False, :758), trainfit's hf step is FSDP2: per-parameter
    shards, the same gathered layer and prefetch (BACKWARD_PRE, FSDP1's default), the root unsharded after forward
    in both;
  * precision "bf16" (:1054 default): the model cast to bf16 (:538-539, :585-586), no MixedPrecision policy
    (mp_policy None, :536) and no autocast (:823 only for the *_autocast precisions) -> --precision bf16;
    4-bit storage in bf16 (`quant_storage=torch_dtype`, :615-616), nf4 (-> --quant nf4), which FSDP shards;
  * LoRA rank 64, alpha 16, dropout 0.1 on k/q/v/up/down/gate_proj (:1058-1061, :1158-1159; no o_proj) -> --lora-rank
    64 --lora-targets q_proj,k_proj,v_proj,gate_proj,up_proj,down_proj; peft's get_peft_model (:670-680) puts the
    adapters in the base layer's dtype (bf16) -> --lora-dtype weight (NB: peft releases of early 2024; peft >= 0.12
    keeps them fp32); NB: trainfit's adapters have no dropout: the mask and dropped copy each adapted Linear keeps
    (in the one layer being recomputed) are not counted (under-count);
  * torch.optim.AdamW(fused=False) (:459-461, "adamw" default :1068), torch's foreach kernel on CUDA, over the
    trainable parameters -> --optimizer adamw --optimizer-impl foreach;
  * the adapters get peft's default init (LoraConfig without init_lora_weights, :672-678: Kaiming A, zero B): no
    memory or time effect;
  * peak = torch.cuda.max_memory_reserved after the first steps (:961), reset before training (:838): what
    trainfit's memory.reserved is. NB: the CUDA caching allocator's blocks cached while loading and quantising
    (train.py prints 3.72 GiB reserved after the QLoRA wrap, benchmarks_03_2024.md, where the sharded model is
    ~2 GiB) stay in reserved: not modelled (under-count).
Time: the analytic step time x 512 steps at --power-limit 280.
"""
from __future__ import annotations

GIB = 2**30
STEPS = 1024 // 2  # 1,024 samples, batch 1 on each of 2 ranks

FLAGS = dict(gpu="3090", power_limit=280, stack="hf", dp=2, zero=3, batch=1, seq=512, precision="bf16",
             optimizer="adamw", optimizer_impl="foreach", recompute="full", lora_rank=64,
             lora_targets="q_proj,k_proj,v_proj,gate_proj,up_proj,down_proj", lora_dtype="weight",
             stack_release="2024-03-fsdp-qlora")

# (train type, trainfit settings beyond FLAGS, published peak reserved GiB, published seconds per 1,024 samples,
#  published peak allocated GiB or None) -- benchmarks_03_2024.md, "Case Study: A Dual 3090"
# (QLoRA: train.py never calls peft's prepare_model_for_kbit_training, the unquantised parameters keep torch_dtype,
#  train.py:536-549, 615-616: --kbit-prep none)
PUBLISHED = (("QLoRA", {"quant": "nf4", "kbit_prep": "none"}, 4.98, 1082, None),
             ("LoRA", {}, 10.24, 2597, 8.28))


def flags_line(extra: dict) -> str:
    """The trainfit command line of a row."""
    kw = {**FLAGS, **extra}
    return "trainfit estimate llama-2-7b " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kw.items())


def c9_rows() -> list[dict]:
    """One row per published number: {id, train, metric, flags, predicted, published, error} (error = predicted /
    published - 1; memory in GiB, time in seconds per 1,024 samples)."""
    from trainfit.api import estimate

    rows = []
    for train, extra, reserved, seconds, allocated in PUBLISHED:
        e = estimate("llama-2-7b", **FLAGS, **extra)
        got = {"peak reserved GiB": (e.memory.reserved / GIB, reserved),
               "time s / 1,024 samples": (e.time.step_seconds * STEPS, seconds)}
        if allocated is not None:
            got["peak allocated GiB"] = (e.memory.peak / GIB, allocated)
        for metric, (predicted, published) in got.items():
            rows.append({"id": f"C9-{train.lower()}", "train": train, "metric": metric, "flags": flags_line(extra),
                         "predicted": predicted, "published": published, "error": predicted / published - 1})
    return rows


if __name__ == "__main__":  # pragma: no cover
    for r in c9_rows():
        print(f"{r['id']:10} {r['metric']:24} predicted {r['predicted']:8.2f} published {r['published']:8.2f} "
              f"error {r['error']:+.1%}")
