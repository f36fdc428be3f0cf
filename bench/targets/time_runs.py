"""Published training-throughput runs (THE one list): the validation set of the step-time model (issue 14).

Data only, plus how each published metric becomes seconds per optimizer step (`published_step`). Read by
bench/targets/time_published.py (the table), bench/targets/plan_published.py and bench/targets/megatron_time.py.

Fields of a run: id; source (URL + table/row); gpu (name in src/trainfit/data/gpus.json); model (a catalog name of
src/trainfit/models/catalog, or an HF-style config.json dict, built with trainfit.models.hf_config.spec_from_config);
setup (trainfit.setup.Setup keyword arguments; dp × tp × pp × cp = the run's GPU count); published + unit;
in_sample (True ONLY for the calibration runs C1–C3, C5–C8 of shared/calibration.md: the only ones a constant may
be fitted on); published_params (optional: the source's parameter count, a check of the model dims); notes
(assumptions, each NB with its direction where known); published_reserved_gib (optional: the source's peak reserved
memory in GiB, read by bench/targets/lowp_published.py); power_limit (optional: the board power limit in W where
the source states one, or the one fitted on C6 where it says only "power limited" (_AO_POWER_LIMIT);
time_published.predict runs the GPU at it); inexpressible (optional: why no Setup expresses
the run as published, e.g. a partial activation offload: the tables report it instead of predicting); layout_set
(optional: the set of published layouts of one model on one cluster it belongs to, bench/targets/moe_order.py).

Units and their conversion to seconds per step (global tokens per step T = batch · seq · grad_accum · dp; cp splits
each sequence and does not add tokens):
  * "s/step": as published.
  * "tokens/s/GPU": step = T / (x · GPUs). torchtitan logs tokens per second per device (torchtitan train.py: local
    tokens over time, divided by the non-data-parallel degree), llm-foundry's "Throughput (T/s/GPU)" is the
    cluster's tokens/s over the GPU count (README "MFU and HFU"); torchtune (C1) runs on one GPU.
  * "sequences/s": the cluster's sequences per second (NVIDIA DeepLearningExamples): step = batch·grad_accum·dp / x.
  * "TFLOP/s/GPU (Narayanan eq. 3)": step = F / (x · GPUs), F = 96·B·s·l·h²·(1 + s/6h + V/16lh) (Narayanan et al.
    2021 §5.1 eq. 3, which counts the full-recompute forward).
  * "TFLOP/s/GPU (6N + 12lhs)": the Llama 3 paper gives no FLOP formula; we use the usual model-FLOPs count per token
    6·N + 12·l·h·s (Chowdhery et al. 2022, PaLM, Appendix B) with N = the paper's 405e9 parameters. NB: if Meta
    counted causal attention at half that, the published step time here is ~3 % too long (predicted looks faster).
  * "TFLOP/s/GPU (Megatron-LM)": what Megatron-LM's training log reports: step = F / (x · GPUs), F its
    num_floating_point_operations for the global batch (megatron_flops below).
"""
from __future__ import annotations

LLMF = ("https://github.com/mosaicml/llm-foundry/blob/c90b9b312c644dbde5c9e6eef75c6f1c117d8782/scripts/train/"
        "benchmarking/README.md")
TT = ("https://github.com/pytorch/torchtitan/blob/31a17bfdb70bab6f62a13d21816a5339b911d6e3/benchmarks/"
      "llama3_h100_202412_torchtitan.md")
DLE = ("https://github.com/NVIDIA/DeepLearningExamples/blob/23a6382cbe8f77c22b0a7b7d263191ee6b947dfa/PyTorch/"
       "LanguageModeling/BERT/README.md")
MOE_ZOO_QWEN3 = ("https://github.com/yanring/Megatron-MoE-ModelZoo/blob/020b8136b3bc6f47e4143849f54e400cf0f71e8a/"
                 "best_practice/qwen3/readme.md")
MOE_ZOO_QWEN3_CFG = ("model_configs/benchmarking/Qwen3-235B-A22B.yaml at 1ed4179f72e4873bc246501a976ed21628e99582 "
                     "(yanring/Megatron-MoE-ModelZoo)")
NARAYANAN = "https://arxiv.org/abs/2104.04473 (Narayanan et al. 2021)"
KORTHIKANTI = "https://arxiv.org/abs/2205.05198 (Korthikanti et al. 2022)"
LLAMA3 = "https://arxiv.org/abs/2407.21783 (The Llama 3 Herd of Models, 2024)"
TT_H200 = ("https://github.com/pytorch/torchtitan/blob/bcdeaa37c92d1eaceeec3351e7ac81be6a1488af/benchmarks/"
           "llama3_8b_h200_2025-06_torchtitan.md")
TORCHTUNE = "https://github.com/pytorch/torchtune README, 'Optimization flags' table"
# DeepSeek-V3-16B on 8 H100 80GB: OOM at the config's local batch 8 with EP 8; runs at batch 4 (EP 8), or at batch 8
# with EP 1 "at almost 96% memory usage" (config: torchtitan 82a9530f6^ models/deepseek_v3/train_configs/
# deepseek_v3_16b.toml; fixed by PR #1792 lowering local_batch_size to 4)
TT_DSV3_16B_OOM = "https://github.com/pytorch/torchtitan/issues/1789"


def gpt2_config(hidden: int, layers: int, heads: int, vocab: int, positions: int, **extra) -> dict:
    """A GPT-2-architecture config.json: learned positions, biases, LayerNorm, GELU MLP 4h, tied embeddings —
    Megatron's GPT (Shoeybi et al. 2019 §3) and llm-foundry's benchmark MPT (its yamls set learned_pos_emb and
    biases; NumParams of the README's table match this architecture exactly: tests/bench/test_time_runs.py).
    `extra`: config keys where the run's model differs from GPT-2's defaults (GPT2Config: gelu_new, dropout 0.1)."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": hidden, "n_layer": layers,
            "n_head": heads, "vocab_size": vocab, "n_positions": positions, "n_ctx": positions, **extra}


def megatron_gpt(hidden: int, layers: int, heads: int) -> dict:
    return gpt2_config(hidden, layers, heads, 51200, 2048)  # vocab 51200, seq 2048 (Narayanan §5; Korthikanti §6)


# llm-foundry benchmark MPT sizes: (d_model, n_layers, n_heads), vocab 50368 (mosaicml/llm-foundry
# scripts/train/yamls/pretrain/mpt-*.yaml at 39393a2, e.g. mpt-760m.yaml: d_model 1536, n_heads 12, n_layers 24;
# MPTConfig defaults learned_pos_emb=True, no_bias=False). `published_params` = the README's NumParams column, which
# tests/bench/test_time_runs.py checks against a hand count of these dims.
MPT = {"125m": (768, 12, 12), "350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16),
       "3b": (2560, 32, 20), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 56),
       "70b": (8192, 80, 64)}
MPT_VOCAB = 50368
# What MPT runs that GPT-2's config defaults would not: the exact GELU, one kernel (llmfoundry/models/layers/ffn.py
# MPTMLP: `nn.GELU(approximate='none')`), where GPT2Config's default gelu_new is HF's 8-kernel tanh composite; and no
# dropout (MPTConfig defaults resid_pdrop = emb_pdrop = 0.0 and attn_config attn_pdrop 0.0; the benchmark yamls set
# none), where GPT2Config's are 0.1.
MPT_DIFFERS = {"activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def _mpt(size, seq, gpus, micro, accum, ac, gpu, table, tps, params, precision="amp-bf16", zero=3):
    h, n_layers, heads = MPT[size]
    return dict(
        id=f"llmf-{size}-s{seq}-{gpus}x{gpu}" + ("-pure" if precision == "bf16" else ""),
        source=f"{LLMF} table '{table}', row {size} / SeqLen {seq} / {gpus} GPUs",
        gpu=gpu, model=gpt2_config(h, n_layers, heads, MPT_VOCAB, seq, **MPT_DIFFERS),
        setup=dict(stack="hf", batch=micro, seq=seq, grad_accum=accum, dp=gpus, zero=zero, precision=precision,
                   recompute="full" if ac else "none", attention="triton", fsdp_version=1, loss="xentropy",
                   stack_release="2024-01-llm-foundry",
                   **({"fsdp_reduce_dtype": "fp32"} if precision == "amp-bf16" else {})),
        published=tps, unit="tokens/s/GPU", published_params=params,
        notes="Composer + torch FSDP1 (FULL_SHARD = zero 3, SHARD_GRAD_OP = zero 2), FlashAttention in Triton "
              "(submit_benchmarks.py `--attn_impl` default 'triton', set on every run's model; at 5e85bd62d, the "
              "commit that published these tables: --attention triton), "
              "modelled as the hf stack with --fsdp-version 1 (FullyShardedDataParallel: no FSDP2 copy-out/copy-in "
              "kernels, analytic/parallel/fsdp1.py); MP mode DEFAULT = amp-bf16, PURE = bf16. NB: the hf stack's FSDP "
              "overlap stands in for Composer's (FSDP1 backward prefetch). Composer's DEFAULT policy at the version "
              "these tables ran (llm-foundry setup.py at 5e85bd62d pins mosaicml>=0.17.2,<0.18; composer/trainer/"
              "mosaic_fsdp_utils.py:94-97 at v0.17.2) sets param_dtype = buffer_dtype = bf16 and reduce_dtype = "
              "fp32: --fsdp-reduce-dtype fp32 (bf16 all-gathers, fp32 reduce-scatters). The loss: MPT's default "
              "loss_fn fused_crossentropy (llmfoundry/models/mpt/modeling_mpt.py:981-987 at 5e85bd62d; neither the "
              "yamls nor submit_benchmarks.py set another) is flash-attn's CrossEntropyLoss (flash-attn 1.0.9 with "
              "its xentropy kernel: setup.py:95-98), on the 16-bit logits with no fp32 copy: --loss xentropy; "
              "Composer 0.17.2's loop computes it after the forward and keeps the logits (state.outputs) through the "
              "backward for its train metrics: --stack-release 2024-01-llm-foundry (stacks/hf.toml). MicroBatchSize "
              "is the per-device micro-batch Composer ran (collect_results.py:141-142 reads the logged "
              "device_train_microbatch_size; GradAccum = ceil(global / GPUs / micro), :193-194): --batch, "
              "--grad-accum as published.")


MPT_RUNS = [
    # (size, seq, GPUs, micro, accum, activation checkpointing, gpu, table, T/s/GPU, NumParams[, precision, zero])
    ("70b", 2048, 512, 8, 1, True, "H100-80GB", "H100 80GB BF16 (Large Scale, >= 128 GPUs)", 1007, 64862437376),
    ("7b", 2048, 128, 6, 1, False, "H100-80GB", "H100 80GB BF16 (Large Scale, >= 128 GPUs)", 10475, 6658859008),
    ("1b", 2048, 512, 12, 1, False, "H100-80GB", "H100 80GB BF16 (Large Scale, >= 128 GPUs)", 39837, 1315950592,
     "amp-bf16", 2),
    ("13b", 2048, 8, 2, 1, False, "H100-80GB", "H100 80GB BF16", 4792, 12853954560),
    ("7b", 32768, 8, 2, 2, True, "H100-80GB", "H100 80GB BF16", 3318, 6784688128),
    ("3b", 2048, 16, 10, 3, False, "H100-80GB", "H100 80GB BF16", 24142, 2651837440),
    ("760m", 2048, 16, 24, 1, False, "H100-80GB", "H100 80GB BF16", 68551, 760470528),
    ("70b", 2048, 64, 8, 4, True, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 410,
     64862437376, "bf16"),
    ("30b", 2048, 8, 3, 21, True, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 916,
     29975214080),
    ("7b", 2048, 8, 6, 2, False, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 4641,
     6658859008),
    ("3b", 32768, 8, 3, 6, True, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 3029,
     2730480640),
    ("1b", 2048, 8, 14, 4, False, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 20513,
     1315950592),
    ("350m", 2048, 8, 32, 2, False, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 58782,
     355985408),
    ("125m", 2048, 8, 32, 2, False, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 141737,
     125311488),
    ("125m", 512, 8, 128, 2, False, "A100-80GB", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", 165681,
     124131840),
    ("13b", 2048, 64, 16, 1, True, "A100-40GB", "A100 40GB with 1600 Gbps node-node interconnect (RoCE)", 1976,
     12853954560, "bf16"),
    ("7b", 2048, 128, 18, 1, True, "A100-40GB", "A100 40GB with 1600 Gbps node-node interconnect (RoCE)", 3623,
     6658859008, "bf16"),
]


# DeepLearningExamples PyTorch BERT at the revision whose README added the pre-training rows (3d3ff3e1, 2019-08-27,
# pytorch:19.07-py3): its benchmark script printed sequences/s as tqdm's micro-batches/s × GPUs × train_batch_size
# (scripts/run_pretraining.sh:148), while run_pretraining.py:250 makes the micro-batch train_batch_size //
# gradient_accumulation_steps — so the printed figure is sequences/s only without accumulation (8cc635f6, 2019-10-15,
# "Fix training perf calculation", later added the division; the README rows were not re-measured). The same tables'
# 1-GPU rows confirm it (tests/bench/test_time_runs.py): on 8 GPUs every micro-batch takes 10-33 ms longer than on
# one, the size of one gradient all-reduce, which 128-1024 accumulated micro-batches would dilute below 0.2 ms.
DLE_BERT = ("https://github.com/NVIDIA/DeepLearningExamples/tree/3d3ff3e168a391e55cb28c3d5a4df69c9d4f4100/PyTorch/"
            "LanguageModeling/BERT")


def _bert(gpu, precision, batch, seq, sps, table_row):
    return dict(
        id=f"dle-bert-large-{gpu}-{precision}-b{batch}-s{seq}",
        source=f"{DLE} '{table_row}' (pytorch:19.07-py3), row 8 GPUs, batch {batch}/GPU, seq {seq}",
        gpu=gpu, model="bert-large",
        setup=dict(stack="hf", batch=batch, seq=seq, grad_accum=1, dp=8, precision=precision,
                   attention="eager", optimizer="adamw"),
        published=sps, unit="sequences/s",
        notes="NVIDIA BERT-large pre-training (MLM + NSP; DLE_BERT) with APEX AMP O2 (fp16 weights, fp32 master), "
              "fused LAMB and no gradient accumulation in the benchmark (DLE_BERT's comment). NB: modelled as hf "
              "amp-fp16 (autocast; hf runs no fp16-master) with AdamW: LAMB keeps the same two states, its "
              "multi-tensor norm passes (optimization.py:122-166) are not charged (predicted faster); the NSP head "
              "(2 × 1024 weights) is left out (negligible). NB: the mixed-precision runs all-reduce the fp16 "
              "gradients after the backward (run_pretraining.py:353-378, allreduce_post_accumulation) where the hf "
              "stack overlaps it with the backward: predicted faster by the un-overlapped part (~6 ms a step).")


def _tt(id_, table, row, model, setup, tps, notes="", in_sample=False):
    # attention flash2: torchtitan then called SDPA under torch 2.6's priority (FlashAttention-2 first); cuDNN came
    # first only on sm100 until Oct 2025 (torchtitan models/attention.py at bcdeaa37, 2025-07-01: _init_backend
    # FLASH, EFFICIENT, MATH, CUDNN prepended if has_cuda_capability(10, 0); 6a3a9da95, 2025-10-09, made it first)
    # stack_release: the main of "end of 2024" the table ran (published at d4c86e375, 2025-01-30) had the loss not
    # compiled and each-block-plus-root FSDP groups: [releases."2025-03"]'s facts (bench/targets/stacks_published.py
    # TT_RELEASE says where they are read)
    base = dict(stack="torchtitan", seq=8192, precision="amp-bf16", attention="flash2", stack_release="2025-03")
    return dict(id=id_, source=f"{TT} Table {table}, row '{row}'", gpu="H100-96GB", model=model,
                setup={**base, **setup}, published=tps, unit="tokens/s/GPU", in_sample=in_sample,
                notes="torchtitan Dec 2024 on Grand Teton H100 96 GB HBM2e at 500 W. NB: the 500 W cap lowers the "
                      "clock below the 700 W SXM peak in gpus.json (torchtitan's footnote 2): predicted faster. "
                      + notes)


# The fine-tuning rows were first published with a644350 (2019-07-16, pytorch:19.06-py3): its run_squad.py:940-972
# steps apex's FusedAdam under --fp16 and otherwise optimization.py's BertAdam, a Python loop over the parameters
# (optimization.py:109-157: per tensor a gradient clip, the two moment updates, sqrt, the division, weight decay and
# the update: one kernel each) — torch's for-loop Adam in trainfit's terms.
DLE_SQUAD = ("https://github.com/NVIDIA/DeepLearningExamples/tree/a644350589f9abc91b203f73e686a50f5d6f3e96/PyTorch/"
             "LanguageModeling/BERT")


def _squad(precision, batch, sps):
    impl = {"optimizer_impl": "for-loop"} if precision == "fp32" else {}
    return dict(
        id=f"dle-bert-large-squad-V100-32GB-{precision}-b{batch}",
        source=f"{DLE} 'Fine-tuning NVIDIA DGX-1 With 32G' (pytorch:19.07-py3), row 8 GPUs, batch {batch}/GPU",
        gpu="V100-32GB", model="bert-large",
        setup=dict(stack="hf", batch=batch, seq=384, dp=8, precision=precision, attention="eager",
                   optimizer="adamw", head="token-cls", **impl),
        published=sps, unit="sequences/s",
        notes="SQuAD v1.1 fine-tuning (run_squad.py, APEX AMP, DDP; DLE_SQUAD), no accumulation: fused Adam in mixed "
              "precision, BertAdam's per-parameter loop in fp32 (DLE_SQUAD's comment). The QA head (qa_outputs: "
              "Linear(hidden, 2) on every token) is a 2-label token-classification head. NB: sequence 384 is "
              "run_squad.sh's max_seq_length (the README's fine-tuning inference rows use 384). NB: BertAdam's "
              "11-13 kernels per tensor are timed as torch's 8 (predicted faster).")


def _c3(name, cfg, pp, gpus, batch, vpp, full, selective):
    out = []
    for rec, sp, t in (("full", False, full), ("selective", True, selective)):
        micro, accum = (4, 1) if pp == 1 else (1, batch)
        out.append(dict(
            id=f"c3-{name}-{rec}", source=f"{KORTHIKANTI} Table 5, row {name} "
            f"({'full recompute' if rec == 'full' else 'sequence parallelism + selective'}); C3 of calibration.md",
            gpu="A100-80GB", model=megatron_gpt(*cfg),
            setup=dict(stack="megatron", batch=micro, seq=2048, grad_accum=accum, precision="bf16-master",
                       recompute=rec, dp=gpus // (8 * pp), tp=8, pp=pp, vpp=vpp, sequence_parallel=sp,
                       attention="eager"),
            published=t, unit="s/step", in_sample=True,
            notes="Megatron-LM 2022 on Selene: no flash attention (eager); interleaved 1F1B with 3 virtual stages for "
                  "175B and 530B (the paper's §6). NB: the paper ran fp16 mixed precision; bf16-master has the same "
                  "A100 peak and state sizes."))
    return out


def _narayanan(gpus, tflops):
    dp = gpus // 96
    return dict(
        id=f"narayanan-gpt3-175b-{gpus}", source=f"{NARAYANAN} Table 2, PTD-P row, {gpus} GPUs",
        gpu="A100-80GB", model=megatron_gpt(12288, 96, 96),
        setup=dict(stack="megatron", batch=1, seq=2048, grad_accum=1536 // dp, precision="bf16-master",
                   recompute="full", dp=dp, tp=8, pp=12, attention="eager", grad_reduce_in_bf16=True),
        published=tflops, unit="TFLOP/s/GPU (Narayanan eq. 3)",
        notes="GPT-3 174.6B, t 8 × p 12, batch 1536, micro-batch 1 (§5.2), full recompute (counted by eq. 3). "
              "NB: non-interleaved schedule assumed (Table 2 does not say); the interleaved one would be faster. "
              "NB: fp16 in the paper, bf16-master here (same A100 peak), with the 16-bit gradient buffer the fp16 "
              "run reduced in (--grad-reduce-in-bf16): Megatron-LM of the paper's month (aed2f75e, 2021-04-11) "
              "forces fp32 gradient accumulation and all-reduce for --bf16 only (megatron/arguments.py:136-145), "
              "--accumulate-allreduce-grads-in-fp32 defaults off (:549-551) and its GPT-3 175B example runs --fp16 "
              "without it (examples/pretrain_gpt3_175B.sh:51).")


def _llama3(gpus, dp, per_rank, tflops):
    return dict(
        id=f"llama3-405b-{gpus}", source=f"{LLAMA3} Table 4, row {gpus} GPUs (TP 8, CP 1, PP 16, DP {dp})",
        gpu="H100-80GB", model="llama-3.1-405b",
        setup=dict(stack="megatron", batch=1, seq=8192, grad_accum=per_rank, precision="bf16-master",
                   recompute="none", dp=dp, tp=8, pp=16, zero=1, sequence_parallel=True, attention="flash",
                   pp_split="embedding-loss", vpp=8),
        published=tflops, unit="TFLOP/s/GPU (6N + 12lhs)",
        notes="Meta's own stack, modelled as Megatron. 16M tokens per batch (§3.3.2). Not stated and assumed: "
              "micro-batch 1, no recompute, bf16 with fp32 master, ZeRO-1-like sharding. Derived, not stated: vpp 8. "
              "§3.3.2 runs an interleaved schedule with V stages per rank and 'reduce[s] one Transformer layer each "
              "from the first and the last stages ... the first model chunk on the first stage has only the "
              "embedding, and the last model chunk on the last stage has only output projection and loss': taking "
              "one layer empties a chunk, so a chunk is one layer, and 16 x V chunks = 126 layers + the embedding "
              "chunk + the loss chunk gives V = 8 (Megatron's --account-for-embedding/loss-in-pipeline-split, "
              "--pp-split embedding-loss). NB: assumes equal chunks, as the quoted sentence implies.")


# --- low-precision (FP8/MX/NVFP4) and Blackwell/MI300X runs: C5–C7 and their validation set (issue 39) ---
AO_TRAINING = ("https://github.com/pytorch/ao/blob/36027d82d1ad9949597ea16002ff4940374b1b94/docs/source/workflows/"
               "training.md")
TT_MXFP8 = ("https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/torchtitan/"
            "components/quantization/mxfp8.md")
TT_A100 = ("https://github.com/pytorch/torchtitan/blob/1ea476e9f24be439eda358aa864f45c1c37a8a88/docs/"
           "performance.md")
TT_ASYNCTP = ("https://github.com/pytorch/torchtitan/blob/2887250bbd9103d0bc997ea2efb3a525b5e5dbc0/benchmarks/"
              "asyncTP_llama3_h100_2025-06_torchtitan.md")
MBRIDGE = ("https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/docs/"
           "performance-summary-archive.md")
# The recipes behind each container's rows (scripts/performance at the release that shipped them): 25.11 = v0.2.0,
# 26.04.01 = v0.4.2 (the first release whose performance-summary.md heads with that container).
MBRIDGE_RECIPES = {"25.11": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/tree/"
                            "7af9601c9da746d21481194356295bfe23df3737/scripts/performance (v0.2.0)",
                   "26.04.01": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/tree/"
                               "c810129341a84e58f4cbed3093f70668a088c028/scripts/performance (v0.4.2)"}


# torchao's benchmark job (AO_TRAINING "e2e training benchmarks"; benchmarks/float8/training/llama3.sh at 36027d82):
# torchtitan's llama3_8b.toml (Llama 3 8B, seq 8192, FSDP over the 8 GPUs, per-op SAC) with --training.local-batch-size
# 1 and --compile.enable; tensorwise adds --float8.enable_fsdp_float8_all_gather and
# --float8.precompute_float8_dynamic_scale_for_fsdp, rowwise recipes gather in bf16 (llama3.sh:38-45). "Peak Memory
# (GB)" is torchtitan's max_reserved in GiB (calibration.md C5).
_AO_RECIPE = {"bf16": {}, "tensorwise": dict(low_precision="tensorwise", fp8_all_gather=True),
              "rowwise": dict(low_precision="rowwise"), "rowwise_with_gw_hp": dict(low_precision="rowwise_with_gw_hp"),
              "mxfp8": dict(low_precision="mxfp8"), "mxfp8_rceil": dict(low_precision="mxfp8", mx_scale="rceil")}


# the torchtitan checkout each table ran (stacks/torchtitan.toml [releases]): the H100 table's "0.0.2" (main at
# 0da8901b1, 2025-03: the loss not compiled), the B200 table's 6fc499f6f (2025-08: cuDNN attention first on sm100, off
# op SAC's save list); the MI300X table's 2c8b5947 (2025-08, ROCm: no cuDNN) has the pinned release's facts
_AO_RELEASE = {"H100-96GB": "2025-03", "B200": "2025-08-sm100"}


# The B200 table ran on "8x power limited B200 GPUs" (AO_TRAINING 'Training e2e benchmarks on NVIDIA B200') and does
# not state the limit: the job's one unknown, fitted on C6's bf16 row (calibration) through the power-capped clock
# law (analytic/roofline.py power_clock) — `python -m bench run power_clock_published --fit` prints the fit. The
# table's other rows (C6 mxfp8, the validation float8 rows) check it. NB: an effective limit: it also absorbs
# whatever else slowed this early sm100 software (torch 2.9 nightly, torchao 0.13 nightly) — error of unknown sign.
_AO_POWER_LIMIT = {"B200": 422.0}


def _ao(id_, gpu, table, row, recipe, tps, reserved, attention, notes, calibration=None):
    in_sample = calibration is not None
    release = {"stack_release": _AO_RELEASE[gpu]} if gpu in _AO_RELEASE else {}
    limit = {"power_limit": _AO_POWER_LIMIT[gpu]} if gpu in _AO_POWER_LIMIT else {}
    return dict(**limit,
        id=id_, source=f"{AO_TRAINING} table '{table}', row '{row}'" + (f"; {calibration} of calibration.md"
                                                                         if in_sample else ""),
        gpu=gpu, model="llama-3.1-8b",
        setup=dict(stack="torchtitan", batch=1, seq=8192, dp=8, zero=3, recompute="op", compile=True,
                   precision="amp-bf16", attention=attention, **_AO_RECIPE[recipe], **release),
        published=tps, unit="tokens/s/GPU", published_reserved_gib=reserved, in_sample=in_sample,
        notes=notes + "; torchao's llama3.sh job on torchtitan on one node of 8 GPUs (llama3_8b.toml: Llama 3 8B = "
              "llama-3.1-8b's dims, seq 8192, FSDP 8, per-op SAC), local batch 1, compile, median tokens/s over 100 "
              "steps.")


# Megatron-Bridge's performance recipes (MBRIDGE_RECIPES): bf16 mixed precision with the distributed optimizer
# (recipes/llama/llama3.py:559 use_distributed_optimizer=True: --zero 1) or Megatron-FSDP (the table's FSDP column:
# --zero 3); FP8-CS = Transformer Engine per-tensor current scaling with fp8 param gather and, in the performance
# configs, no bf16 first/last layers (utils/helpers.py:35-52 get_precision_config: first_last_layers_bf16 = False;
# training/mixed_precision.py:272-290); MXFP8 gathers in fp8 too (mixed_precision.py:242-253); NVFP4 gathers in fp4
# (v0.4.2 mixed_precision.py:411-423: fp8_param_gather False, fp4_param_gather True). Sequence parallelism whenever
# TP > 1 (utils/utils.py WorkloadBaseConfig.sequence_parallel). Llama 3.1 405B splits its 126 layers with the
# embedding and the loss counted as layers (recipes/llama/llama3.py:413-414: --pp-split embedding-loss). TP
# communication overlap (--tp-comm-overlap) whenever TP > 1 but under NVFP4: the Llama recipes set
# CommOverlapConfig(tp_comm_overlap=True) (v0.2.0 recipes/llama/llama3.py:301-303 70B, :415-417 405B; v0.4.2 :738,
# :1189), the performance configs keep it and turn it off for NVFP4 (v0.2.0 configs/llama3/llama3_llm_pretrain.py:
# 113, 148, 173, configs/llama31/llama31_llm_pretrain.py:108, 138, 163; v0.4.2 configs/llama/llama3_llm_pretrain.py:
# 115, 150, 214, llama31_llm_pretrain.py:122, 154), and the Qwen3 and GPT-OSS configs set it (v0.2.0 configs/qwen3/
# qwen3_llm_pretrain.py:81; v0.4.2 configs/gpt_oss/gpt_oss_llm_pretrain.py:81-82), which CommOverlapConfig drops at
# TP 1 (v0.2.0 training/comm_overlap.py:440-441).
_MB_RECIPE = {"BF16": {}, "FP8-CS": dict(low_precision="tensorwise", fp8_all_gather=True),
              "FP8-MX": dict(low_precision="mxfp8", fp8_all_gather=True), "MXFP8": dict(low_precision="mxfp8",
                                                                                        fp8_all_gather=True),
              "NVFP4": dict(low_precision="nvfp4", fp8_all_gather=True)}
_MB_MODEL = {"LLAMA3_8B": "llama-3.1-8b", "LLAMA3_70B": "llama-3.1-70b", "LLAMA3.1_405B": "llama-3.1-405b",
             "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b", "GPT OSS 120B": "gpt-oss-120b"}
_MB_MOE = ("Qwen3_30B_a3B", "Qwen3_235B_a22B", "GPT OSS 120B")
_MB_GPU = {"DGX-H100": "H100-80GB", "DGX-B200": "B200", "DGX-GB200": "GB200"}


def _mb(container, line, system, model, gpus, precision, gbs, mbs, seq, tp=1, pp=1, cp=1, vp=1, ep=1, fsdp=False,
        tps=0.0, recompute="none", notes="", in_sample=False, inexpressible=None, **moe):
    dp = gpus // (tp * pp * cp)
    accum = gbs // (mbs * dp)
    assert accum * mbs * dp == gbs, (model, system)
    setup = dict(stack="megatron", batch=mbs, seq=seq, grad_accum=accum, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep,
                 zero=3 if fsdp else 1, precision="bf16-master", recompute=recompute, sequence_parallel=tp > 1,
                 tp_comm_overlap=tp > 1 and precision != "NVFP4",
                 attention="flash", grad_reduce_in_bf16=True, **_MB_RECIPE[precision], **moe,
                 # the fused cross-entropy, TE's: GPTModelProvider.cross_entropy_loss_fusion = True (v0.2.0
                 # src/megatron/bridge/models/gpt_provider.py:180, v0.4.2 :196; the Llama, Qwen3 and GPT-OSS providers
                 # inherit it: models/qwen/qwen_provider.py:256, :363, gpt_oss/gpt_oss_provider.py:39), impl "te" set
                 # by the performance scripts for every recipe (v0.2.0 scripts/performance/utils/helpers.py:108,
                 # called :285; v0.4.2 utils/overrides.py:67-68, called :228, after the recipe: also over GPT-OSS's
                 # own "native", recipes/gpt_oss/gpt_oss.py:104-105)
                 loss_fusion="te")
    if vp > 1:
        setup["vpp"] = vp
    # the parameter all-gather behind the forward (--overlap-param-gather): Megatron-Bridge's CommOverlapConfig turns
    # it on over the distributed optimizer wherever data_parallel_size > 1 (training/comm_overlap.py:538-542, 602-606
    # at v0.2.0; :576-579, 636-643 at v0.4.2), but where the performance config turns it off: 25.11's MXFP8 Llama and Qwen3
    # ("keeping this enabled causes NaN grad norm": v0.2.0 configs/llama3/llama3_llm_pretrain.py:80-83, 115-118,
    # 150-153, llama31/llama31_llm_pretrain.py:76-79, qwen3/qwen3_llm_pretrain.py:133-136) and 26.04.01's GB200 405B
    # NVFP4 V2 (v0.4.2 configs/llama/llama31_llm_pretrain.py:46-55, 123-124 disable_param_gather_overlap)
    off = (container == "25.11" and precision in ("FP8-MX", "MXFP8")) or \
        (container == "26.04.01" and system == "DGX-GB200" and model == "LLAMA3.1_405B" and precision == "NVFP4")
    if dp * cp > 1 and not off:
        setup["overlap_param_gather"] = True
    if model in _MB_MOE:
        # the table's note: "In MoE training benchmarks, we force-balance the token distribution among experts and
        # all benchmarks are token-dropless" (performance-summary-archive.md:291; scripts/performance/utils/
        # overrides.py:459-462: moe_router_force_load_balancing = True with no capacity factor)
        setup["moe_force_balance"] = True
    if model in ("LLAMA3.1_405B", "Qwen3_235B_a22B") and pp > 1:  # (Qwen3: recipes/qwen/qwen3_moe.py:160-161)
        setup["pp_split"] = "embedding-loss"
    tag = {"FP8-CS": "fp8cs", "FP8-MX": "mxfp8", "MXFP8": "mxfp8", "NVFP4": "nvfp4", "BF16": "bf16"}[precision]
    run = dict(
        id=f"{'c7' if in_sample else 'mbridge'}-{container}-{_MB_GPU[system].lower()}-{_MB_MODEL[model]}-{tag}",
        source=f"{MBRIDGE}#L{line} ({container} NeMo Container, {system}, {model}, {precision})"
               + ("; C7 of calibration.md" if in_sample else ""),
        gpu=_MB_GPU[system], model=_MB_MODEL[model], setup=setup, published=tps, unit="tokens/s/GPU",
        in_sample=in_sample,
        notes=f"Megatron-Core + Transformer Engine in NeMo {container} ({MBRIDGE_RECIPES[container]}): GBS {gbs}, MBS "
              f"{mbs}, {gpus} GPUs, TP {tp} PP {pp} CP {cp} VP {vp} EP {ep}, "
              + ("Megatron-FSDP with optim_grads_params (--zero 3: utils/helpers.py:116-119 "
                 "set_megatron_fsdp_overrides)" if fsdp else "distributed optimizer (--zero 1)")
              + f"; gradient accumulation {accum} = GBS / (MBS x DP). "
              "Gradients in bf16 (--grad-reduce-in-bf16): every family's set_*_common_configs sets "
              "ddp.grad_reduce_in_fp32 False (v0.2.0 configs/llama3/llama3_llm_pretrain.py:46-47, llama31/"
              "llama31_llm_pretrain.py:45-46, qwen3/qwen3_llm_pretrain.py:44-45, gpt_oss/gpt_oss_llm_pretrain.py:33-34; "
              "v0.4.2 configs/llama/llama3_llm_pretrain.py:43-44, llama31_llm_pretrain.py:42-43, qwen/"
              "qwen3_llm_pretrain.py:41-42, gpt_oss/gpt_oss_llm_pretrain.py:32-33). " + notes)
    if inexpressible:
        run["inexpressible"] = inexpressible
    return run


LOWP_CALIBRATION: list[dict] = [
    _ao("c5-torchao-h100-8b-bf16", "H100-96GB", "NVIDIA H100", "Llama3-8b | none (bfloat16)", "bf16", 6150, 47.65,
        "flash2", "C5 of calibration.md; H100 variant not named, taken as the 96 GB Grand Teton part (the bf16 memory "
        "equals torchtitan's logs there; calibration.md C5); torch 2.7.0a0 SDPA: FlashAttention-2 first", "C5"),
    _ao("c5-torchao-h100-8b-tensorwise", "H100-96GB", "NVIDIA H100", "Llama3-8b | tensorwise with float8 all-gather",
        "tensorwise", 7689.5, 47.77, "flash2", "C5 of calibration.md; as the bf16 row, torchao Float8Linear "
        "tensorwise with the fp8 FSDP all-gather", "C5"),
    _ao("c6-torchao-b200-8b-bf16", "B200", "Training e2e benchmarks on NVIDIA B200", "Llama3-8b | none (bfloat16)",
        "bf16", 8307.5, 33.71, "flash", "C6 of calibration.md (also TT_MXFP8 'Dense Models'); power-limited B200, "
        "limit not stated: fitted here (_AO_POWER_LIMIT); torch 2.9 nightly on sm100: SDPA cuDNN first "
        "(torchtitan models/attention.py at 6fc499f)", "C6"),
    _ao("c6-torchao-b200-8b-mxfp8", "B200", "Training e2e benchmarks on NVIDIA B200", "Llama3-8b | mxfp8_cublas",
        "mxfp8", 9969.0, 33.88, "flash", "C6 of calibration.md; torchao MXLinear, recipe mxfp8_cublas (cuBLAS "
        "block-scaled GEMMs, floor scale rounding), bf16 all-gather (MX comms stay high precision: TT_MXFP8 "
        "'Composability')", "C6"),
    _mb("25.11", 589, "DGX-H100", "LLAMA3_8B", 8, "FP8-CS", 128, 1, 8192, fsdp=True, tps=14451, recompute="block:5",
        notes="Recipe LLAMA3_8B_H100_FP8_CS_BASE_CONFIG (configs/llama3/workload_base_configs.py:229-233 at v0.2.0): "
              "recompute_num_layers 5 = full recompute, block method, of the first 5 layers (utils/helpers.py:174-177: "
              "--recompute block:5); Megatron-FSDP with nccl_ub and keep_fp8_transpose_cache "
              "(configs/llama3/llama3_llm_pretrain.py:265-268). NB: keep_fp8_transpose_cache (each unit's fp8 "
              "transpose kept from its forward to its backward, about a byte per weight) and gradient_accumulation_"
              "fusion False are not modelled: memory under by those.", in_sample=True),
    _mb("25.11", 582, "DGX-B200", "Qwen3_30B_a3B", 8, "FP8-MX", 512, 1, 4096, ep=8, tps=9299,
        cuda_graph_scope="moe_router,moe_preprocess",
        notes="Recipe QWEN3_30B_A3B_B200_FP8_MX_BASE_CONFIG (configs/qwen3/workload_base_configs.py:211-219 at "
              "v0.2.0): EP 8, ETP 1, no recompute, TE CUDA graphs of the router and MoE preprocessing "
              "(cuda_graph_scope moe_router, moe_preprocess: --cuda-graph-scope); dropless, routing force-balanced "
              "(the table's note).",
        in_sample=True),
]

LOWP_VALIDATION: list[dict] = [
    # torchao's tables, the rows calibration.md leaves out
    _ao("torchao-h100-8b-rowwise", "H100-96GB", "NVIDIA H100", "Llama3-8b | rowwise with bfloat16 all-gather",
        "rowwise", 6768, 47.79, "flash2", "Same job as C5 (H100 taken as the 96 GB part)"),
    _ao("torchao-mi300x-8b-bf16", "MI300X", "AMD MI300x", "Llama3-8b | none (bfloat16)", "bf16", 5376.5, 39.09,
        "flash", "torch 2.9.0.dev20250811+rocm6.4, torchao 0.13.0, torchtitan 2c8b5947; SDPA's ROCm flash kernel. NB: "
        "the four MI300X rows run 27-35 % slower than predicted, the gap in the compute (docs/low-precision.md "
        "'MI300X': no measurement of the untuned hipBLASLt GEMMs or AOTriton's causal attention at these shapes)"),
    _ao("torchao-mi300x-8b-tensorwise", "MI300X", "AMD MI300x", "Llama3-8b | tensorwise with float8 all-gather",
        "tensorwise", 6166.0, 39.07, "flash", "As the MI300X bf16 row; fp8 e4m3fnuz on MI300X"),
    _ao("torchao-mi300x-8b-rowwise-gw-hp", "MI300X", "AMD MI300x",
        "Llama3-8b | rowwise_with_gw_hp with bfloat16 all-gather", "rowwise_with_gw_hp", 6100.0, 39.32, "flash",
        "As the MI300X bf16 row"),
    _ao("torchao-mi300x-8b-rowwise", "MI300X", "AMD MI300x", "Llama3-8b | rowwise with bfloat16 all-gather",
        "rowwise", 5891.0, 39.32, "flash", "As the MI300X bf16 row"),
    _ao("torchao-b200-8b-tensorwise", "B200", "Training e2e benchmarks on NVIDIA B200",
        "Llama3-8b | float8 tensorwise (f8 all-gather)", "tensorwise", 10417.0, 33.38, "flash",
        "Same job as C6 (power-limited B200, limit not stated)"),
    _ao("torchao-b200-8b-mxfp8-rceil", "B200", "Training e2e benchmarks on NVIDIA B200",
        "Llama3-8b | mxfp8_cublas_rceil", "mxfp8_rceil", 9642.0, 33.88, "flash",
        "Same job as C6; mxfp8_cublas with round-up (rceil) scales (--mx-scale rceil): torchao 0.13's dim0 cast "
        "clamps in inductor, a slower kernel (kernels.toml MXCAST: 3697 vs floor's 6462 GB/s)"),
    _ao("torchao-b200-8b-rowwise", "B200", "Training e2e benchmarks on NVIDIA B200", "Llama3-8b | float8 rowwise",
        "rowwise", 8640.5, 33.72, "flash", "Same job as C6"),
    # torchtitan's async-TP benchmark: both columns (vanilla TP; async TP: --tp-comm-overlap, parallel/tp_overlap.py)
    *(dict(id=f"tt-asynctp-{size}-{recipe}" + ("-async" if asyn else ""),
           source=f"{TT_ASYNCTP} table '{table}', row '{'None (bfloat16)' if recipe == 'bf16' else 'float8 ' + recipe}', "
                  f"column '{'Async' if asyn else 'Vanilla'} TP tokens/sec'", gpu="H100-96GB", model=f"llama-3.1-{size}",
           setup=dict(stack="torchtitan", batch=batch, seq=8192, dp=dp, tp=8, zero=3, recompute=ac, compile=True,
                      precision="amp-bf16", attention="flash2", sequence_parallel=True, tp_comm_overlap=asyn,
                      **({} if recipe == "bf16" else {"low_precision": recipe})),
           published=tps[asyn], unit="tokens/s/GPU",
           notes="torchtitan June 2025 on Grand Teton H100 96 GB at 500 W: FSDP x TP 8 (sequence-parallel, "
                 "models/llama3/infra/parallelize.py:141-195 at 2887250b: blocks' input/output Shard(1), norms "
                 f"SequenceParallel), compile, {'bf16' if recipe == 'bf16' else 'Float8 ' + recipe}; seq 8192 "
                 f"(llama3_{size}.toml)"
                 + ("; async TP (--parallelism.enable_async_tensor_parallel, the page's command)" if asyn else "")
                 + ". NB: the FSDP fp8 all-gather is not stated (torchtitan's default enable_fsdp_float8_all_gather = "
                   "False: bf16 gathers). NB: the 500 W cap lowers the clock below gpus.json's peak (predicted faster).")
      for size, table, batch, dp, ac, recipe, tps in (
          ("70b", "Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC, local batch size 16", 16, 32,
           "full", "bf16", (597.3, 652.4)),
          ("70b", "Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC, local batch size 16", 16, 32,
           "full", "tensorwise", (809.8, 942.4)),
          ("70b", "Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC, local batch size 16", 16, 32,
           "full", "rowwise", (599.6, 624.8)),
          ("8b", "Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12", 12, 8,
           "op", "bf16", (4378, 4809.4)),
          ("8b", "Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12", 12, 8,
           "op", "tensorwise", (5078.1, 5570.1)),
          ("8b", "Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12", 12, 8,
           "op", "rowwise", (3708.5, 3914.9)))
      for asyn in (False, True)),
    # Megatron-Bridge performance summaries: 25.11 (C7's container), the rows calibration.md leaves out
    _mb("25.11", 565, "DGX-GB200", "LLAMA3_8B", 8, "FP8-CS", 128, 2, 8192, tps=31508,
        notes="Recipe LLAMA3_8B_GB200_FP8_CS_BASE_CONFIG: MBS 2, CUDA graph of the full iteration (NB: not modelled, "
              "predicted slower by the launches it removes)."),
    _mb("25.11", 565, "DGX-GB200", "LLAMA3_8B", 8, "FP8-MX", 128, 2, 8192, tps=29789,
        notes="The parenthesised figure of the FP8-CS row (MXFP8, 32x32 granularity per the table's note); recipe "
              "LLAMA3_8B_GB200_FP8_MX_BASE_CONFIG = the FP8-CS one. NB: full-iteration CUDA graph not modelled."),
    _mb("25.11", 578, "DGX-B200", "LLAMA3_8B", 8, "FP8-CS", 128, 2, 8192, tps=30624,
        notes="Recipe LLAMA3_8B_B200_FP8_CS_BASE_CONFIG (workload_base_configs.py:207-212 at v0.2.0): MBS 2, CUDA "
              "graph of the full iteration (NB: not modelled, predicted slower)."),
    _mb("25.11", 578, "DGX-B200", "LLAMA3_8B", 8, "FP8-MX", 128, 2, 8192, tps=29521,
        notes="The parenthesised (MXFP8) figure of the B200 FP8-CS row; recipe = the FP8-CS one (:215)."),
    _mb("25.11", 590, "DGX-H100", "LLAMA3_70B", 64, "FP8-CS", 128, 1, 8192, tp=4, pp=8, vp=5, tps=1602,
        notes="Recipe LLAMA3_70B_H100_FP8_CS_BASE_CONFIG: TP 4 PP 8 VP 5, TP comm overlap (userbuffers), no "
              "recompute. NB: TP overlap modelled as the megatron stack's."),
    _mb("25.11", 579, "DGX-B200", "LLAMA3.1_405B", 128, "FP8-CS", 64, 1, 8192, tp=4, pp=8, cp=2, vp=8, tps=661,
        notes="Recipe LLAMA31_405B_B200_FP8_CS_BASE_CONFIG (configs/llama31): TP 4 PP 8 CP 2 VP 8."),
    _mb("25.11", 579, "DGX-B200", "LLAMA3.1_405B", 128, "FP8-MX", 64, 1, 8192, tp=4, pp=8, cp=2, vp=8, tps=624,
        notes="The parenthesised (MXFP8) figure of the B200 405B row."),
    _mb("25.11", 567, "DGX-GB200", "LLAMA3.1_405B", 256, "FP8-CS", 1536, 1, 8192, tp=4, pp=16, vp=4, tps=813,
        notes="TP 4 PP 16 VP 4 (64 chunks: 128 = 126 layers + embedding + loss over 64, two each). NB: v0.2.0's "
              "GB200 FP8-CS recipe is 25.09's 128-GPU FSDP one; this 256-GPU layout's recompute is not stated: none "
              "assumed (predicted faster if it recomputed)."),
    _mb("25.11", 591, "DGX-H100", "LLAMA3.1_405B", 1024, "FP8-CS", 512, 1, 8192, tp=8, pp=8, cp=2, vp=8, tps=292,
        notes="Recipe LLAMA31_405B_H100_FP8_CS_BASE_CONFIG: TP 8 PP 8 CP 2 VP 8, 1,024 GPUs."),
    _mb("25.11", 571, "DGX-GB200", "Qwen3_30B_a3B", 8, "FP8-MX", 512, 4, 4096, ep=8, tps=23766,
        moe_dispatcher="hybridep", cuda_graph_scope="moe_router,moe_preprocess",
        notes="Recipe QWEN3_30B_A3B_GB200_FP8_MX_BASE_CONFIG (configs/qwen3/workload_base_configs.py:193-200 at "
              "v0.2.0): MBS 4, hybridep flex dispatcher (--moe-dispatcher hybridep) and TE CUDA graphs of the router "
              "and MoE preprocessing (--cuda-graph-scope moe_router,moe_preprocess; the recipe's BF16 and FP8-CS "
              "ones graph attention too); dropless, force-balanced."),
    _mb("25.11", 593, "DGX-H100", "Qwen3_30B_a3B", 16, "FP8-CS", 512, 2, 4096, pp=2, vp=24, ep=8, tps=5275,
        overlap_moe_comm=True,
        notes="PP 2 VP 24 as the table states (the v0.2.0 recipe file reads VP 12); MoE all-to-all overlapped with "
              "compute (moe_a2a_overlap: --overlap-moe-comm). NB: the same model on 16 H100 at PP 2 VP 12 EP 8, "
              "MBS 1, GBS 1024 reads 5,113 tokens/s/GPU in the 26.02 container and 9,058 in its 26.02.01 patch "
              f"({MBRIDGE}#L530, #L445): the software moved that layout by 77 %, more than this row's error; at "
              "MBS 1 trainfit's step is host-bound (the dispatcher's per-layer sync) and reads about 4,700."),
    _mb("25.11", 583, "DGX-B200", "Qwen3_235B_a22B", 64, "FP8-MX", 1024, 1, 4096, pp=8, vp=2, ep=8, tps=3269,
        overlap_moe_comm=True,
        notes="PP 8 VP 2 EP 8; qwen3_235b_a22b_pretrain_config sets account_for_embedding/loss_in_pipeline_split "
              "(recipes/qwen/qwen3_moe.py:160-161 at v0.2.0): 94 layers + embedding + loss = 96 over 16 chunks, six "
              "each (--pp-split embedding-loss). NB: the v0.2.0 B200 base config reads VP 4 "
              "(configs/qwen3/workload_base_configs.py:109-117), the table VP 2: the table's taken. The same config "
              "sets moe_a2a_overlap=True (:116; FP8_MX = FP8_CS, :120), which utils/helpers.py:76-77, 182-186 turn "
              "into overlap_moe_expert_parallel_comm and delay_wgrad_compute: --overlap-moe-comm."),
    _mb("25.11", 581, "DGX-B200", "GPT OSS 120B", 64, "BF16", 512, 4, 4096, ep=8, tps=8213,
        notes="Blackwell bf16 run: EP 8 over DP 64, MBS 4. Recipe GPT_OSS_120B_B200_BF16_BASE_CONFIG "
              "(configs/gpt_oss/workload_base_configs.py:50-55 at v0.2.0) names recompute modules layernorm, moe_act, "
              "but v0.2.0's set_recompute_overrides sets only the modules (utils/helpers.py:178-179; v0.2.1's :180 "
              "adds recompute_granularity 'selective') and Megatron-Core reads them under selective granularity only "
              "(transformer_layer.py:382, moe/experts.py:103): no recompute. Its EP 64 (:50-55, set for B200, GB200 "
              "and GB300 by 'fix GPT-OSS perf scripts', e59a5736, 2025-11-20) is not the table's EP 8: the table's "
              "taken, as the same table's GB200 row departs from its recipe too (MBS 1, GBS 1280, seq 8192 against "
              "MBS 4, GBS 512, seq 4096: workload_base_configs.py:22-27, 42-45, recipes/gpt_oss/gpt_oss.py:191), so "
              "the table records the runs' overrides. NB: judged not to fit (187 GiB of a B200's 178) since the "
              "activation's clamps are counted (a second fc1-wide tensor per routed copy, +25 GiB here, read off "
              "megatron-core's own weighted_bias_quick_geglu_impl on CPU: tests/analytic/test_megatron_moe.py); the "
              "run ran, so an over-count elsewhere or a recompute setting not read here remains, unresolved. The "
              "row's EP is in doubt: its 8,213 tokens/s/GPU is the 26.02 EP 64 row's 8,047 within 2 % (the archive's line 519), "
              "where the EP 8 rows of 26.02.01 and 26.04.01 read 13,722 and 13,568; at the recipe's EP 64 trainfit "
              "predicts 3.10 s a step (-22 %) and a fit. The table's EP 8 is kept: a validation row is not re-read "
              "toward a smaller error."),
    _mb("25.11", 570, "DGX-GB200", "GPT OSS 120B", 64, "BF16", 1280, 1, 8192, ep=64, tps=15876,
        notes="Blackwell bf16 run: EP 64, MBS 1, seq 8192."),
    _mb("25.11", 566, "DGX-GB200", "LLAMA3_70B", 64, "FP8-CS", 256, 2, 8192, fsdp=True, tps=4312, offload_layers=40,
        notes="Recipe LLAMA3_70B_GB200_FP8_CS: Megatron-FSDP over 64 with activation CPU offload of 40 layers "
              "(configs/llama3/workload_base_configs.py:73-78 at v0.2.0: micro_batch_size 2, use_megatron_fsdp, "
              "cpu_offloading_num_layers 40; utils/helpers.py:163-173 set_recompute_overrides: cpu_offloading on, "
              "weights off): --offload-layers 40. NB: the base config's GBS 128 (:28-31), the table's 256 taken. The "
              "GB200 config's FSDP overrides (llama3_llm_pretrain.py:107-110): fsdp_double_buffer, and "
              "gradient_accumulation_fusion off, which trainfit has no setting for: each layer's 16-bit weight "
              "gradients wait for the unit's post-backward copy (megatron_fsdp.py:552-575 at the container's "
              "megatron-core 0d8e0714), up to 1.7 GB at a layer's backward not counted."),
    # 26.04.01: MXFP8 and NVFP4 rows of the dense Llamas, and a Blackwell bf16 MoE row; GA = GBS / (MBS x DP)
    _mb("26.04.01", 205, "DGX-GB200", "LLAMA3_70B", 64, "MXFP8", 256, 1, 8192, tp=2, pp=4, vp=5, tps=3712,
        notes="Recipe LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 (configs/llama/llama3_workload_base_configs.py:"
              "249-254 at v0.4.2): TP 2 PP 4 VP 5, no recompute."),
    _mb("26.04.01", 206, "DGX-GB200", "LLAMA3_70B", 64, "NVFP4", 256, 1, 8192, tp=2, pp=4, vp=5, tps=4864,
        notes="Recipe LLAMA3_70B_PRETRAIN_CONFIG_GB200_NVFP4_V2 (:256-264): TP 2 PP 4 VP 5, no CUDA graphs, TP comm "
              "overlap off for NVFP4; fp4 param gather (--fp8-all-gather)."),
    _mb("26.04.01", 207, "DGX-H100", "LLAMA3_70B", 64, "FP8-CS", 256, 1, 8192, tp=4, pp=8, vp=5, tps=1664,
        notes="Recipe LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS_V2: TP 4 PP 8 VP 5 (the table's 'FP8' = FP8-CS)."),
    _mb("26.04.01", 218, "DGX-GB200", "LLAMA3.1_405B", 256, "NVFP4", 1536, 1, 8192, tp=4, pp=16, vp=8, tps=1184,
        notes="Recipe LLAMA31_405B_PRETRAIN_CONFIG_GB200_NVFP4_V2 (configs/llama/llama31_workload_base_configs.py:"
              "108-118, 283-288 at v0.4.2): TP 4 PP 16 VP 8 (128 chunks: one layer each, embedding and loss counted), "
              "recompute_num_layers None in V2 (no recompute), no CUDA graphs; fp4 param gather (--fp8-all-gather)."),
    _mb("26.04.01", 237, "DGX-B200", "GPT OSS 120B", 64, "BF16", 1280, 4, 4096, ep=8, tps=13568,
        recompute="selective", recompute_modules="layernorm,moe_act",
        notes="Blackwell bf16 run: EP 8 over DP 64, MBS 4. Recipe GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2 "
              "(configs/gpt_oss/gpt_oss_workload_base_configs.py:117-121 at v0.4.2): V1's recompute modules "
              "layernorm, moe_act (:71-76; utils/overrides.py:148-150: selective granularity) with GBS 1280 and EP 8; "
              "no CUDA graphs."),
]


# Sets of published layouts of one MoE model on one cluster at one global batch (read by bench/targets/moe_order.py:
# the rank order trainfit predicts against the published one). Megatron-Core with ETP 1, the distributed optimizer,
# sequence parallelism, and the embedding and the loss each counted as a pipeline layer
# (model_configs/benchmarking/Qwen3-235B-A22B.yaml at MOE_ZOO's commit: --expert-tensor-parallel-size 1,
# --use-distributed-optimizer, --sequence-parallel, --account-for-embedding/loss-in-pipeline-split).
MOE_ZOO = ("https://github.com/yanring/Megatron-MoE-ModelZoo/blob/e8650517d60d71ab73fc6b3b0388cac4ba435181/"
           "best_practice/qwen3/readme.md")


ZOO_SET = "qwen3-235b-a22b on 256 H100, GBS 2048"
# C8 (shared/calibration.md): the only published MoE run a constant may be fitted on; line 18 of MOE_ZOO's table
C8_RUN: dict = dict(id="c8-moezoo-qwen3-235b-a2a", source=f"{MOE_ZOO_QWEN3}, H100 table, row '235B | A2A | H100 | BF16 | 256' "
     "(intra-node EP); C8 of calibration.md",
     gpu="H100-80GB", model="qwen3-235b-a22b", layout_set=ZOO_SET,
     setup=dict(stack="megatron", batch=1, seq=4096, grad_accum=512, dp=4, tp=2, pp=32, vpp=3, ep=8, etp=1,
                zero=1, sequence_parallel=True, precision="bf16-master", attention="flash",
                pp_split="embedding-loss", recompute="selective", recompute_modules="layernorm,moe_act",
                tp_comm_overlap=True,  # PR=bf16: sbatch_benchmarking.sh:93-95 adds --tp-comm-overlap
                overlap_param_gather=True),  # model_configs/benchmarking/Qwen3-235B-A22B.yaml:23-25
     published=24.2, unit="s/step", in_sample=True,
     notes="Megatron-Core (main 1e057005) with the all-to-all dispatcher, no 1F1B all-to-all overlap; "
           f"{MOE_ZOO_QWEN3_CFG}: --expert-tensor-parallel-size 1, --sequence-parallel, flash attention, "
           "--account-for-embedding/loss-in-pipeline-split (94 layers + 2 over 32 x 3 chunks: one each), "
           "distributed optimizer with overlapped grad reduce / param gather; --recompute-modules "
           "moe_act layernorm (run_h100_235b.sh). Dropless routing with the aux loss: the default imbalance "
           "(moe_imbalance.DROPLESS) is fitted on this run; TE cross-entropy fusion not modelled (its logits copy counted: predicted slower).")


def _zoo(line, dispatcher, tp, ep, pp, vpp, dp, ga, recompute, step, notes="", inexpressible=None, mbs=1,
         overlap=False, fsdp=False):
    """A row of MOE_ZOO's H100 table: Qwen3-235B-A22B on 256 H100 (NVLink 4, InfiniBand 8 x 50 GB/s), BF16, seq 4096,
    GBS 2048, dropless. `recompute`: the row's recompute modules ("full": full recompute)."""
    assert dp * tp * pp == 256 and dp * ga * mbs == 2048, line
    rec = (dict(recompute="full") if recompute == "full" else
           dict(recompute="selective", recompute_modules=recompute.replace(" ", "")) if recompute else
           dict(recompute="none"))
    run = dict(
        id=f"moezoo-h100-qwen3-235b-tp{tp}-ep{ep}-pp{pp}" + ("-a2a-overlap" if overlap else ""),
        source=f"{MOE_ZOO}#L{line} (H100 table, {dispatcher} dispatcher)",
        gpu="H100-80GB", model="qwen3-235b-a22b", layout_set=ZOO_SET,
        setup=dict(stack="megatron", batch=mbs, seq=4096, grad_accum=ga, dp=dp, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=1,
                   pp_split="embedding-loss" if pp > 1 else "even", zero=3 if fsdp else 1, precision="bf16-master",
                   sequence_parallel=tp > 1, attention="flash", **rec,
                   # sbatch_benchmarking.sh:93-95 at MOE_ZOO's commit: PR=bf16 (every row here) adds --tp-comm-overlap
                   tp_comm_overlap=tp > 1,
                   # model_configs/benchmarking/Qwen3-235B-A22B.yaml:23-25: --use-distributed-optimizer,
                   # --overlap-grad-reduce, --overlap-param-gather
                   overlap_param_gather=True,
                   **({"moe_dispatcher": "deepep"} if dispatcher == "DeepEP" else {}),
                   **({"overlap_moe_comm": True} if overlap else {})),
        published=step, unit="s/step",
        notes=f"TP {tp} EP {ep} ETP 1 PP {pp} VPP {vpp} DP {dp}, GA {ga}, {dispatcher} token dispatcher; recompute "
              f"modules: {recompute or 'none'}. NB: dropless routing with the aux loss: the default imbalance "
              "fitted on C8 (moe_imbalance.DROPLESS)" + (". " + notes if notes else ""))
    if inexpressible:
        run["inexpressible"] = inexpressible
    return run


# Megatron-Bridge's archive (MBRIDGE): GPT-OSS 120B on 64 B200, BF16, GBS 1280, MBS 4, seq 4096, TP 1 PP 1; the 26.02
# container ran EP 64, its 26.02.01 patch EP 8: the layout and the patch release changed together.
def _mbridge_gptoss(container, line, ep, tps):
    return dict(
        id=f"mbridge-{container}-b200-gpt-oss-120b-ep{ep}",
        source=f"{MBRIDGE}#L{line} ({container} NeMo Container, DGX-B200, GPT OSS 120B, BF16)",
        gpu="B200", model="gpt-oss-120b", layout_set="gpt-oss-120b on 64 B200, GBS 1280 (two patch releases)",
        setup=dict(stack="megatron", batch=4, seq=4096, grad_accum=5, dp=64, ep=ep, zero=1, precision="bf16-master",
                   attention="flash", recompute="selective", recompute_modules="layernorm,moe_act",
                   moe_force_balance=True, grad_reduce_in_bf16=True,
                   # the recipe's DistributedDataParallelConfig (recipes/gpt_oss/gpt_oss.py:287-294 at v0.3.0)
                   overlap_param_gather=True,
                   # TE's fused cross-entropy: the performance scripts' impl "te" over the recipe's "native" (v0.3.0
                   # scripts/performance/utils/overrides.py:64, called :221; v0.3.1 :65, :222; recipes/gpt_oss/
                   # gpt_oss.py:94-95), on GPTModelProvider's cross_entropy_loss_fusion True (gpt_provider.py:180)
                   loss_fusion="te"),
        published=tps, unit="tokens/s/GPU",
        notes=f"EP {ep} over DP 64, GA 5 = 1280 / (4 x 64), distributed optimizer. Recipe "
              "GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2 (scripts/performance/configs/gpt_oss/"
              "gpt_oss_workload_base_configs.py:71-76, 108-111 at v0.3.0 and v0.3.1; utils/overrides.py:141-143: "
              "selective granularity): recompute modules layernorm, moe_act (its EP 64 is the table's 26.02 one; "
              "26.02.01's EP 8 is the table's); the section's note: force-balanced routing, dropless "
              f"({MBRIDGE}#L473, #L542; gpt_oss_llm_pretrain.py:34 moe_router_force_load_balancing); gradients in "
              "bf16 (:30-31 ddp.grad_reduce_in_fp32 False: --grad-reduce-in-bf16). NB: the other "
              "row of this pair is another patch release of the container: its software changed with the layout.")


# The same MOE_ZOO page's "Long Context" table (lines 35-38): Qwen3-235B-A22B on 32 nodes of 8 H100, DeepEP, BF16,
# one layout per sequence length run twice, with --moe-router-force-load-balancing and dropless (line 49: "Add
# --moe-router-force-load-balancing to test forced load balancing"): the published dropless-vs-forced gap. The command
# (lines 43-44): PP 8, VPP 4, EP 8, A2A_OVERLAP 0, OPTIMIZER_OFFLOAD 0, --recompute-modules layernorm moe; MBS 1
# (runtime_configs/benchmarking/runtime.conf:13, Qwen3-235B-A22B), DISPATCHER deepep (sbatch_benchmarking.sh:75).
def _zoo_long(line, seq, tp, cp, forced, tflops):
    dp = 256 // (tp * cp * 8)
    return dict(
        id=f"moezoo-h100-qwen3-235b-s{seq // 1024}k-cp{cp}-" + ("forced" if forced else "dropless"),
        source=f"{MOE_ZOO}#L{line} (Long Context table, {'forced balance' if forced else 'dropless'})",
        gpu="H100-80GB", model="qwen3-235b-a22b",
        setup=dict(stack="megatron", batch=1, seq=seq, grad_accum=256 // dp, dp=dp, tp=tp, cp=cp, pp=8, vpp=4, ep=8,
                   etp=1, zero=1, sequence_parallel=True, precision="bf16-master", attention="flash",
                   pp_split="embedding-loss", recompute="selective", recompute_modules="layernorm,moe",
                   moe_dispatcher="deepep", tp_comm_overlap=True,  # the command's PR=bf16: sbatch_benchmarking.sh:93-95
                   overlap_param_gather=True,  # Qwen3-235B-A22B.yaml:25 (over DP x CP: CP 8 at DP 1 gathers)
                   **({"moe_force_balance": True} if forced else {})),
        published=tflops, unit="TFLOP/s/GPU (Megatron-LM)",
        notes=f"TP {tp} CP {cp} EP 8 ETP 1 PP 8 VPP 4 DP {dp}, GBS 256, MBS 1, DeepEP, recompute modules layernorm, "
              "moe; " + ("routing force-balanced." if forced else "dropless routing with the aux loss: the default "
                         "imbalance, fitted on C8 (moe_imbalance.DROPLESS).") + " Its pair differs only in the routing.")


# line 38 (seq 131072 on CP 8) runs at DP 1: the distributed optimizer shards over the 8 CP ranks
# (stacks/megatron.toml [distributed_optimizer] shards dp × cp)
MOE_ROUTING_PAIRS: list[dict] = [
    _zoo_long(line, seq, 4, cp, forced, x)
    for line, seq, cp, pair in ((35, 16384, 1, (295, 237)), (36, 32768, 2, (335, 277)), (37, 65536, 4, (368, 320)),
                                (38, 131072, 8, (389, 357)))
    for forced, x in zip((True, False), pair)
]


MOE_LAYOUT_RUNS: list[dict] = [
    _zoo(14, "DeepEP", 2, 32, 8, 4, 16, 128, "layernorm, moe_act", 19.7, "Code moe_dev(f3e6c5)."),
    _zoo(15, "DeepEP", 2, 32, 8, 4, 16, 128, "layernorm, moe_act", 17.6, "Code moe_dev(f3e6c5), '+1f1b overlap'.",
         overlap=True),
    _zoo(17, "DeepEP", 2, 8, 1, 1, 128, 4, "full", 17.6, "Megatron-FSDP ('FSDP On', strategy not stated: taken as "
         "--zero 3, optim_grads_params, the strategy Megatron-LM core_v0.16.1's megatron-fsdp-user-guide.md:32-33 "
         "requires), MBS 4, 'disable log para norm' (not modelled).", mbs=4, fsdp=True),
    C8_RUN,  # line 18: calibration
    _zoo(19, "DeepEP", 4, 8, 8, 4, 8, 256, "", 29.0, "Code main(1e057005)."),
    _mbridge_gptoss("26.02", 519, 64, 8047),
    _mbridge_gptoss("26.02.01", 434, 8, 13722),
]


RUNS: list[dict] = [
    # --- in sample: calibration C1–C3 (shared/calibration.md) ---
    dict(id="c1-torchtune-3b-packed", source=f"{TORCHTUNE}, row '+ packed dataset'; C1 of calibration.md",
         gpu="A100-80GB", model="llama-3.2-3b",
         setup=dict(stack="hf", batch=2, seq=4096, precision="bf16", optimizer_impl="foreach"),
         published=7075, unit="tokens/s/GPU", in_sample=True,
         notes="torchtune full_finetune_single_device, pure bf16, torch.optim.AdamW (foreach), modelled as the hf "
               "stack (as bench/targets/stacks_published.py). NB: the A100 variant is not stated; 80GB (60 GiB peak)."),
    dict(id="c1-torchtune-3b-compile", source=f"{TORCHTUNE}, row '+ torch.compile'; C1 of calibration.md",
         gpu="A100-80GB", model="llama-3.2-3b",
         setup=dict(stack="hf", batch=2, seq=4096, precision="bf16", optimizer_impl="foreach", compile=True),
         published=8998, unit="tokens/s/GPU", in_sample=True,
         notes="As the packed row plus torch.compile (torchtune compiles each layer and the loss)."),
    _tt("c2-tt-8b-fsdp8", 1, "FSDP", "llama-3.1-8b", dict(batch=2, dp=8, zero=3, recompute="op"), 5762,
        "C2 of calibration.md.", in_sample=True),
    _tt("c2-tt-8b-fsdp8-compile", 1, "FSDP + torch.compile", "llama-3.1-8b",
        dict(batch=2, dp=8, zero=3, recompute="op", compile=True), 6667, "C2 of calibration.md.", in_sample=True),
    _tt("c2-tt-8b-fsdp8-compile-fp8", 1, "FSDP + torch.compile + Float8", "llama-3.1-8b",
        dict(batch=2, dp=8, zero=3, recompute="op", compile=True, low_precision="tensorwise", fp8_all_gather=True), 8532, "C2 of calibration.md.",
        in_sample=True),
    *_c3("22B", (6144, 48, 64), 1, 8, 4, 1, 1.42, 1.10),
    *_c3("175B", (12288, 96, 96), 8, 64, 64, 3, 18.13, 13.75),
    *_c3("530B", (20480, 105, 128), 35, 280, 280, 3, 49.05, 37.83),
    *_c3("1T", (25600, 128, 160), 64, 512, 512, 1, 94.42, 71.49),
    *LOWP_CALIBRATION,  # C5–C7 (shared/calibration.md)
    # C8 (shared/calibration.md): the only published MoE run a constant may be fitted on
    C8_RUN,
    # --- out of sample: validation only, never fitted on ---
    *(_narayanan(n, x) for n, x in ((384, 153), (768, 149), (1536, 141))),
    _llama3(8192, 64, 32, 430),
    _llama3(16384, 128, 16, 400),
    _tt("tt-8b-fsdp128", 3, "FSDP", "llama-3.1-8b", dict(batch=2, dp=128, zero=3, recompute="op"), 5605),
    _tt("tt-8b-fsdp128-compile", 3, "FSDP + torch.compile", "llama-3.1-8b",
        dict(batch=2, dp=128, zero=3, recompute="op", compile=True), 6514),
    _tt("tt-8b-fsdp128-compile-fp8", 3, "FSDP + torch.compile + Float8", "llama-3.1-8b",
        dict(batch=2, dp=128, zero=3, recompute="op", compile=True, low_precision="tensorwise", fp8_all_gather=True), 8380),
    _tt("tt-8b-s32k-fsdp8", 2, "FSDP 8, CP 1", "llama-3.1-8b",
        dict(batch=1, seq=32768, dp=8, zero=3, recompute="full", compile=True, low_precision="tensorwise", fp8_all_gather=True), 3890),
    # Table 2's CP rows: the same 8 GPUs, FSDP over dp_shard × cp, the sequence doubling with cp (tokens per GPU fixed)
    *(_tt(f"tt-8b-s{seq // 1024}k-fsdp{dp}-cp{cp}", 2, f"FSDP {dp}, CP {cp}", "llama-3.1-8b",
          dict(batch=1, seq=seq, dp=dp, cp=cp, zero=3, recompute="full", compile=True, low_precision="tensorwise",
               fp8_all_gather=dp > 1), tps,
          "torchtitan's CP: torch's ring attention over SDPA as torch 2.13 runs it (analytic/parallel/"
          "torch_context.py; NB: the Dec 2024 torch's ring not re-read)."
          + ("" if dp > 1 else " FSDP 1: torchtitan's fp8 all-gather needs dp_shard > 1 (0.2.2 components/"
                               "quantization/float8.py:87-90), off here."))
      for dp, cp, seq, tps in ((4, 2, 65536, 2540), (2, 4, 131072, 1071), (1, 8, 262144, 548))),
    _tt("tt-70b-fsdp32-tp8", 4, "2D", "llama-3.1-70b",
        dict(batch=16, dp=32, tp=8, zero=3, recompute="full", compile=True, low_precision="tensorwise", fp8_all_gather=True,
             sequence_parallel=True), 829,
        "Local batch 16 per FSDP rank run as one micro-batch (no pipeline, no accumulation). Seq 8192 "
        "(torchtitan's llama3_70b.toml). torchtitan's TP is sequence-parallel: the blocks' input and output "
        "sequence-sharded, the norms SequenceParallel (torchtitan/parallelisms/parallelize_llama.py:135-191 at "
        "3f20451bc, 2024-12-26)."),
    # torchtitan's first published numbers (Apr 2024): FSDP2 over 64 A100-80GB (8 nodes of 8, 200 Gb/s HDR per GPU),
    # no compile, bf16 parameters with fp32 reductions; the issue-40 run (Llama 2 70B at 11.5 s a step)
    *(dict(id=f"tt-a100-{m}-fsdp64-b{b}-{ac}", source=f"{TT_A100} '{table}' table, row '{row}'", gpu="A100-80GB",
           model=model,
           setup=dict(stack="torchtitan", batch=b, seq=seq, dp=64, zero=3, recompute=ac, precision="amp-bf16",
                      attention="flash2"),
           published=tps, unit="tokens/s/GPU",
           notes="torchtitan at 1ea476e9 (2024-04-24), FSDP2 1D over 64 A100 80GB; SDPA's FlashAttention-2 (torch "
                 "2.3). Llama 2's sequence 4096, Llama 3's 8192 (the page's text).")
      for m, model, seq, b, ac, table, row, tps in (
          ("llama2-70b", "llama-2-70b", 4096, 1, "op", "Llama 2 performance numbers", "70B | 1 | selective op", 355),
          ("llama2-70b", "llama-2-70b", 4096, 2, "full", "Llama 2 performance numbers", "70B | 2 | full", 353),
          ("llama2-13b", "llama-2-13b", 4096, 2, "none", "Llama 2 performance numbers", "13B | 2 | no", 2162),
          ("llama3-70b", "llama-3.1-70b", 8192, 1, "full", "Llama 3 performance numbers", "70B | 1 | full", 331),
          ("llama3-8b", "llama-3.1-8b", 8192, 1, "op", "Llama 3 performance numbers", "8B | 1 | selective op",
           2973))),
    *(dict(id=f"tt-h200-8b-fsdp{n}", source=f"{TT_H200}, Results table, row NUM_NODES {n // 8}", gpu="H200",
           model="llama-3.1-8b",
           setup=dict(stack="torchtitan", batch=2, seq=8192, dp=n, zero=3, recompute="op", compile=True,
                      low_precision="tensorwise", fp8_all_gather=True, precision="amp-bf16", attention="flash2",
                      stack_release="2025-06"),  # e7c0cae with NGC 25.05's torch: the table's versions
           published=tps, unit="tokens/s/GPU", published_reserved_gib=gib,
           notes="Trainy, June 2025: llama3_8b.toml (seq 8192, FSDP over all ranks, selective op AC) with local batch "
                 "2, compile and Float8 (fp8 FSDP all-gather); SDPA pinned to FlashAttention-2 first on sm90 "
                 "(torchtitan models/attention.py at bcdeaa37: flash2). The command's "
                 "--float8.force_recompute_fp8_weight_in_bwd changes nothing: torchao 0afa4c1 (the table's) "
                 "deprecated it to a warning (float8/config.py:195-198, :270-273). Memory(GiB) read as max_reserved: "
                 "the figure torchtitan e7c0cae logs as 'memory' (components/metrics.py:403) and to wandb "
                 "(:388); NB if the table took another of its memory metrics (max_active), the published figure is "
                 "lower than reserved.")
      for n, tps, gib in ((32, 10938, 47.96), (64, 10753, 46.97))),
    dict(id="tt-dsv3-16b-ep8-b4", source=f"{TT_DSV3_16B_OOM}, first log (local_batch_size 4, step 10)",
         gpu="H100-80GB", model="deepseek-v2-lite",
         setup=dict(stack="torchtitan", batch=4, seq=4096, dp=8, zero=3, ep=8, recompute="op", precision="amp-bf16",
                    compile_loss=True),
         published=11636, unit="tokens/s/GPU", published_reserved_gib=73.32,
         notes="torchtitan main of 2025-10-02 (99fee810b), deepseek_v3_16b.toml (flavor 16B = DeepSeek-V2-Lite's "
               "shape: deepseek-v2-lite) with local_batch_size lowered (NB: to 4, the value the fix, PR #1792, then "
               "set for 80 GB H100s; the report's text does not restate it): FSDP 8, EP 8, ETP 1, per-op SAC, seq 4096; "
               "memory 73.32 GiB (92.70%) = torchtitan's max_reserved from step 10 to 40 (58.28 GiB at step 1), tps "
               "11,254-11,758 over steps 10-40. The job compiles the loss only (compile.components ['loss']: "
               "--compile-loss); per-op SAC stores the MoE layers' all-to-all outputs (deepseek_v3's "
               "save list at that commit too); attention is flex with a block-causal mask (modelled as flash); "
               "routing is modelled balanced (the router is untrained at step 10: under-counts the busiest rank). "
               "NB: at 99fee810b a flex model whose blocks are not compiled is not checkpointed block by block: "
               "the MoE module alone runs per-op SAC and the attention full AC (distributed/activation_checkpoint.py:"
               "147-218, the 16B flavor's use_flex_attn=True at models/deepseek_v3/__init__.py:102), where the "
               "pinned 0.2.2 wraps the whole block (modelled): the q and wkv_b outputs and the attention output are "
               "not stored, the norms' inputs and the two modules' inputs are (NB: over-counts ~6.2 KB per token "
               "and layer, ~2.5 GiB here)."),
    *(_mpt(*r) for r in MPT_RUNS),
    _bert("V100-16GB", "amp-fp16", 16, 128, 919.04, "Pre-training NVIDIA DGX-1 With 16G"),
    _bert("V100-16GB", "amp-fp16", 4, 512, 194.56, "Pre-training NVIDIA DGX-1 With 16G"),
    _bert("V100-32GB", "amp-fp16", 64, 128, 1305.6, "Pre-training NVIDIA DGX-1 With 32G"),
    _bert("V100-32GB", "amp-fp16", 8, 512, 231.68, "Pre-training NVIDIA DGX-1 With 32G"),
    _bert("V100-32GB", "fp32", 32, 128, 309.76, "Pre-training NVIDIA DGX-1 With 32G"),
    _squad("amp-fp16", 10, 325.60),
    _squad("fp32", 8, 64.32),
    *LOWP_VALIDATION,
    *(r for r in MOE_LAYOUT_RUNS if r is not C8_RUN),  # layout sets of MoE models (C8 listed above)
    *MOE_ROUTING_PAIRS,  # dropless vs forced balance, one layout each
    # the same gpt-oss-120b job on Hopper: whether the Blackwell rows' gap is the GPU's or the model's on this stack
    _mb("26.04.01", 238, "DGX-H100", "GPT OSS 120B", 64, "BF16", 1280, 1, 4096, pp=4, ep=8, tps=5824,
        recompute="selective", recompute_modules="layernorm,moe_act",
        notes="Hopper bf16 run: PP 4 (36 layers, 9 a stage: the recipe leaves the embedding and the loss out of the "
              "split, recipes/gpt_oss/gpt_oss.py:190-191 at v0.4.2), EP 8 over DP 16, MBS 1, GA 80. Recipe "
              "GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 (configs/gpt_oss/gpt_oss_workload_base_configs.py:124-127 "
              "at v0.4.2): V1's PP 4 and recompute modules layernorm, moe_act (:79-83; utils/overrides.py:148-150: "
              "selective granularity) with GBS 1280; EP 8, MBS 1 from the base (:32-38); no CUDA graphs."),
]

# Candidates looked at and left out (configuration not pinned down, or not expressible):
SKIPPED = [
    ("Megatron-LM README weak-scaling table / Narayanan 2021 Table 1 (1.7B–1T)",
     "micro-batch size and schedule per row not published in the table"),
    ("Shoeybi et al. 2019 (V100, 1.2B–8.3B)", "only scaling efficiencies and one aggregate PFLOP/s; per-run batch "
     "and FLOP formula not given per row; not verified in the time available"),
    ("llm-foundry H100 FP8 rows", "TransformerEngine fp8 (amp_fp8); TE recipes on llm-foundry are not a stack trainfit models"),
    ("torchtitan Table 6 (CP)", "405B on TP 8 x PP 8 with AsyncTP: AsyncTP not modelled, and 126 layers do not "
     "split evenly over 8 stages (as Table 5)"),
    ("torchtitan Table 4/5 AsyncTP and interleaved rows", "AsyncTP not modelled; interleaved virtual-stage count not "
     "published"),
    ("torchtitan Table 5 (405B, TP 8 x PP 8 x FSDP 8)", "126 layers do not split evenly over 8 stages and the "
     "split points torchtitan used are not published"),
    ("Llama 3 Table 4 CP 16 row (131k)", "CP layout with 16 GPUs per sequence and its micro-batching unstated"),
    ("GPT-NeoX-20B, BLOOM-176B, OPT-175B", "micro-batch / schedule / FLOP formula not verified in the time available"),
    ("C1 rows from '+ chunked cross-entropy' on, and the LoRA/QLoRA rows",
     "each sits on torchtune's compiled chunked loss, which no Setup expresses (the in-backward, offload, 8-bit and "
     "LoRA settings exist since issue 15; the analytic LoRA model refuses --compile); LoRA/QLoRA timed without "
     "compile in docs/benchmarks/fine-tuning.md"),
    # low-precision / Blackwell / AMD candidates (issue 39)
    ("torchtitan components/quantization/nvfp4.md (Llama 3 8B, Qwen3 8B: NVFP4, MXFP8, BF16 on FSDP 4)",
     "the GPU is not named (its memory share implies a ~184 GiB part: B200 or GB200), nor the activation "
     "checkpointing"),
    ("torchtitan components/quantization/mxfp8.md, Llama 4 Scout MXFP8 on GB200",
     "GPU count contradicts itself (\"512 GPU training on 64 node GB200\" vs \"64 nodes of 4 devices each = 256\")"),
    ("Megatron-Bridge DGX-GB300 and DGX-B300 rows", "GB300/B300 are not in gpus.json nor being added"),
    ("Megatron-Bridge 25.09 rows", "the table has no precision column (FP8 recipe per row not stated)"),
    ("Megatron-Bridge 25.11 DGX-H100 GPT OSS 120B", "GA 2 contradicts GBS 512 = MBS 4 x GA x DP 16 (PP 4 of 64 GPUs)"),
    ("Megatron-Bridge DeepSeek-V3, Kimi-K2, Nemotron 3 and 26.06+ rows", "not collected in the time available "
     "(MTP / hybrid-Mamba models; GA not stated from 26.02 on)"),
    ("AMD ROCm performance-results page and ROCm 7 MI355X training blog (MI300X/MI325X/MI355X, Primus Megatron-LM "
     "and torchtitan)", "per-row micro-batch and parallel layout not recoverable from the stored pages; no MI325X / "
     "MI355X run collected"),
    ("torchtitan asyncTP benchmark, 'Async TP' column and its bf16 rows", "async TP not modelled; the bf16 rows are "
     "Hopper bf16 (outside this set)"),
]


def narayanan_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))  # Narayanan et al. 2021 eq. 3


def megatron_flops(run: dict) -> float:
    """Megatron-LM's num_floating_point_operations for the run's global batch, its GQA / MoE branch
    (megatron/training/training.py:236-410 transformer_flops at f759111e, 2025-10; same sums at d98e8a6:
    core-attention term split out for THD only). Per token: MLP 12·l·h·g·(f·dense + f_moe·k·moe + f_shared·moe)/l
    with g = 3/2 under SwiGLU (gated_linear_multiplier, :292); attention 12·l·h²·(1 + groups/heads + s/2h)·(q/h)
    (:358-373, the causal half of the scores); logits 3·2·h·V (:406). V: the catalog's vocabulary (the MoE-ModelZoo
    Qwen3 config's --make-vocab-size-divisible-by 1187 pads 151,936 to itself for TP <= 128, vocab_utils.py:58)."""
    from trainfit.analytic.params import count_params
    from trainfit.api import load_spec

    spec, s = load_spec(run["model"]), run["setup"]
    if spec.mla is not None or spec.linear_attn is not None or spec.mtp_layers or spec.sliding_window:
        raise ValueError(f"{run['id']}: megatron_flops counts full GQA attention without MTP (not {spec.name})")
    seq, h, l, q = s["seq"], spec.hidden, spec.layers, spec.q_dim
    g = 1.5 if spec.gated_mlp else 1.0
    moe_layers = count_params(spec).moe_layers if spec.moe is not None else 0
    mlp = spec.intermediate * (l - moe_layers)
    if moe_layers:
        mlp += (spec.moe.expert_intermediate * spec.moe.top_k + (spec.moe.shared_intermediate or 0)) * moe_layers
    per_token = 12 * h * g * mlp + 12 * l * h * h * (1 + spec.kv_dim / q + seq / h / 2) * (q / h) + 6 * h * spec.vocab
    return per_token * tokens_per_step(run)


def gpus(run: dict) -> int:
    s = run["setup"]
    return s.get("dp", 1) * s.get("tp", 1) * s.get("pp", 1) * s.get("cp", 1)


def tokens_per_step(run: dict) -> int:
    s = run["setup"]
    return s.get("batch", 1) * s["seq"] * s.get("grad_accum", 1) * s.get("dp", 1)


def published_step(run: dict) -> float:
    """The published metric as seconds per optimizer step (the unit conversions of the module docstring)."""
    unit, x, s = run["unit"], run["published"], run["setup"]
    if unit == "s/step":
        return x
    if unit == "tokens/s/GPU":
        return tokens_per_step(run) / (x * gpus(run))
    if unit == "sequences/s":
        return s.get("batch", 1) * s.get("grad_accum", 1) * s.get("dp", 1) / x
    if unit == "TFLOP/s/GPU (Narayanan eq. 3)":
        h, l = run["model"]["n_embd"], run["model"]["n_layer"]
        B = s.get("batch", 1) * s.get("grad_accum", 1) * s.get("dp", 1)
        return narayanan_flops(B, s["seq"], l, h, run["model"]["vocab_size"]) / (x * 1e12 * gpus(run))
    if unit == "TFLOP/s/GPU (6N + 12lhs)":
        l, h = 126, 16384  # Llama 3 405B (Table 3 of the paper)
        per_token = 6 * 405e9 + 12 * l * h * s["seq"]  # PaLM (Chowdhery et al. 2022) Appendix B
        return per_token * tokens_per_step(run) / (x * 1e12 * gpus(run))
    if unit == "TFLOP/s/GPU (Megatron-LM)":
        return megatron_flops(run) / (x * 1e12 * gpus(run))
    raise ValueError(f"{run['id']}: unknown unit {unit!r}")
