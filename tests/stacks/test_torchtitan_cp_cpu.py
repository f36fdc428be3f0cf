"""Whether torchtitan's context parallelism runs on CPU ranks (the trace and measure engines' only ranks): torch 2.13's
ring attention dispatches the CUDA SDPA kernels only (distributed/tensor/experimental/_context_parallel/
_attention.py:916-938: flash, memory-efficient, cuDNN), and CPU's flash kernel has no DTensor sharding strategy, so
two gloo ranks raise. This is why --cp is analytic only (engines.py); the test fails, and the refusal should be
revisited, the day torch runs it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.heavy
def test_torch_ring_attention_does_not_run_on_cpu_ranks():
    pytest.importorskip("torchtitan")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(HERE / "torchtitan_cp_cpu.py")], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln[:2] in ("0 ", "1 ")]
    assert len(lines) == 2, out.stdout + out.stderr
    for ln in lines:
        assert "error NotImplementedError" in ln and "_scaled_dot_product_flash_attention_for_cpu" in ln, ln
