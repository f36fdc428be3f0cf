"""One seam per stack: no module compares a stack's name except the stack's own modules (its facts and rules,
its analytic model, its real step, its launch-config writers). Everywhere else a stack is asked for its facts
(trainfit.stacks.get_stack), so a fifth stack is its own files only (tests/stacks/test_fifth_stack.py)."""
from __future__ import annotations

import ast
from pathlib import Path

from trainfit.stacks import BUILT_IN

SRC = Path(__file__).resolve().parents[1] / "src" / "trainfit"

# settings whose values share a stack's name without naming a stack (RL's --rollout hf: the HF generate rollout)
NOT_A_STACK = {"rollout"}


def _own_module(rel: str) -> bool:
    """A stack's own modules: stacks/*, analytic/stacks/*, step/<stack>.py (and step/__init__.py, the lookup by
    name), plan/emit*.py (the launch-config writers)."""
    path = Path(rel)
    return (rel.startswith(("stacks/", "analytic/stacks/")) or path.match("plan/emit*.py")
            or (path.parent.name == "step" and path.stem in (*BUILT_IN, "__init__")))


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(BUILT_IN)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def _compared(node: ast.AST) -> str | None:
    """The attribute or variable a comparison reads (setup.rollout -> rollout), None for anything else."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)  # values["rollout"]
    return node.id if isinstance(node, ast.Name) else None


def stack_name_comparisons(source: str) -> list[int]:
    """Line numbers of the comparisons with a stack's name (==, !=, in, not in a literal holding one)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_compared(o) in NOT_A_STACK for o in operands):
            continue
        if any(_names(o) for o in operands):
            lines.append(node.lineno)
    return sorted(lines)


def offenders() -> dict[str, list[int]]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not _own_module(rel):
            found = stack_name_comparisons(path.read_text())
            if found:
                out[rel] = found
    return out


def test_no_module_compares_a_stack_name():
    found = offenders()
    assert not found, (f"these modules compare a stack's name: {found}; ask the stack instead "
                            "(stacks/<name>.toml facts, stacks.get_stack(name)), or move the rule into the stack's "
                            "own module")


def test_the_check_sees_each_form():
    """The forms the seam forbids are found, and RL's --rollout hf is not a stack."""
    src = ('if setup.stack == "hf": pass\n'
           'if stack in ("torchtitan", "x"): pass\n'
           'if "megatron" not in q.stacks: pass\n'
           'if name != "deepspeed": pass\n'
           'if setup.rollout != "hf": pass\n'
           'if values["rollout"] == "hf": pass\n'
           'if setup.mode == "train": pass\n')
    assert stack_name_comparisons(src) == [1, 2, 3, 4]
