"""--server ENGINE[==VERSION]: the serving engine and the version of it modelled (data/servers.toml lists each
engine's versions and the start-up facts that differ between them, with their sources; plain `vllm` / `sglang` is
the engine's `default`, its current release). The one parser of the setting's value; no torch."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .data import load_toml
from .errors import SetupError

ENGINES = ("vllm", "sglang")
NAMES = {"vllm": "vLLM", "sglang": "SGLang"}  # as the engines write their own names


@dataclass(frozen=True)
class Version:
    engine: str
    version: str
    facts: dict  # servers.toml [<engine>.versions."<version>"], values only

    def __getitem__(self, key):
        return self.facts[key]

    @property
    def label(self) -> str:
        """How a title names it: "SGLang 0.4.4", "vLLM 0.33.0"."""
        return f"{NAMES[self.engine]} {self.version}"


@lru_cache(maxsize=None)
def _table() -> dict:
    return load_toml("servers.toml")


@lru_cache(maxsize=None)  # (a few engines; servers.toml is read once, _table)
def versions(engine: str) -> tuple[str, ...]:
    """The listed releases of `engine`, newest first."""
    return tuple(sorted(_table()[engine]["versions"], key=release_key, reverse=True))


def release_key(version: str) -> tuple:
    """Orders "0.4.3" < "0.4.3.post4" < "0.4.4": numbers by value, a suffix after the release it follows."""
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in version.split("."))


def engine_of(value: str) -> str:
    """The engine a --server value names ("vllm==0.11.0" -> "vllm"), unchecked (parse checks)."""
    return value.split("==", 1)[0].strip().lower()


def parse(value: str) -> Version:
    """A --server value: ENGINE or ENGINE==VERSION; a VERSION of major.minor stands for the one listed release of
    it. SetupError naming the engines or the listed versions otherwise."""
    engine, _, wanted = value.partition("==")
    engine, wanted = engine.strip().lower(), wanted.strip()
    if engine not in ENGINES:
        raise SetupError(f"--server {value!r}: the engines are {', '.join(ENGINES)} (optionally ==VERSION, e.g. "
                         f"vllm=={_table()['vllm']['default']})")
    table = _table()[engine]
    listed = versions(engine)
    if "==" in value and not wanted:
        raise SetupError(f"--server {value!r}: name a version after == ({', '.join(listed)}) or drop it")
    if not wanted:
        wanted = table["default"]
    # (a prefix only for major.minor: 0.4.3 is not its 0.4.3.post4, whose fixes may move what it holds)
    match = [v for v in listed if v == wanted or (wanted.count(".") == 1 and v.startswith(wanted + "."))]
    if len(match) != 1:
        raise SetupError(f"--server {value!r}: trainfit models {engine} {', '.join(listed)} (data/servers.toml); "
                         f"choose one of them, or --server {engine} for {table['default']}")
    return Version(engine, match[0], table["versions"][match[0]])


def check(value: str) -> None:
    """The setting's value rule (settings.Meta.check)."""
    parse(value)


def of(setup) -> Version:
    return parse(setup.server)


@lru_cache(maxsize=None)
def _flag_table() -> dict:
    return json.loads(resources.files("trainfit.data").joinpath("serve_flags.json").read_text())


@lru_cache(maxsize=None)
def _option_strings(engine: str, version: str) -> frozenset[str]:
    return frozenset(_flag_table()[engine][version])


def parser_takes(release: Version, flag: str) -> tuple[str, ...]:
    """The option strings `release`'s own serve parser reads `flag` (written without "=value": --name, -x, -xVALUE)
    as (data/serve_flags.json, dumped from the release's parser by bench/tools/serve_parsers.py): the flag itself;
    else a two-letter option with its value attached (-O3); else for a --flag each option it begins (argparse's
    allow_abbrev, which neither engine's parser turns off: one is read as it, several refuse it as ambiguous);
    () where the parser stops at it ("unrecognized arguments")."""
    if has_flag(release, flag):
        return (flag,)
    options = _option_strings(release.engine, release.version)
    if not flag.startswith("--"):
        return (flag[:2],) if flag[:2] in options else ()
    return tuple(sorted(o for o in options if o.startswith(flag)))


def has_flag(release: Version, flag: str) -> bool:
    """Whether `release`'s own serve parser has the option `flag` itself (not as a prefix of another)."""
    return flag in _option_strings(release.engine, release.version)


def releases_taking(engine: str, flag: str) -> tuple[str, ...]:
    """The listed releases of `engine` whose parser has `flag` (has_flag), oldest first."""
    return tuple(v for v in reversed(versions(engine)) if flag in _option_strings(engine, v))


def vllm_shared(key: str):
    """A fact every listed vLLM version shares (servers.toml [vllm])."""
    return _table()["vllm"][key]


def suggestions() -> tuple[str, ...]:
    """ENGINE==VERSION for every listed version (the web form offers them beside the plain engines)."""
    return tuple(f"{e}=={v}" for e in ENGINES for v in versions(e))
