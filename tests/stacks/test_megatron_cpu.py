"""trainfit's analytic `--stack megatron --device cpu` against Megatron-Core's own GPT training step, run here.

bench/targets/megatron_cpu.py builds megatron.core's GPTModel with the local layer spec (no TE/apex), wraps it in Megatron's
DistributedDataParallel (contiguous grad buffer) and distributed optimizer, and runs one step after two warm-ups
on CPU ranks (gloo), recording each rank's live tensor bytes per phase (trainfit.measure.dist_peak). The analytic
estimate of the same shapes must be within TOL of the measured peak of every phase on the busiest rank.
The step clips as Megatron does by default (clip_grad 1.0, Setup.grad_clip_norm): its own ChainedOptimizer takes
the norm and scales the main grads, marked as a "clip" phase; the clip's temporaries, the gradients its norm reads
and its kernels' count per tensor must be the analytic's (analytic/grad_clip.py megatron_clip).
"""
from __future__ import annotations


import pytest

pytest.importorskip("megatron.core")

from bench.targets import megatron_cpu

TOL = 0.01  # measured: tp 1 within 0.1 % per phase (bench/results/megatron_cpu.md)
PHASES = {"forward_end": "forward", "backward": "backward", "optimizer_step": "optimizer"}


def check(name: str, tol: float = TOL, max_grad_norm: float | None = None) -> None:
    ranks = megatron_cpu.measure(name, max_grad_norm=max_grad_norm)
    mem = megatron_cpu.analytic(name, max_grad_norm=max_grad_norm)
    for ana, meas in PHASES.items():
        m = max(r["phase_peaks"][meas] for r in ranks)
        assert mem.phases[ana] == pytest.approx(m, rel=tol), (name, ana, mem.phases[ana], m)
    # the model states: Megatron's own param / grad buffers (the analytic weights and gradients per rank)
    assert mem.weights == ranks[0]["param_buffer"] and mem.gradients == ranks[0]["grad_buffer"]
    check_clip(name, ranks, mem, max_grad_norm)


def check_clip(name: str, ranks: list[dict], mem, max_grad_norm: float | None) -> None:
    """Megatron's own clip on every rank: the fp32 main grads its norm reads (TP rank 0 reads them all: the fp32 grad
    buffer, mem.gradients / 4 elements, in megatron_tensors' tensors), the clip_grad it ran with (Setup.grad_clip_norm)
    and its temporaries (the "clip" phase's high point over the live bytes at its start) to the byte."""
    from trainfit.analytic.memory import train_memory
    from trainfit.analytic.parallel.megatron import megatron_tensors

    spec, setup = megatron_cpu.spec_and_setup(name, max_grad_norm=max_grad_norm)
    temporaries = train_memory(spec, setup).detail["grad_clip_temporaries"]
    rank0 = ranks[0]["clip"]
    assert rank0["dtype"] == "torch.float32" and rank0["elements"] == mem.gradients / 4
    assert rank0["tensors"] == megatron_tensors(spec, spec.layers, True, True)
    assert all(r["clip"]["clip_grad"] == setup.grad_clip_norm for r in ranks)
    if setup.grad_clip_norm:
        assert rank0["norm"] > setup.grad_clip_norm  # the scale ran (clip_grads.py:173): its temporaries are counted
    measured = max(r["clip_peak"] - r["clip_at"] for r in ranks)
    assert measured == temporaries, (name, measured, temporaries)


def test_megatron_cpu_tp1_bf16():
    check("tp1-bf16")


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["tp1-fp32", "tp2-fp32", "tp2-bf16",
                                  # --loss-fusion native: megatron-core's torch.compile'd cross-entropy, built by
                                  # inductor for CPU (its backward's functional fp32 copy: analytic/megatron_loss.py)
                                  "tp1-bf16-ce-native", "tp2-bf16-ce-native"])
def test_megatron_cpu_heavy(name):
    check(name)


@pytest.mark.heavy
def test_megatron_cpu_max_grad_norm_zero_keeps_the_norm():
    """--max-grad-norm 0 (clip_grad 0): the ChainedOptimizer still takes the norm (its 0-d norms, their tensor and
    its norm beside the dummy buffer), the scale and its per-tensor product go."""
    check("tp1-bf16", max_grad_norm=0)
