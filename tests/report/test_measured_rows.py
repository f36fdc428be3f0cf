"""A measured step in the terminal: its memory and time are the real step's, its FLOPs are not counted (the measure
engine leaves them 0: measure/runner.py to_estimate), so no FLOP row and no MFU reads as a measured 0."""
from __future__ import annotations


def test_a_measured_step_shows_no_zero_flops_or_mfu(cli):
    code, out, _ = cli("estimate", "tiny-llama", "--engine", "measure", "--device", "cpu", "--batch", "1",
                       "--seq", "32")
    assert code == 0
    assert "not counted by real steps" in out and "step time (measured)" in out and "tokens/s (measured here)" in out
    assert "MFU" not in out and "0 FLOP" not in out
    code, out, _ = cli("estimate", "tiny-llama", "--batch", "1", "--seq", "32", "--gpu", "H100-80GB")
    assert code == 0 and "step time (MFU" in out and "not counted" not in out  # (the analytic count and its MFU)


def test_a_measured_inference_step_renders(cli):
    """A measured prefill + decode (--mode infer --engine measure) has no capacities (largest batch, longest
    context: the analytic engine's): the table leaves them out; it raised a TypeError formatting None."""
    code, out, err = cli("estimate", "tiny-llama", "--mode", "infer", "--engine", "measure", "--device", "cpu",
                         "--batch", "1", "--seq", "32")
    assert code == 0 and "Traceback" not in err and "prefill time" in out and "largest batch" not in out


def test_a_sharded_trace_counts_the_ranks_flops_and_an_rl_trace_says_it_counts_none(cli):
    """The trace of one rank of a data-parallel step (--dp 2 --zero 3, trace/distributed.py) makes the one-GPU step's
    products on its own micro-batch (data parallelism replicates the compute), so it counts the one-rank trace's
    FLOPs; it showed 0 FLOP. The RL trace counts none (trace/rl.py): no row reads as a counted 0."""
    args = ("estimate", "tiny-llama", "--engine", "trace", "--batch", "1", "--seq", "32")
    code, sharded, _ = cli(*args, "--dp", "2", "--zero", "3")
    assert code == 0
    code, one, _ = cli(*args)
    row = [line for line in one.splitlines() if "FLOPs per step (fwd / bwd" in line]
    assert code == 0 and row and "0 / 0 / 0" not in row[0] and row[0] in sharded.splitlines()
    code, out, _ = cli("estimate", "tiny-llama", "--mode", "rl", "--engine", "trace", "--device", "cpu",
                       "--rl-algo", "grpo", "--rollout", "hf", "--prompt-len", "16", "--completion-len", "16")
    assert code == 0 and "not counted by this trace" in out and "0 FLOP" not in out
