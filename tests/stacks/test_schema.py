"""The stacks' facts files have one schema: every stack answers the common tables, every table holds a value and
the source it comes from, and every table is read by some module (a fact no code reads cannot change a number)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from trainfit.stacks import get_stack, names

SRC = Path(__file__).resolve().parents[2] / "src" / "trainfit"

# what every stack's file says: the code reads these for any --stack (Stack.fact raises when one is missing)
COMMON = {"optimizer_impl", "grad_clip", "mixed_precision", "loss", "norm", "recompute", "zero", "precision",
          "optimizers", "compile", "low_precision", "peft", "model", "features", "engines", "plan"}
# the ways a module reads a table: Stack.fact("t"), .facts["t"], .facts.get("t"), deepspeed's _fact(setup, "t")
READ = re.compile(r"""(?:fact\(|facts\[|facts\.get\(|_fact\(\w+,\s*)["']([a-z0-9_]+)["']""")


def _tables(name: str) -> dict:
    return get_stack(name).facts


def _read_tables() -> set[str]:
    return {m for p in SRC.rglob("*.py") for m in READ.findall(p.read_text())}


@pytest.mark.parametrize("name", names())
def test_common_tables(name):
    missing = COMMON - set(_tables(name))
    assert not missing, f"stacks/{name}.toml lacks {sorted(missing)}: add each with its value and source"


@pytest.mark.parametrize("name", names())
def test_each_table_has_a_value_and_a_source(name):
    data = tomllib.loads(Path(SRC / "stacks" / f"{name}.toml").read_text())
    assert all(isinstance(data.get(k), str) and data[k] for k in ("name", "version", "summary"))
    assert data["name"] == name
    for table, body in data.items():
        if not isinstance(body, dict):
            continue
        assert isinstance(body.get("source"), str) and body["source"].strip(), f"[{table}] has no source"
        values = {k: v for k, v in body.items() if k != "source"}
        assert values, f"[{table}] has a source but no value"


@pytest.mark.parametrize("name", names())
def test_every_table_is_read(name):
    read = _read_tables()
    unread = set(_tables(name)) - read
    assert not unread, f"stacks/{name}.toml: no module reads {sorted(unread)}; read them or remove them"


def test_read_pattern_finds_each_form():
    text = ('st.fact("zero", "stages"); s.facts["precision"]; f.facts.get("parallel", {}); '
            '_fact(setup, "sub_group_size"); stack.fact(\'compile\')')
    assert READ.findall(text) == ["zero", "precision", "parallel", "sub_group_size", "compile"]
