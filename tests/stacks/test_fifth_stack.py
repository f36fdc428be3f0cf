"""The stack seam, proved: a fifth stack made only of its own files (a facts file and a rules module in a folder
of $TRAINFIT_STACK_PATH, found by name as the four built-in stacks are) is estimated, planned beside hf and refused
through the CLI, with no other change to trainfit.

The stack, "five", is the HF Trainer's step with fewer settings: ZeRO 0 or 3, amp-bf16 or bf16, no torch.compile,
none of the HF step's add-ons, and a rule that is code (its rules module: at most 8 micro-batches a step). The
analytic layer needs no module of its own for it: every analytic fact comes from its facts file."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainfit.stacks import PATH_VARIABLE, get_stack, names


RULES = '''
def refuse(setup):
    if setup.grad_accum > 8:
        return f"--grad-accum {setup.grad_accum}: --stack five accumulates at most 8 micro-batches a step"
    return None
'''


def _replace_table(text: str, table: str, body: str) -> str:
    """`text` with TOML table [table]'s lines (to the next table) replaced by `body`."""
    pattern = re.compile(rf"^\[{table}\]\n.*?(?=^\[|\Z)", re.S | re.M)
    assert pattern.search(text), table
    return pattern.sub(lambda _: f"[{table}]\n{body}\n\n", text, count=1)


def five_facts() -> str:
    from importlib import resources

    text = resources.files("trainfit.stacks").joinpath("hf.toml").read_text()
    text = re.sub(r'^name = "hf"$', 'name = "five"', text, flags=re.M)
    text = re.sub(r'^summary = ".*"$', 'summary = "the HF Trainer step, ZeRO 0/3, amp-bf16 or bf16 only"', text,
                  flags=re.M)
    src = 'source = "tests/stacks/test_fifth_stack.py"'
    for table, body in {
        "zero": f"stages = [0, 3]\n{src}",
        "precision": f'policies = ["amp-bf16", "bf16"]\n{src}',
        "compile": f'supported = false\nwhy = "five runs eagerly"\n{src}',
        "features": f"runs = []\n{src}",
        "engines": f'runs = []\nranks = false\nwhy = "five is a test stack with no step of its own"\n{src}',
        "plan": f'precisions = ["amp-bf16"]\nrecomputes = ["none", "full"]\n{src}',
    }.items():
        text = _replace_table(text, table, body)
    return text


@pytest.fixture
def five(tmp_path, monkeypatch):
    (tmp_path / "five.toml").write_text(five_facts())
    (tmp_path / "five.py").write_text(RULES)
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path))
    return tmp_path


def test_found_by_name(five):
    assert names()[-1] == "five" and get_stack("five").zero_stages == (0, 3)
    assert get_stack("five").rules is not None


def test_unknown_without_its_folder(cli):
    code, _, err = cli("estimate", "tiny-llama", "--stack", "five")
    assert code == 2 and "choose one of: hf, torchtitan, megatron, deepspeed" in err


def test_estimate(five, cli):
    code, out, err = cli("estimate", "tiny-llama", "--stack", "five", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["setup"]["stack"] == "five" and got["memory"]["peak"] > 0
    # its ZeRO-3 over 2 ranks shards what one rank holds
    code, out3, err = cli("estimate", "tiny-llama", "--stack", "five", "--dp", "2", "--zero", "3", "--json")
    assert code == 0, err
    assert json.loads(out3)["memory"]["peak"] < got["memory"]["peak"]


def test_plan_beside_hf(five, cli):
    code, out, err = cli("plan", "tiny-llama", "--gpu", "H100-80GB", "--gpus", "8", "--stacks", "hf,five", "--json",
                         "--top", "50")
    assert code == 0, err
    plans = json.loads(out)
    stacks = {c["setup"]["stack"] for c in plans["candidates"]}
    assert stacks == {"hf", "five"}
    five_plans = [c["setup"] for c in plans["candidates"] if c["setup"]["stack"] == "five"]
    assert {s["zero"] for s in five_plans} <= {0, 3} and {s["precision"] for s in five_plans} == {"amp-bf16"}
    assert {s["recompute"] for s in five_plans} <= {"none", "full"}


@pytest.mark.parametrize("args, message", [
    (("--dp", "2", "--zero", "2"), "--zero 2 is not run by --stack five (it runs ZeRO stages 0, 3)"),
    (("--precision", "bf16-master"), "--precision bf16-master is not run by --stack five (it runs amp-bf16, bf16)"),
    (("--compile",), "--compile is not modelled for --stack five: five runs eagerly; drop --compile, or use --stack "
                     "hf or torchtitan"),
    (("--quant", "nf4", "--lora-rank", "8"), "--quant: --stack five does not load bitsandbytes-quantised models; use "
                                             "--stack hf"),
    (("--grad-accum", "16"), "--grad-accum 16: --stack five accumulates at most 8 micro-batches a step"),
    (("--engine", "trace"), "it does not for --stack five (five is a test stack with no step of its own)"),
])
def test_refusals(five, cli, args, message):
    code, _, err = cli("estimate", "tiny-llama", "--stack", "five", *args)
    assert code == 2 and message in " ".join(err.split()), err


def test_plan_refuses_what_it_does_not_run(five, cli):
    code, _, err = cli("plan", "tiny-llama", "--gpu", "H100-80GB", "--gpus", "8", "--stacks", "five", "--zero", "1,2")
    assert code == 2
    assert "--zero: none of the values given is run by --stack five (it runs 0, 3)" in " ".join(err.split())
