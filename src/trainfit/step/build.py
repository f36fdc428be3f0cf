"""Build the real transformers model and its input batches for the standard step (DESIGN.md §3).

Shared by the measure engine (real tensors) and the trace engine (the same calls made under
`FakeTensorMode` or `with torch.device("meta")`), so that both run exactly the same model and step.
Nothing here downloads weights: models are built from their config with random initialisation,
and nothing reads tensor values (no `.item()`), so the functions work on fake and meta tensors.

Choices that affect memory (documented here because both engines inherit them):
- `use_cache=False` in the config: a training step does not need the KV cache. With the HF default
  (`use_cache=True`) llama-style models build a `DynamicCache` during the forward pass that keeps each
  layer's pre-`repeat_kv` K/V alive (extra memory under eager GQA attention); HF itself forces
  `use_cache=False` under gradient checkpointing, and fine-tuning scripts usually set it.
- attention: `setup.attention_kernel` "eager" -> HF "eager"; "sdpa", "flash", "flash2" and "triton" -> HF "sdpa" (the trace
  of "triton": FlashAttention in Triton saves what the flash kernel saves, O and the log-sum-exp; NB: its LSE rows
  are padded to a multiple of 128, flash_attn_triton.py `seqlen_q_rounded`: < 512 B per head under-counted)
  (on CUDA torch's SDPA dispatches to its flash / memory-efficient kernels when no mask is given;
  we do not require the flash-attn package).
- batches carry no `attention_mask`, so HF's SDPA path passes `is_causal=True` instead of
  materialising a (batch, 1, seq, seq) mask.
- the task head (trainfit.heads: --head, else the config's architectures, else the family's LM head) picks the
  transformers Auto class; classifiers get `num_labels` from the spec. Decoders' sequence classifiers pool each
  sequence's last non-padding token and refuse batch > 1 without a `pad_token_id`: when the config has none we
  set the eos id (0 when there is none), as fine-tuning scripts do (`model.config.pad_token_id =
  tokenizer.eos_token_id`); the random ids may hit it, which moves the pooled position but not the memory.
"""
from __future__ import annotations

import copy

from typing import TYPE_CHECKING

import torch

from ..heads import CLASSIFIERS
from ..models.hf_config import for_setup
from .lora import apply_lora

if TYPE_CHECKING:  # pragma: no cover
    from ..setup import Setup
    from ..spec import ModelSpec

# transformers' Auto class per task head (trainfit.heads.CLASSES names the concrete class per family).
_AUTO = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
         "seq-cls": "AutoModelForSequenceClassification", "token-cls": "AutoModelForTokenClassification",
         "seq2seq-lm": "AutoModelForSeq2SeqLM"}

# Keys of the raw config dict that are not transformers config arguments.
_DROP_KEYS = ("_trainfit", "model_type", "transformers_version", "architectures", "auto_map")


_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_dtype(setup: "Setup") -> torch.dtype:
    """dtype of the model parameters (the precision table's weight dtype; quantised formats build in fp32)."""
    return _TORCH_DTYPE.get(setup.policy.weight, torch.float32)


def autocast_dtype(setup: "Setup") -> torch.dtype | None:
    """dtype for torch.autocast (None: no autocast)."""
    return _TORCH_DTYPE.get(setup.policy.autocast)


def hf_attn_implementation(spec: "ModelSpec", setup: "Setup") -> str:
    """HF's attention implementation: eager when asked for, or when transformers refuses SDPA for the family
    (Gemma-2) — the analytic engine reads the same fact from data/families.json."""
    from ..analytic.activations import family_traits

    if setup.attention_kernel == "eager" or not family_traits(spec)["sdpa"]:
        return "eager"
    return "sdpa"


def hf_config(spec: "ModelSpec", setup: "Setup"):
    """The transformers config for `spec` (from `spec.config`, the raw HF config dict)."""
    from transformers import AutoConfig

    # a deep copy: transformers writes into nested dicts (rope_scaling gains rope_theta), and spec.config is the
    # catalog's own, shared by every later estimate in the process
    cfg = {k: copy.deepcopy(v) for k, v in spec.config.items() if k not in _DROP_KEYS}
    model_type = spec.config.get("model_type") or spec.family
    # The config's own dtype would otherwise decide the parameter dtype in _from_config; we pass
    # the dtype explicitly in build_model.
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    config = AutoConfig.for_model(model_type, **cfg)
    config.use_cache = False
    if spec.vision is not None:  # the language model reads its own sub-config
        config.get_text_config().use_cache = False
    config._attn_implementation = hf_attn_implementation(spec, setup)
    head = for_setup(spec, setup)
    if head.task_head in CLASSIFIERS:
        config.num_labels = head.num_labels
        if head.task_head == "seq-cls" and head.causal and config.pad_token_id is None:
            eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) and config.eos_token_id \
                else config.eos_token_id
            config.pad_token_id = eos if isinstance(eos, int) and 0 <= eos < spec.vocab else 0
    return config


def build_model(spec: "ModelSpec", setup: "Setup", device="cpu") -> torch.nn.Module:
    """The HF model for `spec` with the task head `setup` trains (trainfit.models.hf_config.for_setup), random init, in
    train mode.

    Parameters are fp32 for fp32 / amp-* and bf16 for bf16 / bf16-master (the fp32 master copy of
    bf16-master belongs to the optimizer, see `trainfit.step.standard`).
    With --lora-rank the model is peft's PeftModel around it (trainfit.step.lora).
    Works under FakeTensorMode and `torch.device("meta")`: the model is created inside
    `with torch.device(device)` and no tensor value is read.
    """
    import transformers

    config = hf_config(spec, setup)
    head = for_setup(spec, setup).task_head
    # a vision-language model: its *ForConditionalGeneration (the tower and the language model; trainfit.heads); an
    # audio encoder-decoder (Whisper) is transformers' speech seq2seq class (MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING)
    audio = spec.encdec is not None and spec.encdec.mel_bins
    auto = getattr(transformers, "AutoModelForImageTextToText" if spec.vision is not None
                   else "AutoModelForSpeechSeq2Seq" if audio else _AUTO[head])
    with torch.device(device):
        model = auto.from_config(config, dtype=param_dtype(setup), attn_implementation=hf_attn_implementation(spec, setup))
    keep_fp32_modules(model)
    if torch.device(device).type == "cuda" and torch.cuda.is_initialized():
        # from_config on the device makes the LM head's own weight before tie_weights replaces it with the word
        # embedding: the freed block stays in the caching allocator's cache (a second embedding-sized segment in
        # the H200 runs' snapshots, bench/results/gpu/H200-2026-11-27-unrecorded-6-truth.json). A user's model never holds it:
        # from_pretrained builds on the meta device (transformers 5.24 modeling_utils.py:3840 get_init_context)
        # and .to() moves the tied tensor once. Released here so that the measured process holds what theirs does.
        torch.cuda.empty_cache()
    model.train()
    return apply_lora(model, setup)  # --lora-rank: peft's adapters, base frozen (step/lora.py)


def keep_fp32_modules(model: torch.nn.Module) -> None:
    """Loaded in fp16, a model's `_keep_in_fp32_modules` stay fp32: from_pretrained's dtype plan (transformers 5.24
    modeling_utils.py:3844-3858 _get_dtype_plan: fp16 only; T5's `wo`, modeling_t5.py:542), which from_config does
    not apply. NB: the `_strict` list (fp32 under bf16 too: DeepSeek-V3's and Nemotron-H's router gates) is left as
    from_config builds it."""
    names = getattr(model, "_keep_in_fp32_modules", None)
    if not names or next(model.parameters()).dtype != torch.float16:
        return
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in names:
            continue
        # new Parameters rather than module.to(): fake tensors (the trace) cannot be swapped in place
        for pname, p in list(module.named_parameters(recurse=True)):
            owner = module.get_submodule(pname.rpartition(".")[0]) if "." in pname else module
            setattr(owner, pname.rpartition(".")[2],
                    torch.nn.Parameter(p.detach().to(torch.float32), requires_grad=p.requires_grad))


def make_batches(spec: "ModelSpec", setup: "Setup", device="cpu") -> list[dict]:
    """`setup.grad_accum` micro-batches of {input_ids, labels}: input_ids (batch, seq) int64, random ids < vocab.

    LM heads: labels is a copy of input_ids (as `DataCollatorForLanguageModeling` does): causal LMs shift
    internally; for masked LMs every position is a target (NB: a real MLM batch sets 80-85% of the
    labels to -100, but the logits and the loss are computed over every position either way, so the
    memory is the same up to the loss's tiny per-token temporaries).
    seq-cls: one class id per sequence, (batch,) int64 < num_labels; with num_labels == 1 transformers trains a
    regression (MSELoss), so the labels are (batch,) floats in the parameters' dtype.
    token-cls: one class id per token, (batch, seq) int64 < num_labels.
    seq2seq-lm (encoder-decoder): input_ids (Whisper: input_features, `encoder_inputs`) feed the encoder, labels
    (batch, --target-seq) the decoder.
    No attention_mask (see module docstring).
    """
    head = for_setup(spec, setup)
    kind, n = head.task_head, head.num_labels
    if spec.vision is not None and setup.images:
        return [vlm_batch(spec, setup, device, labels=True) for _ in range(setup.grad_accum)]
    batches = []
    for _ in range(setup.grad_accum):
        name, ids = encoder_inputs(spec, setup, device)
        if kind == "seq-cls" and n == 1:
            labels = torch.rand(setup.batch, dtype=param_dtype(setup), device=device)
        elif kind == "seq-cls":
            labels = torch.randint(0, n, (setup.batch,), dtype=torch.long, device=device)
        elif kind == "token-cls":
            labels = torch.randint(0, n, (setup.batch, setup.seq), dtype=torch.long, device=device)
        elif kind == "seq2seq-lm":
            # the decoder's targets (batch, --target-seq); T5ForConditionalGeneration builds decoder_input_ids from
            # them (modeling_t5.py:1030-1031 _shift_right), as a seq2seq collator's batch does
            labels = torch.randint(0, spec.vocab, (setup.batch, setup.target_tokens), dtype=torch.long, device=device)
        else:
            labels = ids.clone()
        batches.append({name: ids, "labels": labels})
    return batches


def vlm_batch(spec: "ModelSpec", setup: "Setup", device="cpu", labels: bool = False) -> dict:
    """One micro-batch of a vision-language model (Qwen2.5-VL, Qwen3-VL), as its processor makes it and the model
    reads it (modeling_qwen2_5_vl.py Qwen2_5_VLModel.forward :1175-1257, modeling_qwen3_vl.py Qwen3VLModel.forward):
    - input_ids (batch, seq + images x tokens per image): --seq random text ids (never the image or video
      placeholder id) and, after the first token, each image's (image / (patch x merge))^2 placeholder ids, which
      the model replaces by the merger's outputs (masked_scatter; Qwen3-VL also adds its deepstack features there);
    - pixel_values (batch x images x (image / patch)^2, channels x temporal_patch x patch^2) fp32, the processor's
      flattened patches (a still image repeated temporal_patch times: grid_t = 1);
    - image_grid_thw (batch x images, 3): (1, image / patch, image / patch) per image;
    - the tower's index tensors, computed from the grid by transformers' own helpers (vision_utils.py
      get_vision_cu_seqlens, get_vision_position_ids; Qwen2.5-VL's windows get_vision_window_index; Qwen3-VL's
      position-table resampling get_vision_interpolation_indices_and_weights, bilinear with aligned corners as
      modeling_qwen3_vl.py :683-690 asks) and passed as the precomputed `image_*` keywords the model accepts
      (utils/generic.py accepts_precomputed_kwargs): the same tensors the forward would build, made here because
      building them reads values (.tolist()), which fake tensors cannot;
    - position_ids (3, batch, L): the language model's M-RoPE positions, the plain 0..L-1 in each of the three
      sections (NB: get_rope_index gives image tokens 2-D positions instead, a (3, batch, L) tensor all the same;
      Qwen3-VL refuses images without mm_token_type_ids unless the positions are given);
    - labels (training): input_ids with the image positions at -100 (no loss on them).
    The ids and the index tensors are made from Python values: under the trace's fake mode they are constants
    (trace/fake.py vision_constants), so the placeholder masks derived from the ids are known too (Qwen3-VL's
    deepstack indexes the hidden states with them). No attention_mask."""
    from transformers import vision_utils as vu

    t, n = spec.vision, setup.images
    if t.projector == "pool":
        return _pooled_batch(spec, setup, device, labels)
    if t.projector == "cross":  # Mllama: tiles read through cross-attention (step/mllama_batch.py)
        from .mllama_batch import tiled_batch
        return tiled_batch(spec, setup, device, labels)
    side = setup.image_size // t.patch
    image_tokens = n * t.tokens(setup.image_size)
    length = setup.seq + image_tokens
    with _real_tensors():
        grid = torch.tensor([[1, side, side]] * (setup.batch * n), dtype=torch.long)
        index = {"cu_seqlens": vu.get_vision_cu_seqlens(grid), "position_ids": vu.get_vision_position_ids(grid, t.merge)}
        if t.window:
            index["window_index"], index["cu_window_seqlens"] = vu.get_vision_window_index(grid, t.merge, t.window,
                                                                                           t.patch)
        if t.position_embeddings:
            index["interp_indices"], index["interp_weights"] = vu.get_vision_interpolation_indices_and_weights(
                grid, int(t.position_embeddings ** 0.5), mode="bilinear", align_corners=True,
                spatial_merge_size=t.merge)
        ids = torch.randint(0, spec.vocab, (setup.batch, length), dtype=torch.long)
        for p in [t.image_token_id] + [v for v in (spec.config.get("video_token_id"),) if isinstance(v, int)]:
            ids = ids.masked_fill(ids == p, 0)
        ids[:, 1:1 + image_tokens] = t.image_token_id
        values = {k: (v.tolist(), v.dtype) for k, v in {**index, "grid": grid, "ids": ids}.items()}
    made = {k: torch.tensor(v, dtype=dt, device=device) for k, (v, dt) in values.items()}
    ids = made.pop("ids")
    pixels = torch.randn(setup.batch * n * side * side, t.patch_values, dtype=torch.float32, device=device)
    positions = torch.arange(length, device=device).view(1, 1, -1).expand(3, setup.batch, -1)
    batch = {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": made.pop("grid"), "position_ids": positions,
             **{f"image_{k}": v for k, v in made.items()}}
    if labels:
        lab = ids.clone()
        lab[:, 1:1 + image_tokens] = -100
        batch["labels"] = lab
    return batch


def _pooled_batch(spec: "ModelSpec", setup: "Setup", device="cpu", labels: bool = False) -> dict:
    """One micro-batch of Gemma 3 with images, as Gemma3Processor makes it (processing_gemma3.py) and
    Gemma3Model.forward reads it (modeling_gemma3.py :800-895): input_ids with mm_tokens_per_image placeholder ids
    per image (after the first token), pixel_values (batch x images, channels, image, image) fp32, token_type_ids 1 on
    the image tokens (in training the language model's masks then let an image's tokens attend to each other both
    ways: create_masks_for_vision_model, a materialised mask), labels -100 on the image tokens. The ids and the token
    types are made from Python values (constants under the trace's fake mode, as in vlm_batch)."""
    t, n = spec.vision, setup.images
    image_tokens = n * t.tokens(setup.image_size)
    with _real_tensors():
        ids = torch.randint(0, spec.vocab, (setup.batch, setup.seq + image_tokens), dtype=torch.long)
        ids = ids.masked_fill(ids == t.image_token_id, 0)
        ids[:, 1:1 + image_tokens] = t.image_token_id
        values = {"ids": (ids.tolist(), ids.dtype), "types": ((ids == t.image_token_id).long().tolist(), torch.long)}
    made = {k: torch.tensor(v, dtype=dt, device=device) for k, (v, dt) in values.items()}
    pixels = torch.randn(setup.batch * n, t.in_channels, setup.image_size, setup.image_size, dtype=torch.float32,
                         device=device)
    batch = {"input_ids": made["ids"], "pixel_values": pixels, "token_type_ids": made["types"]}
    if labels:
        lab = made["ids"].clone()
        lab[:, 1:1 + image_tokens] = -100
        batch["labels"] = lab
    return batch


def _real_tensors():
    """A context where tensors are real, also inside the trace's fake mode (the grid's index arithmetic)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def encoder_inputs(spec: "ModelSpec", setup: "Setup", device="cpu") -> tuple[str, torch.Tensor]:
    """(the forward's keyword, the tensor) a batch feeds the model: input_ids (batch, seq), random ids < vocab; an
    audio encoder-decoder (Whisper) reads input_features (batch, mel_bins, EncoderDecoderSpec.mel_frames(seq)) log-mel
    frames in the parameters' dtype (WhisperFeatureExtractor's output cast to the model's dtype; the encoder's
    stride-2 conv makes `seq` positions of them, modeling_whisper.py WhisperEncoder.forward :611-615)."""
    mel = spec.encdec.mel_bins if spec.encdec is not None else 0
    if mel:
        frames = spec.encdec.mel_frames(setup.seq)
        return "input_features", torch.randn(setup.batch, mel, frames, dtype=param_dtype(setup), device=device)
    return "input_ids", torch.randint(0, spec.vocab, (setup.batch, setup.seq), dtype=torch.long, device=device)
