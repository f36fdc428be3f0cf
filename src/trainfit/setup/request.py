"""The flat request: a model plus every setting (the Python API's, CLI's and web API's view), and how it becomes
the engines' Setup (model-dependent defaults resolved)."""
from __future__ import annotations

import os

from .. import heads as _heads
from .. import limits
from .. import precision as _precision
from .. import stacks as _stacks
from ..errors import SetupError
from .settings import _RUN_SETTINGS, BY_NAME, SETTINGS, SETUP_NAMES, Setup, check_value, refuse_inapplicable
from .vocab import DEFAULT_SEQ, DEFAULT_TARGET_SEQ, MODES, TRAINING
from dataclasses import field, make_dataclass
from typing import Optional



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
    if mode == "serve" and values["quant"] is None and spec is not None and \
            getattr(spec, "checkpoint_quant", None):  # the engine loads a quantised checkpoint as stored
        values["quant"] = spec.checkpoint_quant
    if values["seq"] is None and not _is_vision(spec):  # (serving sizes by --max-model-len, rl by its prompts and
        # completions: not --seq)
        values["seq"] = DEFAULT_SEQ if mode in ("serve", "rl") else default_seq(spec, mode)
    from ..spec import VisionSpec

    if isinstance(spec, VisionSpec):
        from ..vision_setup import vision_values

        return Setup(**vision_values(spec, values, self))
    if spec is not None and values["channels_last"]:
        raise SetupError(f"--channels-last applies to vision models (resnet, convnext, vit); {spec.name} is "
                         f"{spec.family}")
    if spec is not None:
        from ..vlm_setup import vlm_values

        values = vlm_values(spec, values)  # --images / --image-size: a vision-language model's, refused otherwise
        values["target_seq"] = target_seq(spec, values["target_seq"], mode, values["seq"])
    if spec is not None and mode == "train":
        values["head"] = _heads.resolve(spec, values["head"], mode)  # --head, else the config's, else the family's
    setup = Setup(**values)
    if spec is not None and mode in ("train", "infer"):
        limits.check_logits(setup.batch * setup.seq, spec.vocab)
    return setup


def target_seq(spec, value: int | None, mode: str, seq: int | None = None) -> int | None:
    """--target-seq for `spec`: the decoder's tokens of an encoder-decoder model (default DEFAULT_TARGET_SEQ); refused
    in one line for other models, and for the modes that do not run the two stacks' step. An audio encoder (Whisper)
    reads exactly its max_source_positions (30 s of audio): another --seq is refused too."""
    encdec = getattr(spec, "encdec", None) is not None
    if mode in ("serve", "rl"):
        if encdec:
            raise SetupError(f"--mode {mode} of an encoder-decoder model ({spec.name}: {spec.family}) is not modelled "
                             "(a serving engine's or a rollout's cache would hold cross-attention K/V per request); use "
                             "--mode train or --mode infer")
        return value  # (the settings' rules refuse a --target-seq outside its modes)
    if not encdec:
        if value is not None:
            raise SetupError(f"--target-seq sets the decoder length of an encoder-decoder model (T5, Flan-T5); "
                             f"{spec.name} ({spec.family}) has one sequence: use --seq only")
        return None
    e = spec.encdec
    if e.mel_bins and seq is not None and seq != spec.max_positions:
        raise SetupError(f"--seq {seq}: {spec.name}'s encoder reads exactly {e.mel_frames(spec.max_positions)} mel "
                         f"frames (30 s of audio), {spec.max_positions} positions (WhisperEncoder); use --seq "
                         f"{spec.max_positions}")
    tokens = value if value is not None else DEFAULT_TARGET_SEQ
    # the decoder's learned position table (BART: as large as the encoder's; Whisper: max_target_positions); the
    # decode step writes one position more
    table = e.decoder_positions or (spec.max_positions if spec.positions == "learned" else 0)
    longest = table - (1 if mode == "infer" else 0)
    if table and tokens > longest:
        raise SetupError(f"--target-seq {tokens}: {spec.name}'s decoder has {table} learned positions "
                         f"(at most {longest} tokens in --mode {mode}); lower --target-seq")
    return tokens


def _is_vision(spec) -> bool:
    from ..spec import VisionSpec

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
MODEL_SETTINGS = tuple(s.name for s in SETTINGS if s.meta.names_model)  # --draft-model, --critic-model, --reward-model
# the run settings that describe the GPU itself: they become the GPU object (api.gpu_of), not engine keywords
GPU_SETTINGS = ("gpu", "price", "gpu_memory", "power_limit", "cluster", "host_memory")


def run_settings(req) -> dict:
    """The request's run settings the engines take as keywords (gpu, price, gpu_memory, power_limit and cluster
    become the GPU object instead)."""
    return {s.name: getattr(req, s.name) for s in _RUN_SETTINGS if s.name not in GPU_SETTINGS}


def refuse_price_without_tokens(price, tokens) -> None:
    """--price is read only to cost a --tokens budget (estimate's and plan's)."""
    if price is not None and tokens is None:
        raise SetupError("--price sets the cost of a training budget: add --tokens (e.g. --tokens 15T), or drop it")


MODEL_WORDS = "a catalog name (see `trainfit models`), a config.json path, or a hub id"


def _not_a_model(model) -> str:
    """Why `model` (not a str) is no model, in one line: what it is, and what to give instead."""
    if isinstance(model, dict):
        return (f"model: a dict is not read as a config.json; give {MODEL_WORDS} (json.dump the dict to a "
                "config.json and pass its path)")
    if callable(getattr(model, "named_parameters", None)):  # a torch.nn.Module (torch is not imported here)
        return (f"model: an nn.Module ({type(model).__name__}) is traced by trainfit.trace_module(module, "
                f"example_batch, ...); estimate() takes {MODEL_WORDS}")
    return f"model: {repr(model)[:60]} ({type(model).__name__}) is not a model; give {MODEL_WORDS}"


def _request_post_init(self) -> None:
    if isinstance(self.model, os.PathLike):  # a pathlib.Path to a config.json (or a folder holding one)
        object.__setattr__(self, "model", os.fspath(self.model))
    if not isinstance(self.model, str):
        raise SetupError(_not_a_model(self.model))
    if not self.model.strip():
        raise SetupError(f"choose a model: {MODEL_WORDS}")
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
    if self.power_limit is not None and self.gpu is None:
        raise SetupError("--power-limit caps a GPU's board power, which needs --gpu (see `trainfit gpus`)")
    if self.cluster is not None and self.gpu is None:
        raise SetupError("--cluster places GPUs in nodes, which needs --gpu (see `trainfit gpus`)")
    if self.host_memory is not None and self.gpu is None:
        raise SetupError("--host-memory sets the memory of the GPU's node, which needs --gpu (see `trainfit gpus`)")
    if self.tokens is not None and self.gpu is None:
        raise SetupError("--tokens gives the time and cost of a budget, which needs a GPU: add --gpu (see `trainfit gpus`)")
    if self.mfu is not None and self.gpu is None:  # (the step time is the GPU's; without one there is none to set)
        raise SetupError("--mfu sets the step time on a GPU, which needs --gpu (see `trainfit gpus`)")
    if self.reserve != BY_NAME["reserve"].default and self.gpu is None:
        raise SetupError("--reserve keeps memory free when judging the fit on a GPU, which needs --gpu (see "
                         "`trainfit gpus`)")
    refuse_price_without_tokens(self.price, self.tokens)
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
