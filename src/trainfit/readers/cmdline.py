"""A launch command line or shell script as argv: line continuations joined, comments and environment
assignments dropped, the arguments after the program (`marker`) returned with the launcher's own."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..errors import SetupError


def tokens(text: str, source: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise SetupError(f"{source}: cannot split the command line ({e}): check its quotes") from None


def split(text: str, source: str, marker) -> tuple[list[str], list[str]]:
    """(the launcher's tokens before the program, the program's arguments): `marker(token)` finds the program."""
    words = tokens(text, source)
    for i, w in enumerate(words):
        if marker(w):
            shell = next((x for x in words[i + 1:] if "$" in x), None)
            if shell is not None:
                raise SetupError(f"{source}: the command uses shell variables ({shell}): trainfit reads a command "
                                 "as written; print it expanded (put `echo` before the launcher, run the script) "
                                 "and check that")
            return words[:i], words[i + 1:]
    raise SetupError(f"{source}: no command found in it")


def named_file(name: str, script: Path, flag: str, tool: str) -> Path:
    """The file a command line's `flag` names: where `tool` opens it (from the directory the run starts in: here),
    else beside the script."""
    for p in (Path(name), script.parent / name):
        if p.is_file():
            return p
    raise SetupError(f"{script}: {flag} {name}: no such file here or beside the script ({tool} opens it from where "
                     "the run starts): run check from there, or give the file's path")


def yaml_config(argv: list[str], script: Path, tool: str, any_case: bool = False) -> tuple[Path, dict] | None:
    """(the file, its mapping) of the `--config FILE` a serving engine's command line names (vLLM's and SGLang's
    parsers: a .yaml or .yml mapping of flag names to values, one file; `any_case`: the suffix in any case, as
    SGLang's Path.suffix.lower()), None without one; each refusal one line."""
    if "--config" not in argv:
        return None
    if argv.count("--config") > 1:
        raise SetupError(f"{script}: --config given twice: {tool} reads one config file: keep one")
    i = argv.index("--config")
    if i == len(argv) - 1:
        raise SetupError(f"{script}: --config names no file: give the YAML after it")
    found = named_file(argv[i + 1], script, "--config", tool)
    suffix = argv[i + 1].split(".")[-1]
    if (suffix.lower() if any_case else suffix) not in ("yaml", "yml"):
        raise SetupError(f"{script}: --config {argv[i + 1]}: {tool} reads a .yaml or .yml config file only: convert it")
    import yaml

    try:
        data = yaml.safe_load(found.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError as e:
        raise SetupError(f"{found}: not valid YAML ({str(e).splitlines()[0]}): fix the file") from None
    if not isinstance(data, dict):
        raise SetupError(f"{found}: {tool}'s --config file is a YAML mapping of flag names to values (e.g. "
                         "'tensor-parallel-size: 2'): fix the file")
    return found, data


def config_file(path: Path) -> bool:
    """Whether `path` is a serving engine's --config YAML by itself rather than a command line (readers.kind_of
    sends one to a serving reader only by its keys)."""
    return path.suffix.lower() in (".yaml", ".yml")


def config_flags(data: dict, boolean) -> list[str]:
    """A --config YAML mapping as the flags the engine's parser reads (vLLM's load_config_file, SGLang's
    ConfigArgumentMerger alike: each key its flag, a list its items, a mapping JSON, else the value as text);
    `boolean(key, value)`: a true or false value's words, which the two engines spell differently."""
    flags: list[str] = []
    for k, v in data.items():
        if isinstance(v, bool):
            flags += boolean(k, v)
        elif isinstance(v, list):
            flags += [f"--{k}", *map(str, v)] if v else []
        else:
            flags += [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return flags


def launcher_world(before: list[str]) -> int | None:
    """torchrun's --nnodes × --nproc_per_node (either spelling, `=` or a separate value), None when not given."""
    opts: dict = {}
    for i, w in enumerate(before):
        if w.startswith("--"):
            k, eq, v = w[2:].partition("=")
            opts[k.replace("-", "_")] = v if eq else (before[i + 1] if i + 1 < len(before) else "")
    try:
        nproc = int(opts["nproc_per_node"]) if "nproc_per_node" in opts else None
        nodes = int(str(opts.get("nnodes", "1")).split(":")[-1])
    except ValueError:
        return None
    return None if nproc is None else nproc * nodes


def is_flag(word: str) -> bool:
    """Whether argparse reads `word` as an option rather than a value (a negative number is a value: neither engine's
    parser has an option that looks like one, argparse's _negative_number_matcher)."""
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit()


def release_flags(argv: list[str], release, name_of=lambda head: head) -> tuple[list[str], list[str]]:
    """(`argv` as the serve parser of `release` (serving_versions.Version) takes its flags, a line for each flag it
    stops at): a flag that parser has is kept, one it reads as the option it begins (allow_abbrev) is written as that
    option, and one it stops at (unrecognized, or ambiguous) is dropped with the values after it, said in one line
    with the listed releases that take it. `name_of(head)`: the option a flag's head (the word up to its first "="
    or ".") is written as, by the engine's own spelling rules (vLLM reads underscores as dashes)."""
    from ..serving_versions import parser_takes, releases_taking

    out, said, dropping = [], [], False
    for w in argv:
        if not is_flag(w):
            if not dropping:
                out.append(w)
            continue
        head = w.split("=", 1)[0].split(".", 1)[0] if w.startswith("--") else w.split("=", 1)[0]
        name = name_of(head)
        options = parser_takes(release, name)
        dropping = len(options) != 1
        if not dropping:  # (a short flag as written: -O3 is -O with its value)
            out.append(options[0] + w[len(head):] if w.startswith("--") else w)
            continue
        why = f"an ambiguous prefix of {', '.join(options)}" if options else "unrecognized arguments"
        takers = releases_taking(release.engine, name)
        said.append(f"{name}: {release.label} has no such flag: its parser stops at it ({why}); "
                    + (f"{', '.join(takers)} take{'s' if len(takers) == 1 else ''} it" if takers else
                       "no listed release takes it"))
    return out, said


def leftover_flags(rest: list[str]) -> list[tuple[str, object]]:
    """The (name, value) of each flag argparse left over (`--k=v`, `--k v`, a short `-k v`, or a bare switch: True),
    for the reader to map, list as not modelled, or name as unknown (a short flag keeps its one dash: `-x`)."""
    out: list = []
    for i, a in enumerate(rest):
        if is_flag(a):
            k, eq, v = (a[2:] if a.startswith("--") else a).partition("=")
            out.append((k, v if eq else (rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("-")
                                         else True)))
    return out


def human_readable_int(text: str) -> int:
    """vLLM's integer flags that take a size (--max-model-len): a plain integer, or one with a suffix, lowercase
    decimal (k, m, g, t: 25.6k = 25,600) or uppercase binary (K, M, G, T: 32K = 32,768; whole numbers only), as
    vllm/utils/argparse_utils.py human_readable_int reads it."""
    import argparse
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", text.strip())
    if not m or ("." in m[1] and not m[2].islower()):
        raise argparse.ArgumentTypeError(f"invalid integer {text!r} (e.g. 32768, 32k = 32,000, 32K = 32,768)")
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(float(m[1]) * scale[m[2]]) if m[2] else int(m[1])


def parse_flags(parser, argv: list[str], path) -> tuple:
    """(namespace, leftover words) of `argv` under the reader's argparse `parser`; a value that does not parse is one
    line naming argparse's own complaint (its usage text, which it prints before exiting, kept out of the way)."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_known_args(argv)
    except SystemExit:
        why = (err.getvalue().strip().splitlines() or ["?"])[-1]
        raise SetupError(f"{path}: a flag's value does not parse ({why}): fix it") from None
