"""A stack's facts as an earlier release of it had them (--stack-release): the stack's file pins one version
(`version`); its [releases."<name>"] tables list, for a published run made with an older checkout, only the facts
that differ there, each table with the commit or tag it was read at and its source. Every other fact is the pinned
version's. Used to model a published run with the code it ran (bench/targets/stacks_published.py), not to guess."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..errors import SetupError

# the fields a release table carries about itself, not facts
ABOUT = ("read_at", "about", "source")


def releases(stack) -> dict:
    """{release name: its table} of the stack's [releases]."""
    return {k: v for k, v in stack.facts.get("releases", {}).items() if isinstance(v, dict)}


def at_release(stack, facts_file: Path, release: str):
    """`stack` with the facts its release `release` changes (SetupError naming the known releases if none)."""
    table = releases(stack).get(release)
    if table is None:
        known = ", ".join(releases(stack)) or "none"
        raise SetupError(f"--stack-release {release!r} is not a release trainfit knows for --stack {stack.name} "
                         f"(known: {known}; stacks/{facts_file.name} [releases]); drop it to model {stack.name} "
                         f"{stack.version}")
    return _overlaid(stack.name, facts_file, release)


@lru_cache(maxsize=None)
def _overlaid(name: str, facts_file: Path, release: str):
    from . import _load  # (this module is imported by trainfit.stacks on demand)
    from dataclasses import replace

    base = _load(name, facts_file)
    table = releases(base)[release]
    facts = dict(base.facts)
    for key, fields in table.items():
        if key in ABOUT:
            continue
        if key not in facts:  # a release changes facts the pinned version has: a data bug, said by name
            raise LookupError(f"stacks/{facts_file.name} [releases.{release!r}.{key}]: no [{key}] to change")
        facts[key] = {**facts[key], **fields}
    return replace(base, version=f"{base.version} with {release}'s facts ({table['read_at']})", facts=facts)
