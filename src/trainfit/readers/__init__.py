"""Readers of the stacks' own launch configs (`trainfit check FILE…`): one module per stack, each parsing through
the stack's own parser where it is installed, giving back a Reading: the model the file names, the trainfit
settings (setup.settings names) its keys set, and one line per key trainfit does not model (with the direction of
its effect) or does not know. The writers (plan/emit_*.py) are their inverses: tests/readers checks the round trip."""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

from ..errors import SetupError
from ..references import not_a_file

READERS = ("torchtitan", "megatron", "deepspeed", "accelerate", "hf_args", "trl", "axolotl", "llamafactory", "vllm",
           "sglang")


@dataclass
class Reading:
    """What one file says, in trainfit's terms."""

    source: str  # the file and the parser that read it
    values: dict = field(default_factory=dict)  # trainfit setting name -> value
    model: str | None = None  # a model reference (catalog name, hub id, config.json path) the file names
    not_modelled: list[str] = field(default_factory=list)  # "key = value: not modelled (effect)"
    unknown: list[str] = field(default_factory=list)  # keys neither mapped nor known to trainfit
    no_effect: list[str] = field(default_factory=list)  # keys with no effect on a step's memory or time
    warned: list[str] = field(default_factory=list)  # what the tool's own parser says about the file: its warnings
    # (deprecations), and a flag it stops at (a serving engine's flag of another release: readers.vllm.account's gone,
    # cmdline.release_flags)
    of_model: list[str] = field(default_factory=list)  # keys of the model's own architecture, taken from --model
    sized: list = field(default_factory=list)  # (knob, key, value, effect): a serving engine's flag that trainfit
    # sizes as the engine does (Estimate.detail.serving.knobs[knob]), settled by `against` once the estimate is made
    as_modelled: list[str] = field(default_factory=list)  # "key value": what the estimate assumed (`against`)
    checks: list = field(default_factory=list)  # callables(spec) -> None: the file's model shape against the spec
    global_batch: int | None = None  # sequences per optimizer step, when the file gives them but not the world size
    fills: dict = field(default_factory=dict)  # DeepSpeed "auto" key -> the value the HF Trainer fills it with (the
    # TrainingArguments' bf16/fp16: transformers 5.24.0 integrations/deepspeed.py:183-184)
    together: list = field(default_factory=list)  # callables(readings) -> None, run once by combine: what the file
    # leaves to the files read with it (DeepSpeed's "auto" values, TrainingArguments' deepspeed)
    same_model: object = None  # callable(ref) -> bool: whether --model `ref` is the model the file builds (torchtitan's
    # flavor, Megatron's flags), for files whose model is a shape rather than a name

    def set(self, name: str, value, key: str) -> None:
        """Setting `name` = `value` from the file's `key` (two keys disagreeing: an error; a value the setting refuses:
        an error naming the file's key, not only trainfit's flag)."""
        from ..setup import BY_NAME, check_value, refuse_written

        setting, mode = BY_NAME[name], self.values.get("mode", "train")
        try:
            check_value(setting, value, mode)
            if mode not in setting.meta.modes and value != setting.default:  # (as the request refuses it)
                refuse_written(frozenset({name}), mode)
        except SetupError as e:
            raise SetupError(f"{_file(self)}: {key} {value!r} (read as {setting.flag}): {e}") from None
        if name in self.values and self.values[name] != value:
            raise SetupError(f"{self.source}: {key} sets {name.replace('_', '-')} = {value!r} but another key set "
                             f"{self.values[name]!r}: make them agree")
        self.values[name] = value

    def skip(self, key: str, value, effect: str) -> None:
        """Key `key` = `value`, which trainfit does not model: `effect` says the direction (more/less memory or
        time), or starts with "no effect" (paths, logging, learning rates: listed apart)."""
        if effect.startswith("no effect"):
            self.no_effect.append(key)
        else:
            what = key if value == "…" else f"{key} = {value!r}"
            self.not_modelled.append(f"{what}: not modelled ({effect})")

    def sizes(self, knob: str, key: str, value, effect: str) -> None:
        """Key `key` = `value` sets what the estimate sizes itself as the engine does (the serving knob `knob`): as
        modelled where the estimate's knob is that value, else not modelled with `effect` (`against`)."""
        self.sized.append((knob, key, value, effect))

    def against(self, knobs: dict) -> None:
        """Settle the `sizes` keys against the estimate's serving knobs (Estimate.detail.serving.knobs)."""
        for knob, key, value, effect in self.sized:
            if knobs.get(knob) == value:
                self.as_modelled.append(f"{key} {value}")
            else:
                self.skip(key, value, effect + (f"; the estimate has {knobs[knob]}" if knob in knobs else ""))
        self.sized = []


@dataclass(frozen=True)
class Gone:
    """A serving engine's flag the reader's release stops at (unrecognized, or an ambiguous prefix) that another listed
    release takes (serving_versions.parser_takes says which): `then` its effect there as a key not modelled ("":
    none), `why` what the reader's release does and what replaced it; `sized`: the serving knob it sets there, which
    the estimate sizes as the engine does (Reading.sizes), where it has one."""

    then: str
    why: str
    sized: str | None = None


def kind_of(path: Path, text: str) -> str:
    """Which stack's file `path` is, from its name and content."""
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return "torchtitan"
    words = text.replace("\\\n", " ").split()
    from .sglang import launched

    if launched(words):
        return "sglang"
    if "serve" in words and any(w.endswith("vllm") for w in words):
        return "vllm"
    if "torchtitan.train" in words:
        return "torchtitan"
    if any(w.endswith("pretrain_gpt.py") or w == "--tensor-model-parallel-size" for w in words):
        return "megatron"
    if suffix == ".json":
        import json

        try:
            data = json.loads(text)
        except ValueError as e:
            raise SetupError(f"{path}: not valid JSON ({e}): fix the file") from None
        if not isinstance(data, dict):
            raise SetupError(f"{path}: a JSON object is expected (a DeepSpeed config or TrainingArguments)")
        if {"train_micro_batch_size_per_gpu", "train_batch_size", "zero_optimization"} & set(data):
            return "deepspeed"
        if "compute_environment" in data or "distributed_type" in data:
            return "accelerate"
        return _trainer_args(data, path)
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SetupError(f"{path}: not valid YAML ({str(e).splitlines()[0]}): fix the file") from None
        if not isinstance(data, dict):
            raise SetupError(f"{path}: a YAML mapping is expected (an accelerate config or TrainingArguments)")
        if "compute_environment" in data or "distributed_type" in data:
            return "accelerate"
        return _trainer_args(data, path)
    raise SetupError(f"{path}: not a config trainfit reads (a torchtitan .toml, a DeepSpeed, TrainingArguments, "
                     "TRL, axolotl or LLaMA-Factory .json/.yaml, an accelerate or vLLM/SGLang --config .yaml, or a "
                     "pretrain_gpt.py / "
                     "torchtitan.train / vllm serve / sglang serve / sglang.launch_server command line)")


# flags both vLLM 0.33's serve parser and SGLang 0.5.23's take (both parsers' option strings compared), which no
# TrainingArguments or TRL config field is named: a YAML with these and neither engine's own keys is a serving
# config whose engine its keys do not tell
SERVE_KEYS = frozenset({"tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size", "kv-cache-dtype",
                        "served-model-name", "cpu-offload-gb", "tokenizer-mode", "attention-backend"})


def _trainer_args(data: dict, path: Path) -> str:
    """axolotl (its base_model), llamafactory (model_name_or_path with its stage, finetuning_type, cutoff_len or
    template), trl for a TRL SFTConfig/GRPOConfig/DPOConfig (keys only TRL's configs have), vllm or sglang for a
    serving engine's --config YAML (_serving), else hf_args."""
    from .trl import kind

    if "base_model" in data:
        return "axolotl"
    if "model_name_or_path" in data and {"stage", "finetuning_type", "cutoff_len", "template"} & set(data):
        return "llamafactory"
    if kind(data):
        return "trl"
    return _serving(data, path) or "hf_args"


def _serving(data: dict, path: Path) -> str | None:
    """vllm or sglang for a `--config` YAML by its keys (each engine's own: vllm.CONFIG_KEYS, sglang.CONFIG_KEYS;
    underscores read as dashes, as vLLM reads them), None for a YAML with neither engine's keys; refused in one line
    where the keys are both engines' own, or flags both take (SERVE_KEYS) and neither's own."""
    from .cmdline import config_file
    from .sglang import CONFIG_KEYS as SGLANG
    from .vllm import CONFIG_KEYS as VLLM

    keys = {str(k).replace("_", "-") for k in data}
    vllm, sglang = sorted(keys & VLLM), sorted(keys & SGLANG)
    if vllm and sglang:
        raise SetupError(f"{path}: both vLLM's flags ({', '.join(vllm)}) and SGLang's ({', '.join(sglang)}): a config "
                         "file is one engine's: keep that engine's keys")
    if vllm or sglang:
        engine = "vLLM" if vllm else "SGLang"
        if not config_file(path):  # (vllm/utils/argparse_utils.py:633-637; SGLang's server_args_config_parser.py:155-162)
            raise SetupError(f"{path}: {engine}'s flags as a config file: {engine} reads a .yaml or .yml one only: "
                             "convert it")
        return engine.lower()
    if keys & SERVE_KEYS:
        raise SetupError(f"{path}: a serving config whose keys ({', '.join(sorted(keys & SERVE_KEYS))}) vLLM and "
                         f"SGLang both take: check the command that runs it, a file holding `vllm serve --config "
                         f"{path.name}` or `python -m sglang.launch_server --config {path.name}`")
    return None


def read(path: str | Path, dp: int | None = None, release=None) -> Reading:
    """The Reading of one file, by the reader of its stack; `dp` (--dp): the data-parallel ranks when the file
    leaves them to the launch (torchtitan's data_parallel_shard_degree -1); `release` (serving_versions.Version,
    check's --server): the serving engine release a command is for, given to that engine's reader (its ENGINE)
    where it is not the release the reader follows (its FLAGS_OF)."""
    why = not_a_file(path)
    if why:
        raise SetupError(f"{why}: give the path of your config or launch script")
    p = Path(path)
    text = p.read_text(encoding="utf-8", errors="replace")
    kind = kind_of(p, text)
    reader = import_module(f"{__package__}.{kind}")
    if release is not None and getattr(reader, "ENGINE", None) == release.engine and release.version != reader.FLAGS_OF:
        return reader.read(p, text, dp, release)  # (the reader's own release needs no other flags)
    return reader.read(p, text, dp)


def names_deepspeed(r: Reading, ds) -> None:
    """`r` (TrainingArguments, axolotl) runs DeepSpeed with config `ds`, whose bf16/fp16 block and ZeRO decide: noted
    when no DeepSpeed config is read with it."""
    def note(readings):
        if not any(_names_file(o, ds) for o in readings):
            r.not_modelled.append(f"deepspeed = {ds!r}: its config decides precision and ZeRO: pass it to check too")
    r.together.append(note)


def _names_file(r: Reading, path) -> bool:
    """Whether `r` was read from the file `path` names (the same file, else the same file name: a path in a config
    is relative to where the run starts, not to here)."""
    import os

    mine, other = _file(r), str(path)
    try:
        return os.path.samefile(mine, other)
    except OSError:
        return os.path.basename(mine) == os.path.basename(other)


def model_identity(ref: str) -> str:
    """What a model reference names, to compare two: a catalog model's hub id (its name without one), a hub id (in
    any case, as the Hub takes them), or a config.json's real path."""
    import os

    from ..models.resolve import locate, serving_ref

    found = locate(ref)
    return os.path.realpath(found.path) if found.kind == "file" else serving_ref(ref).lower()


def _same_model(r: Reading, ref: str) -> bool | None:
    """Whether --model `ref` is the model `r` names; None when the file's model cannot be found here."""
    from ..errors import TrainfitError

    if ref == r.model:
        return True
    if r.same_model is not None:
        return r.same_model(ref)
    wanted = model_identity(ref)  # (a bad --model: its own error)
    try:
        return model_identity(r.model) == wanted
    except TrainfitError:
        return None


def _file(r: Reading) -> str:
    return r.source.split(" ")[0]


def combine(readings: list[Reading], model: str | None = None) -> tuple[str, dict]:
    """(model, settings) of several files read together (a ds_config.json with its TrainingArguments): a setting two
    files give differently is an error; `model` (--model) names the model when no file does, and another model than
    the files name is an error (one they name that is not found here: --model names it, with a note)."""
    serving = [r for r in readings if r.values.get("mode") == "serve"]
    if serving and len(serving) < len(readings):
        train = next(r for r in readings if r.values.get("mode") != "serve")
        raise SetupError(f"{_file(train)} is a training config and {_file(serving[0])} a serving command: they "
                         "describe different jobs: check them separately")
    for r in readings:
        together, r.together = r.together, []
        for f in together:
            f(readings)
    values: dict = {}
    owner: dict = {}
    for r in readings:
        for k, v in r.values.items():
            if k in values and values[k] != v:
                raise SetupError(f"{owner[k]} sets {k.replace('_', '-')} = {values[k]!r}, {r.source} sets {v!r}: make "
                                 "them agree")
            values[k], owner[k] = v, r.source
    named = {r.model for r in readings if r.model}
    if model is None:
        if len(named) > 1:
            raise SetupError(f"the files name different models ({', '.join(sorted(named))}): pass --model")
        if not named:
            raise SetupError(f"{', '.join(_file(r) for r in readings)} names no model: pass --model (a catalog name, a "
                             "config.json or a hub id)")
        model = named.pop()
    for r in readings:
        if not r.model:
            continue
        same = _same_model(r, model)
        if same is False:  # as a conflicting --dp (cli/check.py request_of)
            raise SetupError(f"--model {model}: the files say {r.model}: drop --model or fix them")
        if same is None:
            r.not_modelled.append(f"model {r.model!r}: not found here: read as --model {model}")
    return model, values
