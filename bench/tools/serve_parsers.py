"""The option strings of a listed serving release's own parser, written into data/serve_flags.json: the source of
serving_versions.parser_takes (what `trainfit check --server ENGINE==VERSION` reads a command with).

Each release's parser is built by its own code, in its own interpreter, and its options listed (argparse keeps them
only in the private _actions):
- vLLM: `vllm serve`'s parser, make_arg_parser (entrypoints/openai/cli_args.py up to 0.19, entrypoints/common/
  cli_args.py in 0.33) over FlexibleArgumentParser. That parser also takes two spellings before argparse sees them,
  in every listed release: `--config FILE` (0.8.5 vllm/utils.py:1348, 0.10.1 utils/__init__.py:1784, 0.11.0 :1866,
  0.14.1 utils/argparse_utils.py:223, 0.19.0 :232, 0.33.0 :371) and -O (rewritten: 0.8.5 vllm/utils.py:1362,
  0.10.1 utils/__init__.py:1805, 0.11.0 :1891, 0.14.1 argparse_utils.py:247, 0.19.0 :256, 0.33.0 :395): both added.
- SGLang: ServerArgs.add_cli_args over a plain argparse.ArgumentParser, as launch_server's prepare_server_args.

Neither engine is a dependency and neither imports on a machine without its GPU stack as it stands, so the probe
(a) takes vLLM's CPU platform (platforms/cpu.py CpuPlatform: EngineArgs' defaults build a DeviceConfig, which asks
the platform for its device type), (b) gives triton.runtime.cache the cache-folder helpers SGLang 0.4's utils import
from an older triton, and (c) with --stub-hf, replaces sglang.srt.hf_transformers_utils (0.4.3/0.4.4: it imports
transformers' AutoProcessor, which needs torchvision) by its one name server_args reads, check_gguf_file.
None of them adds or removes an option.

Unpack the wheel (pip download ENGINE==VERSION --no-deps; unzip) and its pure-Python requirements (pip install
--no-deps --target DEPS: for vLLM those bench/tools/vllm_scheduler_cpu.py lists, and jsonschema,
jsonschema-specifications, referencing, rpds-py, pydantic-extra-types, pycountry, mistral-common, tiktoken,
lm-format-enforcer, interegular; for SGLang 0.4 ipython, traitlets, orjson), then:

    python -m bench run serve_parsers --engine vllm --version 0.10.1 --path UNPACKED_WHEEL:DEPS [--stub-hf]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ABOUT = {"summary": "a listed vLLM/SGLang release's serve parser flags into data/serve_flags.json (needs its wheel)",
         "minutes": 1, "quick": None}

PROBE = r'''
import argparse, importlib, json, sys, types
engine, stub_hf = sys.argv[1], sys.argv[2] == "1"
if engine == "vllm":
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    platforms._current_platform = CpuPlatform()
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    for where in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make = importlib.import_module(where).make_arg_parser
            break
        except (ModuleNotFoundError, AttributeError) as e:
            if isinstance(e, ModuleNotFoundError) and not e.name.startswith("vllm"):
                raise
    p = make(FlexibleArgumentParser())
    pre = {"--config", "-O"}
else:
    try:
        import triton.runtime.cache as cache
        cache.default_cache_dir = cache.default_dump_dir = cache.default_override_dir = lambda: "/tmp"
    except ImportError:
        pass
    if stub_hf:
        m = types.ModuleType("sglang.srt.hf_transformers_utils")
        m.check_gguf_file = lambda *a, **k: False
        sys.modules[m.__name__] = m
    from sglang.srt.server_args import ServerArgs
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    pre = set()
print(json.dumps(sorted(({o for a in p._actions for o in a.option_strings} - {"-h", "--help"}) | pre)))
'''


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    p.add_argument("--version", required=True, help="the release, as data/servers.toml lists it")
    p.add_argument("--path", required=True, help="folders holding the unpacked package and its requirements")
    p.add_argument("--stub-hf", action="store_true", help="SGLang 0.4.3/0.4.4: stand in for hf_transformers_utils")
    a = p.parse_args(argv)
    from bench import ROOT
    from trainfit.serving_versions import release_key

    env = {**os.environ, "PYTHONPATH": a.path, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, "-c", PROBE, a.engine, "1" if a.stub_hf else "0"], env=env,
                          capture_output=True, text=True, cwd=a.path.split(os.pathsep)[0])
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return 1
    flags = json.loads(done.stdout.strip().splitlines()[-1])
    out = ROOT / "src" / "trainfit" / "data" / "serve_flags.json"
    table = json.loads(out.read_text())
    table.setdefault(a.engine, {})[a.version] = flags
    table[a.engine] = dict(sorted(table[a.engine].items(), key=lambda kv: release_key(kv[0])))
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{a.engine} {a.version}: {len(flags)} option strings -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
