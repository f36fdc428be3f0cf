"""`trainfit plan` prints, per plan, the step-time settings the search turned on as `trainfit estimate` flags
(report/plan.py run_flags): every switch a stack's [plan] table names and the searched MoE exchange settings
(plan/space.py TIMED), none by hand."""
import json
import shlex

from trainfit.cli import app
from trainfit.plan.search import timed_settings
from trainfit.plan.space import TIMED
from trainfit.report.plan import run_flags
from trainfit.setup import Setup
from trainfit.stacks import get_stack, names
from typer.testing import CliRunner


def test_every_planned_switch_is_printed():
    for name in names():
        for key in get_stack(name).facts.get("plan", {}).get("switches", {}):
            assert key in timed_settings(), (name, key)
    assert {a.name for a in TIMED} <= set(timed_settings())


def test_a_megatron_plan_prints_the_flags_estimate_takes_back():
    s = Setup(stack="megatron", precision="bf16-master", dp=2, tp=2, ep=2, zero=1, sequence_parallel=True,
              moe_dispatcher="deepep", overlap_moe_comm=True, tp_comm_overlap=True, overlap_param_gather=True,
              loss_fusion="te", grad_accum=4)
    flags = run_flags(s)
    assert flags == ("--moe-dispatcher deepep --overlap-moe-comm --tp-comm-overlap --loss-fusion te "
                     "--overlap-param-gather")
    # the same text on estimate's command line gives the plan's settings back
    out = CliRunner().invoke(app, ["estimate", "qwen3-30b-a3b", "--stack", "megatron", "--precision", "bf16-master",
                                   "--dp", "2", "--tp", "2", "--ep", "2", "--zero", "1", "--sequence-parallel",
                                   "--grad-accum", "4", *shlex.split(flags), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)["setup"]
    assert {k: got[k] for k in timed_settings()} == {k: getattr(s, k) for k in timed_settings()}
    # a plain plan prints nothing
    assert run_flags(Setup()) == ""
