"""A fact corrected in a stack's facts file changes the number: the tables the analytic models read
(stacks/deepspeed.toml, stacks/megatron.toml) are the only place those facts live. Each test edits one fact in the
loaded stack (monkeypatch, restored after) and checks the quantity it drives moves as the stack's code says."""
from __future__ import annotations

import pytest

from trainfit.analytic.parallel import deepspeed as ds
from trainfit.analytic.parallel import megatron as mg
from trainfit.setup import Setup
from trainfit.stacks import get_stack


@pytest.fixture
def facts(monkeypatch):
    def set_fact(stack: str, table: str, **fields):
        monkeypatch.setitem(get_stack(stack).facts, table, {**get_stack(stack).facts[table], **fields})
    return set_fact


def test_deepspeed_overlap_comm_stages(facts):
    """stage_1_and_2.py:3273-3278: with overlap_comm ZeRO-1/2 allocate a second ipg bucket."""
    setup = Setup(stack="deepspeed", dp=2, zero=2, precision="bf16-master")
    one = ds.ipg_buckets(setup, 2)
    facts("deepspeed", "overlap_comm", stages=[2, 3])
    assert ds.ipg_buckets(setup, 2) == 2 * one == 2 * 2 * get_stack("deepspeed").fact("reduce_bucket_size")


def test_deepspeed_grad_accum_dtype(facts):
    """grad_accum_dtype fp32: ZeRO-2's gradient partition and its buckets are fp32 (engine.py:1806-1807)."""
    setup = Setup(stack="deepspeed", dp=4, zero=2, precision="bf16-master")
    before = ds.deepspeed_states(1e9, 8e9, _bytes(setup), setup).states.gradients
    facts("deepspeed", "grad_accum_dtype", value="fp32")
    assert ds.deepspeed_states(1e9, 8e9, _bytes(setup), setup).states.gradients == 2 * before == 1e9 / 4 * 4


def test_deepspeed_stage0_fp32_grad_copies(facts):
    setup = Setup(stack="deepspeed", dp=2, zero=0, precision="bf16-master", device="cuda", optimizer="adamw")
    fused = ds.deepspeed_states(1e9, 8e9, _bytes(setup), setup).step_transient
    facts("deepspeed", "stage0_optimizer", fp32_grad_copies={"fused": 3, "unfused": 1})
    assert ds.deepspeed_states(1e9, 8e9, _bytes(setup), setup).step_transient == fused * 3 / 2 == 3 * 1e9 * 4


def test_megatron_distributed_optimizer_shards(facts):
    setup = Setup(stack="megatron", dp=4, cp=2, zero=1, precision="bf16-master")
    assert mg.shards(setup) == 8
    facts("megatron", "distributed_optimizer", shards=["dp"])
    assert mg.shards(setup) == 4


def test_megatron_grad_buffer_dtype(facts):
    """distributed_data_parallel.py:147: fp32 buffer when grad_reduce_in_fp32 (Megatron-LM's --bf16 default)."""
    setup = Setup(stack="megatron", precision="bf16-master")
    assert mg.bytes_per_param(setup)["gradients"] == 4
    facts("megatron", "grad_buffer", fp32_under=["fp32"])
    assert mg.bytes_per_param(setup)["gradients"] == 2


def _bytes(setup):
    from trainfit.analytic.precision import state_bytes
    return state_bytes(setup)
