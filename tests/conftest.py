"""Fixtures shared by the whole suite."""
import os
import sys

import pytest

# Under pytest-xdist (the README's `-n 2`) each worker runs torch on its share of the cores, cpu_count // workers
# threads, as the measure engine gives each rank of a multi-process step (trainfit/measure/distributed.py). Left
# alone, every worker runs OpenMP on all the cores: 2 workers x 2 threads on this 2-core machine, and OpenMP's threads
# spin-wait on each other across processes (tests/trace/test_qlora_vs_real.py + test_lora_vs_real.py on 2 workers
# here, runs interleaved: 38.4 / 36.8 s wall and 65 / 64 s of CPU with 1 thread each, 40.3 / 41.8 s and 72 / 74 s
# with 2; NB: measured beside another job's load, the gain on an idle machine may differ). xdist sets the count
# before it loads conftest
# (xdist/remote.py:418); the variable is set before torch loads OpenMP, and oneDNN's per-thread scratch (analytic/
# onednn.py cpu_threads) reads the same variable, so the engines and the real steps agree on the thread count.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1 and not os.environ.get("OMP_NUM_THREADS") and not os.environ.get("MKL_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    if "torch" in sys.modules:  # a plugin imported torch first: its OpenMP read the environment already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def cli(capsys):
    """Run `trainfit ARGS...` in-process as a user would: returns (exit code, stdout, stderr)."""
    from trainfit.cli import main

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main(list(args))
            raise SystemExit(0)
        out = capsys.readouterr()
        return e.value.code or 0, out.out, out.err

    return run
