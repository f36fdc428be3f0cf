"""A `python -m sglang.launch_server --model-path M --flag value ...` or `sglang serve M --flag value ...` command
line (both parsed by prepare_server_args, SGLang 0.5.23 srt/server_args.py:668-696). SGLang cannot be installed here, so
its flags are parsed with an argparse parser built from SGLang 0.5.23's ServerArgs fields (the lines cited in
plan/emit_sglang.py: fields/model.py, parallel.py, schedule.py, exec_.py, spec.py); a command for an older listed
release keeps only the flags that release's own parser takes (read's `release`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SetupError
from . import Gone, Reading
from ..serving_versions import parser_takes
from .cmdline import config_file, config_flags, parse_flags, release_flags, split, yaml_config
from .vllm import DTYPES, account, whole_flags

KV = {"fp8_e4m3": "fp8", "fp8": "fp8", "bfloat16": "bf16", "bf16": "bf16"}
NO_EFFECT = ("host", "port", "served-model-name", "api-key", "tokenizer-path", "trust-remote-code", "download-dir",
             "revision", "random-seed", "log-level", "log-requests", "chat-template", "load-format",
             "enable-metrics", "reasoning-parser", "tool-call-parser")
# trainfit sizes these as SGLang does for the GPU (analytic/serving_sglang.py Knobs, plan/emit_sglang.py writes them):
# the value the estimate has is as modelled, another is not modelled (Reading.sizes): the knob and the effect
SIZED = {"chunked-prefill-size": ("chunked_prefill_size", "memory: a larger chunk, more activation memory and a "
                                  "smaller token pool"),
         "page-size": ("page_size", "memory: the KV pool's page rounding"),
         "cuda-graph-max-bs-decode": ("cuda_graph_max_bs", "memory: CUDA graphs captured up to this batch")}
EFFECT = {"max-running-requests": "time: the batch is capped", "max-total-tokens": "memory: the token pool capped",
          "dp-size": "more GPUs: each replica as estimated", "ep-size": "memory and time of the MoE experts",
          "enable-torch-compile": "time", "disable-radix-cache": "time only",
          "schedule-conservativeness": "time only", "attention-backend": "time",
          "cuda-graph-max-bs-prefill": "memory: the prefill CUDA graphs captured up to this many tokens",
          "cuda-graph-bs-decode": "memory: decode CUDA graphs captured at these batch sizes",
          "cuda-graph-bs-prefill": "memory: prefill CUDA graphs captured at these token counts",
          "cuda-graph-backend-decode": "memory: the decode CUDA graphs (disabled: none)",
          "cuda-graph-backend-prefill": "memory: the prefill CUDA graphs (disabled: none)",
          "cuda-graph-config": "memory: the CUDA graphs of each phase"}
# (the graph flags: SGLang 0.5.23 arg_groups/fields/exec_.py:606-647; a prefill max_bs is the prefill graphs' largest
# token count, arg_groups/cuda_graph_hook.py:74-75, :480-497)

# flags SGLang 0.5.23's parser stops at (argparse: "ambiguous option", exit 2): each is a prefix of two or more of its
# flags, which allow_abbrev cannot choose between. What replaced each, and the listed release that took it where one
# did
GONE = {"cuda-graph-max-bs": Gone("memory: CUDA graphs captured up to this batch",
                                  "its parser stops at it as a prefix of both --cuda-graph-max-bs-decode and "
                                  "--cuda-graph-max-bs-prefill (arg_groups/fields/exec_.py:629-634; ambiguous "
                                  "option); 0.4.4 takes it for the decode graphs (srt/server_args.py:907-912): write "
                                  "--cuda-graph-max-bs-decode", sized="cuda_graph_max_bs"),
        "cuda-graph-bs": Gone("CUDA-graph memory and time: the decode graphs' batch sizes",
                              "its parser stops at it as a prefix of both --cuda-graph-bs-decode and "
                              "--cuda-graph-bs-prefill (arg_groups/fields/exec_.py:640-647; ambiguous option); 0.4.4 "
                              "takes it for the decode graphs (srt/server_args.py:913-918): write "
                              "--cuda-graph-bs-decode"),
        "pp": Gone("", "its parser stops at it as a prefix of --pp-size, --pp-max-micro-batch-size and "
                   "--pp-async-batch-depth (arg_groups/fields/parallel.py:59-72; ambiguous option): write --pp-size")}
FLAGS_OF = "0.5.23"  # the SGLang release whose ServerArgs parser this reader follows (data/servers.toml's default)
ENGINE = "sglang"  # the engine whose releases check's --server gives this reader (readers.read)


# ServerArgs' other spellings of the flags EFFECT lists (--data-parallel-size / --dp-size, --expert-parallel-size /
# --ep / --ep-size: 0.5.23 arg_groups/fields/parallel.py:73-80, :281-288; --dp, the one flag it begins, by argparse's
# prefix matching)
ALIASES = {"data-parallel-size": "dp-size", "dp": "dp-size", "expert-parallel-size": "ep-size", "ep": "ep-size"}


# keys that tell a bare SGLang --config YAML from vLLM's (readers.kind_of): ServerArgs fields of SGLang 0.5.23, as
# their flags (srt/arg_groups/fields/model.py:51 model_path, :110 context_length; parallel.py:45 tp_size, :59 pp_size,
# :73 dp_size, :281 ep_size; schedule.py:27 mem_fraction_static, :31 max_running_requests, :39 max_total_tokens, :52
# chunked_prefill_size, :86 schedule_policy, :139 schedule_conservativeness, :143 page_size; memory.py:64
# disable_radix_cache; exec_.py:670 disable_cuda_graph, :691 enable_torch_compile; serving.py:32 tokenizer_path;
# device.py:47 random_seed; observability.py:70 enable_metrics; spec.py:31 speculative_algorithm, :36
# speculative_draft_model_path) that vLLM 0.33's serve parser lacks (both parsers' option strings compared) and that
# no TrainingArguments or TRL config field is named
CONFIG_KEYS = frozenset({"model-path", "tp-size", "pp-size", "dp-size", "ep-size", "context-length",
                         "mem-fraction-static", "max-running-requests", "max-total-tokens", "chunked-prefill-size",
                         "schedule-policy", "schedule-conservativeness", "page-size", "disable-radix-cache",
                         "disable-cuda-graph", "enable-torch-compile", "tokenizer-path", "random-seed",
                         "enable-metrics", "speculative-algorithm", "speculative-draft-model-path"})


# the words that start SGLang's server: `python -m sglang.launch_server`, and `sglang serve` (the sglang console script,
# sglang.cli.main:main, from SGLang 0.5.5 on: 0.5.23 cli/main.py:28-51)
LAUNCHERS = ("sglang.launch_server", "serve")


def launched(words: list[str]) -> bool:
    """Whether the command's words start SGLang's server."""
    return LAUNCHERS[0] in words or any(w.endswith("sglang") and n == "serve" for w, n in zip(words, words[1:]))


def serve_argv(argv: list[str], path: Path) -> list[str]:
    """The launch_server flags `sglang serve` passes on (0.5.23 cli/serve.py:181-192, _run_llm :97-106): its backend
    selector --model-type taken out (:30-59; auto picks the language-model server for a model that is not a diffusion
    one, :109-118), and a first argument that is not a flag read as --model-path (:62-66)."""
    kind, out, i = "auto", [], 0
    while i < len(argv):
        k, eq, v = argv[i].partition("=")
        if k != "--model-type":
            out.append(argv[i])
        elif eq:
            kind = v
        else:
            kind, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
        i += 1
    if kind not in ("auto", "llm"):
        raise SetupError(f"{path}: --model-type {kind!r}: trainfit estimates SGLang's language-model server only "
                         "(sglang serve's llm backend, cli/serve.py:144-157): give --model-type llm or auto (the "
                         "default) with a language model")
    return ["--model-path", *out] if out and not out[0].startswith("-") else out


def with_config(argv: list[str], path: Path) -> tuple[list[str], Path | None]:
    """(argv with the keys of the YAML that `--config FILE` names, the file), as SGLang 0.5.23 merges them before
    parsing (srt/server_args.py:682-689, utils/server_args_config_parser.py ConfigArgumentMerger): each key its flag as
    written (:198-210), true a bare flag and false nothing for a store_true flag, else `--key true|false` (:185-200), a
    list its items, a mapping JSON, else the value as text; the file's flags first and the command line's after them,
    which win (:98-106: argparse keeps the last)."""
    got = yaml_config(argv, path, "SGLang", any_case=True)  # (one file: :110-113; .yaml/.yml in any case: :155-162)
    if got is None:
        return argv, None
    found, data = got
    switches = {a.dest for a in parser()._actions if isinstance(a, argparse._StoreTrueAction)}
    keys = config_flags(data, lambda k, v: ([f"--{k}"] if v else []) if str(k).replace("-", "_") in switches
                        else [f"--{k}", str(v).lower()])
    i = argv.index("--config")
    return [*keys, *argv[:i], *argv[i + 2:]], found


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model")
    p.add_argument("--dtype")
    # ServerArgs' own spellings (--tensor-parallel-size, --tp-size: fields/parallel.py:45-51), and --tp:
    # launch_server's argparse takes any unambiguous prefix (allow_abbrev, argparse's default), and --tp-size is the
    # one flag --tp begins. Not --pp, which begins three (GONE)
    p.add_argument("--tensor-parallel-size", "--tp-size", "--tp", dest="tp_size", type=int)
    p.add_argument("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int)
    for f in ("context-length", *SIZED, "speculative-num-steps", "speculative-eagle-topk",
              "speculative-num-draft-tokens"):
        p.add_argument(f"--{f}", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--quantization")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-decode-cuda-graph", action="store_true")
    p.add_argument("--disable-prefill-cuda-graph", action="store_true")
    return p


def read(path: Path, text: str, dp: int | None = None, release=None) -> Reading:
    """`release` (serving_versions.Version): the SGLang release the command is for, when not FLAGS_OF: its parser's
    flags taken (cmdline.release_flags; --config only where it has one), each read as this reader reads it (NB: a
    flag both take is read as FLAGS_OF reads it)."""
    # (the --config YAML by itself: as `python -m sglang.launch_server --config FILE` reads it)
    before, argv = ([], ["--config", str(path)]) if config_file(path) else \
        split(text, str(path), lambda w: w in LAUNCHERS)
    launcher = "sglang serve" if before and before[-1].endswith("sglang") else LAUNCHERS[0]
    if launcher == "sglang serve":
        argv = serve_argv(argv, path)
    config, stopped = None, []
    if release is None or parser_takes(release, "--config") == ("--config",):
        argv, config = with_config(argv, path)
    if release is not None:
        argv, stopped = release_flags(argv, release)
        if launcher == "sglang serve" and not release["sglang_serve"]:
            stopped.insert(0, f"sglang serve: {release.label} has no such command (its package installs no "
                              "`sglang` program): run it as python -m sglang.launch_server")
    flags = f"SGLang {release.version if release else FLAGS_OF}"
    r = Reading(f"{path} ({flags} ServerArgs flags, argparse{f'; --config {config}' if config else ''})")
    r.warned += stopped
    p = parser()
    a, rest = parse_flags(p, argv, path)
    r.model = a.model_path
    r.set("mode", "serve", launcher)
    r.set("server", "sglang", launcher)
    if a.dtype and a.dtype != "auto":
        if a.dtype not in DTYPES:
            raise SetupError(f"--dtype {a.dtype}: use auto, bfloat16, float16 or float32")
        r.set("precision", DTYPES[a.dtype], "--dtype")
    for name, flag, v in (("tp", "--tp-size", a.tp_size), ("pp", "--pp-size", a.pp_size),
                          ("max_model_len", "--context-length", a.context_length),
                          ("mem_fraction_static", "--mem-fraction-static", a.mem_fraction_static),
                          ("quant", "--quantization", a.quantization)):
        if v is not None:
            r.set(name, v, flag)
    if a.kv_cache_dtype and a.kv_cache_dtype != "auto":
        if a.kv_cache_dtype not in KV:
            raise SetupError(f"--kv-cache-dtype {a.kv_cache_dtype}: trainfit models auto, {', '.join(KV)}")
        r.set("kv_dtype", KV[a.kv_cache_dtype], "--kv-cache-dtype")
    if a.disable_cuda_graph and release is None:  # (0.5.23's warning: a DeprecatedStoreTrueAction, arg_groups/
        # argparse_actions.py:95-100, its new_flag server_args.py:410-415; still both graphs off, arg_groups/
        # cuda_graph_hook.py:55-57)
        r.warned.append(f"SGLang {FLAGS_OF} warns: '--disable-cuda-graph' is deprecated and will be removed in a "
                        "future release. Use '--cuda-graph-backend-{decode,prefill}=disabled' instead.")
    if a.disable_cuda_graph or (a.disable_decode_cuda_graph and a.disable_prefill_cuda_graph):
        r.set("enforce_eager", True, "--disable-decode-cuda-graph")
    else:  # one kind of graphs off: trainfit's --enforce-eager turns off both
        for flag in ("disable-decode-cuda-graph", "disable-prefill-cuda-graph"):
            if getattr(a, flag.replace("-", "_")):
                r.skip(f"--{flag}", True, f"less memory: no {flag.split('-')[1]} CUDA graphs, which trainfit counts; "
                       "both flags together are --enforce-eager")
    for flag, (knob, effect) in SIZED.items():
        v = getattr(a, flag.replace("-", "_"))
        if v is not None:
            r.sizes(knob, f"--{flag}", v, effect)
    spec_flags = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")
    if a.speculative_algorithm:
        r.set("speculative_algorithm", a.speculative_algorithm.lower(), "--speculative-algorithm")
        if a.speculative_draft_model_path:
            r.set("draft_model", a.speculative_draft_model_path, "--speculative-draft-model-path")
        for flag in spec_flags:
            v = getattr(a, flag.replace("-", "_"))
            if v is not None:  # (Knobs' speculative_num_steps, ...: serving_sglang.py sizing)
                r.sizes(flag.replace("-", "_"), f"--{flag}", v,
                        "time; trainfit sizes the draft's buffers with SGLang's defaults")
    else:  # SGLang speculates only with an algorithm (arg_groups/speculative_hook.py: None runs no draft)
        for flag in ("speculative-draft-model-path",) + spec_flags:
            v = getattr(a, flag.replace("-", "_"))
            if v is not None:
                r.skip(f"--{flag}", v, "no effect without --speculative-algorithm (SGLang runs no draft)")
    # launch_server's parser takes any unambiguous prefix (argparse.ArgumentParser(prog="sglang serve"), allow_abbrev
    # left at its default: srt/server_args.py:679, prepare_server_args)
    account(r, rest, NO_EFFECT, EFFECT, ALIASES, abbreviated=whole_flags(p), gone=GONE, engine=f"SGLang {FLAGS_OF}",
            release=release)
    return r

