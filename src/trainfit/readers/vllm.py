"""A `vllm serve MODEL --flag value ...` command line. vLLM cannot be installed here, so its flags are parsed with an
argparse parser built from vLLM 0.33's EngineArgs fields (engine/arg_utils.py: each field is its flag with dashes;
the ones plan/emit_vllm.py writes and the ones below), as `vllm serve` takes them: the model positional or --model;
a command for an older listed release keeps only the flags that release's own parser takes (read's `release`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import SetupError
from . import Gone, Reading
from .cmdline import (config_file, config_flags, human_readable_int, leftover_flags, parse_flags, release_flags, split,
                      yaml_config)

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
# --kv-cache-dtype: the CacheDType values (config/cache.py, "auto" apart) trainfit models; vLLM has no float32 KV
# cache (CacheDType: auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2, ... at vllm-project/vllm 002f10e0)
KV = {"fp8": "fp8", "fp8_e4m3": "fp8", "bfloat16": "bf16", "float16": "fp16"}
NO_EFFECT = ("host", "port", "served-model-name", "api-key", "tokenizer", "trust-remote-code", "download-dir",
             "revision", "seed", "disable-log-requests", "disable-log-stats", "uvicorn-log-level", "chat-template",
             "load-format", "config-format", "tokenizer-mode", "generation-config", "enable-auto-tool-choice",
             "tool-call-parser", "reasoning-parser")
EFFECT = {"enable-prefix-caching": "time: cached prefixes skip prefill; no effect on the KV budget",
          "no-enable-prefix-caching": "time", "disable-prefix-caching": "time",
          "enable-chunked-prefill": "time and the activation peak",
          "disable-chunked-prefill": "time and the activation peak",
          "cpu-offload-gb": "less GPU memory: weights offloaded to the host",
          "data-parallel-size": "more GPUs: each replica as estimated",
          "enable-expert-parallel": "memory and time of the MoE experts",
          "compilation-config": "time and CUDA-graph memory",
          "optimization-level": "CUDA-graph memory and time: -O0 compiles nothing and captures no CUDA graphs, -O1 "
                                "piecewise graphs only, -O2 (the default, as estimated) and -O3 full and piecewise "
                                "(config/vllm.py:132-144, :435)",
          "max-cudagraph-capture-size": "CUDA-graph memory: graphs captured up to this many tokens",
          "cudagraph-capture-sizes": "CUDA-graph memory: the token counts captured",
          "distributed-executor-backend": "none on one node", "limit-mm-per-prompt": "memory of the encoder cache",
          "config": "none of its keys is read: vLLM opens the file only when written `--config FILE` "
                    "(vllm/utils/argparse_utils.py:371); write it so"}
# (vLLM 0.33.0: engine/arg_utils.py:1402 --enable-prefix-caching, :1785 --enable-chunked-prefill, :1824-1828
# --cudagraph-capture-sizes / --max-cudagraph-capture-size (config/compilation.py:651, :695), :1911
# --optimization-level. A bool field's flag is argparse's BooleanOptionalAction (:384-386), which the parser registers
# as its EnableDisableAction (vllm/utils/argparse_utils.py:179): --enable-X pairs with --disable-X, and --no-enable-X
# is still taken, out of the help (:120-145); -O N, -ON and -O=N are --optimization-level N (:395-406).)

# flags of the older releases trainfit models (data/servers.toml) that vLLM 0.33.0's serve parser does not have: it
# stops at them ("unrecognized arguments", exit 2; none is the prefix of a 0.33.0 flag, which argparse's allow_abbrev
# would take). Each: its effect in the releases that take it (serving_versions.parser_takes), the last listed one's
# lines, and what, if anything, replaced it. `trainfit check --server vllm==VERSION` reads a file for that release.
_STOPS = "`vllm serve` stops at it (unrecognized arguments); "
GONE = {
    "swap-space": Gone("host memory under the V0 engine only: CPU swap space for preempted "
                       "sequences; the V1 engine allocates none (v1/engine/core.py:267 num_cpu_blocks = 0)",
                       _STOPS + "0.14.1 takes it (engine/arg_utils.py:914; config/cache.py:58), and its V1 engine "
                       "allocates no swap (v1/engine/core.py:267 num_cpu_blocks = 0); nothing replaced it"),
    "max-seq-len-to-capture": Gone("CUDA-graph memory and time: the V0 engine's graphs up to this "
                                   "length", _STOPS + "0.10.1 takes it (engine/arg_utils.py:503-504), read only by "
                                   "the V0 engine's CUDA graphs; nothing replaced it: 0.33.0's graphs are sized in "
                                   "tokens per step, --max-cudagraph-capture-size (engine/arg_utils.py:1827)"),
    "max-num-partial-prefills": Gone("", _STOPS + "0.19.0 takes it (engine/arg_utils.py:1221-1222), "
                                     "which its V1 scheduler does not read (only the ROCm AITER attention backend, "
                                     "v1/attention/backends/rocm_aiter_fa.py:476); nothing replaced it"),
    "cuda-graph-sizes": Gone("CUDA-graph memory and time: the batch sizes captured",
                             _STOPS + "0.11.0 takes it (engine/arg_utils.py:893-894); 0.33.0's are "
                             "--cudagraph-capture-sizes and --max-cudagraph-capture-size (engine/arg_utils.py:"
                             "1824-1828)")}


# keys that tell a bare `vllm serve --config` YAML from SGLang's (readers.kind_of): serve flags of vLLM 0.33's parser
# (entrypoints/common/cli_args.py make_arg_parser :431, EngineArgs.add_cli_args engine/arg_utils.py:959) that SGLang
# 0.5.23's ServerArgs parser lacks (srt/arg_groups/fields/*.py; both parsers' option strings compared) and that no
# TrainingArguments or TRL config field is named (seed, log-level: both; vLLM reads underscores as dashes)
CONFIG_KEYS = frozenset({"max-model-len", "gpu-memory-utilization", "max-num-seqs", "max-num-batched-tokens",
                         "enforce-eager", "block-size", "enable-prefix-caching", "enable-chunked-prefill",
                         "kv-cache-memory-bytes", "speculative-config", "compilation-config", "limit-mm-per-prompt",
                         "distributed-executor-backend", "enable-expert-parallel", "generation-config",
                         "enable-auto-tool-choice"})
# EngineArgs' other short aliases (vLLM 0.33.0 engine/arg_utils.py:1241 -dp, :1306 -ep, :1891 -cc; -O is rewritten
# before argparse: flexible)
SHORT = {"-dp": "data-parallel-size", "-ep": "enable-expert-parallel", "-cc": "compilation-config"}
# the serve flags vLLM 0.33 adds as store_true, with no --no- form (engine/arg_utils.py:1294-1299, :1919-1930;
# entrypoints/common/cli_args.py:444-448, :465-469); its other switches are EngineArgs / FrontendArgs bool fields,
# each with a --no- form (argparse.BooleanOptionalAction: engine/arg_utils.py:384-386, registered as
# EnableDisableAction: vllm/utils/argparse_utils.py:120-145, :179), except the --disable-X spelling of an enable_X
# field (INVERSE)
STORE_TRUE = ("data-parallel-multi-port-external-lb", "disable-log-stats", "aggregate-engine-logging", "headless",
              "grpc")
# the --disable-X spellings of EngineArgs' enable_X fields among the flags above: EnableDisableAction gives them no
# --no- form (only the field's own flag gets one: argparse_utils.py:129-142)
INVERSE = ("disable-prefix-caching", "disable-chunked-prefill")
FLAGS_OF = "0.33.0"  # the vLLM release whose serve parser this reader follows (data/servers.toml's default)
ENGINE = "vllm"  # the engine whose releases check's --server gives this reader (readers.read)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--dtype")
    # (-tp, -pp: EngineArgs.add_cli_args' short aliases, engine/arg_utils.py parallel_group)
    p.add_argument("--tensor-parallel-size", "-tp", type=int)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int)
    # (EngineArgs reads it with human_readable_int_or_auto: -1 or auto, vLLM's auto-fit, engine/arg_utils.py
    # _compute_kwargs; vllm/utils/argparse_utils.py)
    p.add_argument("--max-model-len", type=lambda v: -1 if v.strip().lower() in ("auto", "-1") else
                   human_readable_int(v))
    # (--max-num-batched-tokens too: engine/arg_utils.py _compute_kwargs, name in ("max_num_batched_tokens",
    # "kv_cache_memory_bytes") -> human_readable_int)
    p.add_argument("--max-num-batched-tokens", type=human_readable_int)
    for f in ("max-num-seqs", "block-size"):
        p.add_argument(f"--{f}", type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--kv-cache-memory-bytes", type=human_readable_int)  # (a size: EngineArgs' human_readable_int)
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--quantization", "-q")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction)  # (a bool field: --no-enforce-eager too)
    p.add_argument("--speculative-config", "-sc")  # (-sc: vLLM 0.33.0 engine/arg_utils.py:1866)
    return p


def account(r: Reading, rest: list[str], no_effect, effect, aliases: dict | None = None,
            abbreviated=None, gone: dict | None = None, engine: str = "", release=None) -> None:
    """Each flag left over listed as without effect, as not modelled (what it changes), as one the engine's parser
    refuses, or as unknown; `aliases`: other spellings of those flags. `gone`: flags the parser of `engine` (its name
    and release, "vLLM 0.33.0") refuses that another release took (readers.Gone): one line each among what the
    engine's own parser says (Reading.warned), or, in a file for `release` (another release, whose parser took the
    flag: cmdline.release_flags kept only those), read with their effect there. `abbreviated`:
    where the engine's argparse takes a flag's unique prefix for the flag (allow_abbrev), the whole flags trainfit
    knows: an unknown one that begins exactly one of them is named with it (trainfit reads whole names only: the
    engine's other flags, which it does not list, decide the prefix)."""
    known = sorted({*abbreviated, *no_effect, *effect, *(aliases or {})}) if abbreviated is not None else ()
    for k, v in leftover_flags(rest):
        k = (aliases or {}).get(k, k)
        if k in (gone or {}) and release is not None:
            g = gone[k]
            if g.sized:  # (a knob is a count; the leftover flag's value is its text)
                r.sizes(g.sized, f"--{k}", int(v) if str(v).isdigit() else v, g.then)
            else:
                r.skip(f"--{k}", v, g.then or "no effect on memory or time")
        elif k in (gone or {}):
            r.warned.append(f"--{k}: {engine} has no such flag: {gone[k].why}")
        elif k in no_effect:
            r.skip(f"--{k}", v, "no effect on memory or time")
        elif k in effect:
            r.skip(f"--{k}", v, effect[k])
        else:
            name = k if k.startswith("-") else f"--{k}"
            whole = [f for f in known if f.startswith(k)] if not k.startswith("-") else []
            r.unknown.append(name if len(whole) != 1 else
                             f"{name} (the engine reads a unique prefix as its flag: write --{whole[0]} for trainfit "
                             "to read it)")


def flexible(argv: list[str], source: str) -> list[str]:
    """argv as vLLM's FlexibleArgumentParser.parse_args rewrites it before argparse (vllm/utils/argparse_utils.py):
    a flag's underscores are dashes up to its first '.' (--max_model_len is --max-model-len), and the dotted form of
    a JSON flag (--speculative-config.model M, --x.y=v, --x.list+ a,b) is merged into one --x '{...}' at the end, each
    value JSON, else a human-readable int, else text; -ON, -O=N and -O N (N of 0-3) are --optimization-level N
    (vLLM 0.33.0 argparse_utils.py:395-406)."""
    out: list[str] = []
    dicts: dict[str, dict] = {}
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            arg = "--" + head.replace("_", "-") + dot + tail + eq + value
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
            continue
        elif arg == "-O" and i + 1 < len(argv) and argv[i + 1] in ("0", "1", "2", "3"):
            out.append("--optimization-level")
            continue
        if not (arg.startswith("-") and "." in arg.partition("=")[0]):
            out.append(arg)
            continue
        key, eq, value = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise SetupError(f"{source}: {key} expects a value after it, as vLLM reads it")
            value, skip = argv[i + 1], True
        if key.endswith("+"):
            key, value = key[:-1], json.dumps(value.split(","))
        name, *keys = key.split(".")
        try:
            v = json.loads(value)
        except ValueError:
            try:
                v = human_readable_int(value)
            except (ValueError, argparse.ArgumentTypeError):
                v = value
        node = dicts.setdefault(name, {})
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        last = keys[-1] if keys else ""
        node[last] = node[last] + v if isinstance(v, list) and isinstance(node.get(last), list) else v
    for name, d in dicts.items():
        out += [name, json.dumps(d)]
    return out


def model_first(argv: list[str]) -> list[str]:
    """`vllm serve ... --model M ...` as vLLM runs it: `vllm serve M ...` (vllm/utils/argparse_utils.py:324-354)."""
    for i, w in enumerate(argv):
        if w == "--model" and i + 1 < len(argv):
            return [argv[i + 1], *argv[:i], *argv[i + 2:]]
        if w.startswith("--model="):
            return [w.partition("=")[2], *argv[:i], *argv[i + 1:]]
    return argv


def with_config(argv: list[str], path: Path, needs_model: bool = True) -> tuple[list[str], Path | None]:
    """(argv with the keys of the YAML that `--config FILE` names, the file), as vLLM's FlexibleArgumentParser pulls
    them in before parsing (vllm/utils/argparse_utils.py:371-372, _pull_args_from_config :516-604, load_config_file
    :606-673): each key is its flag (underscores read as dashes later, :374-394), true a bare flag, false the flag's
    --no- form where it has one (else dropped), a list its items, a mapping JSON, else the value as text; placed after
    the model and before the command line's flags, which win (argparse keeps the last). Only the word `--config`
    pulls a file in (:371): `--config=FILE` is left to argparse, which reads nothing from it (EFFECT). `needs_model`
    False: a config file read by itself (`check serve.yaml`), whose model --model may give."""
    # (one file: :551; a name after it: :554-557; .yaml or .yml: :633-637)
    got = yaml_config(argv, path, "vLLM")
    if got is None:
        return argv, None
    found, data = got
    i = argv.index("--config")
    # (:654-658: false the --no-KEY form only where the parser has that option string)
    keys = config_flags(data, lambda k, v: [f"--{k}"] if v else [f"--no-{k}"] if "_" not in str(k)
                        and k not in STORE_TRUE + INVERSE else [])
    rest = argv[:i] + argv[i + 2:]
    if rest and not rest[0].startswith("-"):  # the model on the command line (after model_first): it stays first
        return [rest[0], *keys, *rest[1:]], found
    if "--model" not in keys and not needs_model:
        return [*keys, *rest], found
    if "--model" not in keys:  # (:574-583)
        raise SetupError(f"{path}: no model: vLLM needs it after `vllm serve` or as 'model:' in {found.name}: add it")
    j = keys.index("--model")  # (the file's model: put first, where the parser takes the model whatever follows)
    return [keys[j + 1], *keys[:j], *keys[j + 2:], *rest], found


def read(path: Path, text: str, dp: int | None = None, release=None) -> Reading:
    """`release` (serving_versions.Version): the vLLM release the command is for, when not FLAGS_OF: its parser's
    flags taken (cmdline.release_flags), each read as this reader reads it. NB: a flag both take is read as FLAGS_OF
    reads it (-O N before 0.14 was --compilation-config's level, not --optimization-level: both CUDA graphs and
    time), and before 0.10 a dotted --x.y is unrecognized (0.8.5 vllm/utils.py:1340-1375), which is not checked."""
    bare = config_file(path)  # the --config YAML by itself: as `vllm serve --config FILE` reads it
    argv = ["--config", str(path)] if bare else split(text, str(path), lambda w: w == "serve")[1]
    argv, config = with_config(model_first(argv), path, needs_model=not bare)
    stopped: list[str] = []
    if release is not None:
        argv, stopped = release_flags(argv, release, lambda head: head.replace("_", "-") if head[:2] == "--" else head)
    flags = f"vLLM {release.version if release else FLAGS_OF}"
    r = Reading(f"{path} ({flags} serve flags, argparse{f'; --config {config}' if config else ''})")
    r.warned += stopped
    p = parser()
    a, rest = parse_flags(p, flexible(argv, str(path)), path)
    r.model = a.model_tag or a.model  # (the positional first: vllm/entrypoints/cli/serve.py:55-57)
    r.set("mode", "serve", "vllm serve")
    r.set("server", "vllm", "vllm serve")
    if a.dtype and a.dtype != "auto":  # auto: the checkpoint's dtype, as trainfit's serve default (config/model.py)
        if a.dtype not in DTYPES:
            raise SetupError(f"--dtype {a.dtype}: use auto, bfloat16, float16 or float32")
        r.set("precision", DTYPES[a.dtype], "--dtype")
    if a.max_model_len == -1:  # v1/core/kv_cache_utils.py _auto_fit_max_model_len (original_max_model_len == -1)
        r.skip("--max-model-len", "auto", "memory: vLLM lowers the length to what the KV cache holds where the "
               "model's own does not fit; trainfit estimates at the model's length (give a length to set one)")
        a.max_model_len = None
    for name, flag in (("tp", "tensor-parallel-size"), ("pp", "pipeline-parallel-size"),
                       ("max_model_len", "max-model-len"), ("max_num_batched_tokens", "max-num-batched-tokens"),
                       ("max_num_seqs", "max-num-seqs"), ("block_size", "block-size"),
                       ("gpu_memory_utilization", "gpu-memory-utilization"), ("quant", "quantization"),
                       ("kv_cache_memory", "kv-cache-memory-bytes")):
        v = getattr(a, flag.replace("-", "_"))
        if v is not None:
            r.set(name, v, f"--{flag}")
    if a.kv_cache_dtype and a.kv_cache_dtype != "auto":
        if a.kv_cache_dtype not in KV:
            raise SetupError(f"--kv-cache-dtype {a.kv_cache_dtype}: trainfit models auto, {', '.join(KV)}")
        r.set("kv_dtype", KV[a.kv_cache_dtype], "--kv-cache-dtype")
    if a.enforce_eager:
        r.set("enforce_eager", True, "--enforce-eager")
    if a.speculative_config:
        try:
            spec = json.loads(a.speculative_config)
        except ValueError:
            raise SetupError(f"--speculative-config {a.speculative_config!r}: not JSON") from None
        if not isinstance(spec, dict):  # EngineArgs.speculative_config: dict[str, Any] | None (engine/arg_utils.py)
            raise SetupError(f"--speculative-config {a.speculative_config!r}: not a JSON object; give one, e.g. "
                             "'{\"model\": \"meta-llama/Llama-3.2-1B\", \"num_speculative_tokens\": 4}'")
        if spec.get("model"):  # (SpeculativeConfig.model: str | None, vllm/config/speculative.py; Reading.set checks)
            r.set("draft_model", spec["model"], "--speculative-config model")
        for k, v in spec.items():
            if k != "model":
                r.skip(f"--speculative-config {k}", v, "time only (the draft's memory is modelled)")
    # `vllm serve`'s parser takes any unambiguous prefix: FlexibleArgumentParser leaves allow_abbrev at argparse's
    # default (vLLM 0.33.0 vllm/utils/argparse_utils.py:170-181; the serve subparser, entrypoints/cli/serve.py:164-170)
    account(r, rest, NO_EFFECT, EFFECT, SHORT, abbreviated=whole_flags(p), gone=GONE, engine=f"vLLM {FLAGS_OF}",
            release=release)
    return r


def whole_flags(p: argparse.ArgumentParser) -> list[str]:
    """The whole names of the flags `p` reads (without their dashes). NB: argparse lists a parser's options only
    through its private _actions (no public accessor)."""
    return [o[2:] for a in p._actions for o in a.option_strings if o.startswith("--")]
