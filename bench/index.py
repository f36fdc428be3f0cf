"""The index of runnable benchmarks: every module of bench's sub-packages that declares ABOUT.

ABOUT = {"summary": one line of what it measures, "minutes": rough wall time on 2 CPU cores (GPU modules: on one
GPU), "quick": the arguments of its quick variant (a list), or None where it has none}. A module's kind is its
sub-package (KINDS); its name, what `python -m bench run NAME` takes, is its file name. Read with ast, so listing
imports none of them.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

KINDS = ("targets", "gpu", "studies", "anchors", "tools")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    summary: str
    minutes: float
    quick: tuple[str, ...] | None

    @property
    def module(self) -> str:
        return f"bench.{self.kind}.{self.name}"


def about(path: Path) -> dict | None:
    """The module's ABOUT constant, or None if it declares none (a data or helper module)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ABOUT" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def entries() -> list[Entry]:
    out = []
    for kind in KINDS:
        for path in sorted((HERE / kind).glob("*.py")):
            a = about(path)
            if a is not None:
                quick = a["quick"]
                out.append(Entry(path.stem, kind, a["summary"], a["minutes"], None if quick is None else tuple(quick)))
    return out


def find(name: str) -> Entry | None:
    return next((e for e in entries() if e.name == name), None)
