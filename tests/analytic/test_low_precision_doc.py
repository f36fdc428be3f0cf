"""docs/low-precision.md's Llama-3.1-8B table is the analytic engine's answer for each row, at the table's own
rounding: a model change that moves a row re-reads the table (before: the Megatron MXFP8 row kept 5.40 s after
TEMXCAST made it 5.50 s, and the torchtitan rows' reserved 38.3 GiB after FSDP2's copy-out blocks made it 37.3)."""
from __future__ import annotations

import pathlib
import re

import pytest

from trainfit import api

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "low-precision.md"
GIB = 2**30
GPUS = 8
# the caption's layouts: Megatron distributed optimizer, GBS 128, seq 8192, full recompute; torchtitan FSDP 8,
# seq 8192, per-op SAC, compile
LAYOUT = {"megatron": dict(dp=GPUS, zero=1, seq=8192, grad_accum=16, precision="bf16-master", recompute="full"),
          "torchtitan": dict(dp=GPUS, zero=3, seq=8192, recompute="op", compile=True)}
RECIPES = {  # the table's recipe column -> the settings it stands for
    "bf16": {},
    "delayed": dict(low_precision="delayed"),
    "tensorwise": dict(low_precision="tensorwise"),
    "blockwise": dict(low_precision="blockwise"),
    "rowwise": dict(low_precision="rowwise"),
    "rowwise_with_gw_hp": dict(low_precision="rowwise_with_gw_hp"),
    "mxfp8": dict(low_precision="mxfp8"),
    "tensorwise + --fp8-all-gather": dict(low_precision="tensorwise", fp8_all_gather=True),
    "nvfp4 + 1 first/1 last bf16": dict(low_precision="nvfp4", bf16_first_layers=1, bf16_last_layers=1),
    "nvfp4 + 5 last bf16 (`--stack-release 2026-08`)": dict(low_precision="nvfp4", bf16_last_layers=5,
                                                            stack_release="2026-08"),
}
HEADER = "| stack | recipe | GPU | weights GiB | activations GiB | peak GiB | reserved GiB | step s | tokens/s/GPU |"


def rows() -> list[list[str]]:
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2  # (past the separator)
    out = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip("|").split("|")])
    return out


def test_the_table_lists_rows():
    assert len(rows()) >= 10 and {r[0] for r in rows()} == set(LAYOUT)


@pytest.mark.parametrize("row", rows(), ids=lambda r: " ".join(r[:3]))
def test_each_row_is_the_estimate(row):
    stack, recipe, gpu, *shown = row
    e = api.estimate("llama-3.1-8b", gpu=gpu, stack=stack, **LAYOUT[stack], **RECIPES[recipe])
    m = e.memory
    computed = [f"{m.weights / GIB:.1f}", f"{m.activations / GIB:.1f}", f"{m.peak / GIB:.1f}",
                f"{m.reserved / GIB:.1f}", f"{e.time.step_seconds:.2f}", f"{e.time.tokens_per_second / GPUS:,.0f}"]
    assert shown == computed, f"docs/low-precision.md row {' | '.join(row[:3])}: re-read it"
    assert re.fullmatch(r"[\d,]+", shown[-1])


def test_the_json_fields_it_names_are_the_estimates():
    """`memory.X` in the text is a field of the estimate's --json memory (it named `memory.host`, which is not)."""
    fields = set(re.findall(r"`memory\.(\w+)`", DOC.read_text()))
    assert fields
    e = api.estimate("llama-3.2-1b", gpu="H100-80GB", stack="hf", offload="optimizer")
    memory = e.to_dict()["memory"]
    assert fields <= set(memory) and memory["host_memory"] > 0
