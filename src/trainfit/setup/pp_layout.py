"""Megatron's custom pipeline layout (--pp-split "Et*3|(tt|)*29,m|L", Megatron-LM's --pipeline-model-parallel-layout):
which layers each (virtual) pipeline stage builds.

megatron-core 0.16.1 megatron/core/transformer/pipeline_parallel_layer_layout.py:
  parse_str_to_list (:283-318): commas are cosmetic; "(...)*n" then "x*n" are unrolled; "|" splits stages; E =
      embedding, L = loss, t = a decoder (transformer) layer, m = an MTP layer.
  __init__ (:24-83): the stages' count is pp × vpp; stage i is virtual stage i // pp of pipeline rank i % pp.
  validate_layer_layout (:85-150): E first and once, L last and once, as many t as num_layers, as many m as
      mtp_num_layers, every m after every t, in the last virtual stage of its rank, all on one rank.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SetupError

CHARS = {"E": "embedding", "L": "loss", "t": "decoder layer", "m": "MTP layer"}


def is_layout(v: str) -> bool:
    """A --pp-split value that is a layout string (it splits stages with '|')."""
    return isinstance(v, str) and "|" in v


@dataclass(frozen=True)
class Layout:
    text: str
    stages: tuple[str, ...]  # each stage's layer characters, in Megatron's order (virtual stage-major)

    def ranks(self, pp: int) -> list[str]:
        """Every pipeline rank's layer characters over its virtual stages (stage i is on rank i % pp)."""
        return ["".join(self.stages[i] for i in range(r, len(self.stages), pp)) for r in range(pp)]

    def decoder_layers(self, pp: int) -> list[int]:
        return [r.count("t") for r in self.ranks(pp)]

    def mtp_layers(self, pp: int) -> list[int]:
        return [r.count("m") for r in self.ranks(pp)]

    def vpp(self, pp: int) -> int:
        return len(self.stages) // pp

    def check(self, pp: int, vpp: int, layers: int, mtp: int) -> None:
        """Megatron's checks (pipeline_parallel_layer_layout.py:38-44, 85-150), one line each with the fix."""
        n = len(self.stages)
        if n % pp:
            raise SetupError(f"--pp-split {self.text!r} has {n} stages, not a multiple of --pp {pp} "
                             "(pipeline_parallel_layer_layout.py:39-44): give pp × vpp stages split by '|'")
        if n // pp != vpp:
            raise SetupError(f"--pp-split {self.text!r}: {n} stages over --pp {pp} are {n // pp} virtual stages per "
                             f"rank; set --vpp {n // pp} (transformer_config.py:1344-1350)")
        flat = "".join(self.stages)
        if flat[:1] != "E" or flat.count("E") != 1 or flat[-1:] != "L" or flat.count("L") != 1:
            raise SetupError(f"--pp-split {self.text!r}: the embedding E must come first and the loss L last, once "
                             "each (pipeline_parallel_layer_layout.py:93-103)")
        if flat.count("t") != layers:
            raise SetupError(f"--pp-split {self.text!r} places {flat.count('t')} decoder layers (t); the model has "
                             f"{layers} (pipeline_parallel_layer_layout.py:104-108)")
        if flat.count("m") != mtp:
            raise SetupError(f"--pp-split {self.text!r} places {flat.count('m')} MTP layers (m); the run has "
                             f"{mtp} (--mtp-layers; pipeline_parallel_layer_layout.py:109-113)")
        if "m" in flat and "t" in flat[flat.index("m"):]:
            raise SetupError(f"--pp-split {self.text!r}: MTP layers (m) must follow every decoder layer "
                             "(pipeline_parallel_layer_layout.py:114-118)")
        holders = [r for r in range(pp) if any("m" in self.stages[i] for i in range(r, n, pp))]
        last_virtual = range(n - pp, n)
        if mtp and (len(holders) != 1 or any("m" in self.stages[i] for i in range(n) if i not in last_virtual)):
            raise SetupError(f"--pp-split {self.text!r}: all MTP layers go in one rank's last virtual stage "
                             "(pipeline_parallel_layer_layout.py:119-131)")


# A layout names each of the model's layers once and '|' between its pp x vpp stages: the unrolled text is refused
# past this many characters before it is built ("(t|)*1000000000" would otherwise build gigabytes of text first)
MAX_UNROLLED = 2**20


def parse(text: str) -> Layout:
    """The layout of `text` (Megatron's parse_str_to_list, pipeline_parallel_layer_layout.py:285-318)."""
    s = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = _unroll(pattern, s, text)
    bad = sorted({c for c in s if c not in CHARS and c != "|"})
    if bad:
        raise SetupError(f"--pp-split {text!r}: {''.join(bad)!r} is not a layout character; use E (embedding), L "
                         "(loss), t (decoder layer), m (MTP layer), '|' between stages, (..)*n and x*n repeats "
                         "(e.g. Et*3|(tt|)*29,m|L)")
    return Layout(text, tuple(s.split("|")))


def _unroll(pattern: str, s: str, text: str) -> str:
    """`s` with each repeat of `pattern` unrolled, refused once the result would pass MAX_UNROLLED characters."""
    size = len(s)

    def repeat(m: re.Match) -> str:
        nonlocal size
        unit, count = m.group(1), m.group(2)
        size += len(unit) * (int(count) if len(count) <= 18 else MAX_UNROLLED + 1) - len(m.group(0))
        if size > MAX_UNROLLED:
            shown = text if len(text) <= 40 else text[:40] + "…"
            raise SetupError(f"--pp-split {shown!r} unrolls to more than {MAX_UNROLLED:,} characters; a layout names "
                             "each of the model's layers once, with '|' between its pp x vpp stages: check the repeat "
                             "counts (e.g. Et*3|(tt|)*29,m|L)")
        return unit * int(count)

    return re.sub(pattern, repeat, s)
