"""Per-rank measurement under torch.distributed's own launcher (issue 7).

`measure_distributed(spec, setup, nproc)` runs

    python -m torch.distributed.run --nproc-per-node N --standalone [launcher args] -m trainfit.measure.worker JOB

and returns one `RankResult` per rank (rank order). We do no process management of our own beyond starting
the launcher and waiting for it: the launcher starts, watches and stops the workers (when one fails it
terminates the others), and its rendezvous options pass through unchanged for several nodes
(`launcher_args=["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "host:29500", ...]`, in which
case `--standalone` is not added); see docs/distributed.md. Each worker (trainfit.measure.worker) runs the
standard step under the strategy for `setup.zero` (trainfit.step.strategy) and measures its own peak,
step time and time in collectives; rank 0 gathers and writes the JSON that we read back.

Failures: a rank that raises (an out-of-memory error included) writes its rank, error type and message;
we raise `DistributedRunError` naming the first failed rank (by rank number) and its error. The launcher
stops the other ranks; a parent-side timeout (default 600 s + 60 s per rank) kills the launcher's whole
process group, so nothing hangs. A multi-node run reports only the ranks of the node that runs this
function (the error files are local); the launcher's own summary names the failed rank on its node.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import EngineUnavailableError, SetupError, TrainfitError
from ..setup import Setup
from ..spec import ModelSpec
from .runner import MeasureResult

# launcher options that say the user set up the rendezvous himself (then no --standalone)
_RDZV_OPTS = ("--nnodes", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend",
              "--master-addr", "--master_addr", "--standalone")


class DistributedRunError(TrainfitError):
    """A rank failed (exception or out of memory), or the launcher did not finish in time."""

    def __init__(self, message: str, failures: list[dict] | None = None, log: str = ""):
        super().__init__(message)
        self.failures = failures or []
        self.log = log


class LauncherError(DistributedRunError):
    """torch.distributed.run failed and no rank reported an error."""


@dataclass
class RankResult(MeasureResult):
    """A `MeasureResult` for one rank, plus where it ran and its communication figures."""

    rank: int = 0
    world_size: int = 1
    host: str = ""
    comm_seconds: float = 0.0  # time with at least one collective in flight during one (profiled) step
    comm_calls: dict = field(default_factory=dict)  # backend work records by name ("gloo:all_reduce": 12)
    comm_buffers: int = 0  # DDP's gradient bucket buffers (resident, inside `peak` and `baseline`)
    other_resident: int = 0  # resident at the step start besides weights, states, inputs, buckets (FSDP2 buffers)
    strategy: str = ""

    def to_dict(self) -> dict:
        return {"rank": self.rank, "host": self.host, "peak": self.peak, "peak_phase": self.peak_phase,
                "phase_peaks": dict(self.phase_peaks), "weights": self.weights,
                "optimizer_states": self.optimizer_states, "gradients": self.gradients,
                "activations": self.activations, "inputs": self.inputs, "comm_buffers": self.comm_buffers,
                "other_resident": self.other_resident,
                "baseline": self.baseline, "step_seconds": self.step_seconds, "comm_seconds": self.comm_seconds,
                "comm_calls": dict(self.comm_calls), "tokens_per_second": self.tokens_per_second,
                "params": self.params, "device": self.device, "strategy": self.strategy}


_FIELDS = set(RankResult.__dataclass_fields__)


def _rank_result(d: dict) -> RankResult:
    return RankResult(**{k: v for k, v in d.items() if k in _FIELDS}, rss_peak=None)


def launcher_command(nproc: int, job_path: str, launcher_args: Sequence[str] = ()) -> list[str]:
    args = list(launcher_args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if not any(a.split("=")[0] in _RDZV_OPTS for a in args):
        cmd.append("--standalone")
    # --monitor-interval: how soon the launcher notices a dead worker and stops the others
    if not any(a.split("=")[0] in ("--monitor-interval", "--monitor_interval") for a in args):
        cmd += ["--monitor-interval", "0.2"]
    return cmd + args + ["-m", "trainfit.measure.worker", job_path]


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _launch(spec, setups, nproc, steps, warmup, dev, launcher_args, timeout, progress, env) -> list:
    """One torch.distributed.run of the job: the ranks' results, or a one-line DistributedRunError."""
    with tempfile.TemporaryDirectory(prefix="trainfit-dist-") as d:
        job = {"spec": spec, "setups": list(setups), "steps": steps, "warmup": warmup, "device": dev, "dir": d,
               "out": os.path.join(d, "ranks.json"), "timeout": max(30, int(timeout))}
        job_path = os.path.join(d, "job.pkl")
        with open(job_path, "wb") as f:
            pickle.dump(job, f)
        cmd = launcher_command(nproc, job_path, launcher_args)
        log_path = os.path.join(d, "launcher.log")
        penv = {**os.environ, **(env or {})}
        penv.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        penv.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=penv, start_new_session=True)
            rc = _wait(proc, timeout, os.path.join(d, "progress"), progress)
        failures = []
        for name in sorted(os.listdir(d)):
            if name.endswith(".error.json"):
                with open(os.path.join(d, name)) as f:
                    failures.append(json.load(f))
        failures.sort(key=lambda x: x["rank"])
        log = _tail(log_path)
        if rc is None:
            ranks = ", ".join(str(x["rank"]) for x in failures)
            raise DistributedRunError(
                f"the {nproc}-process run did not finish within {timeout:.0f} s and was stopped"
                + (f" (failed rank(s): {ranks})" if ranks else "") + "; rerun with a larger timeout or a smaller setup",
                failures, log)
        if failures:
            first = failures[0]
            others = f" ({len(failures) - 1} other rank(s) failed too)" if len(failures) > 1 else ""
            which = f" (setup {first.get('run', 0) + 1} of {len(setups)})" if len(setups) > 1 else ""
            raise DistributedRunError(f"rank {first['rank']} failed{which}: {first['type']}: {first['error']}{others}",
                                      failures, log + "".join(_tail(os.path.join(d, f"rank{x['rank']}.log"))
                                                              for x in failures))
        out = job["out"]
        if rc != 0 or not os.path.exists(out):
            lines = [ln.strip() for ln in log.strip().splitlines() if ln.strip() and not set(ln.strip()) <= set("=-")]
            named = [ln for ln in lines if "error" in ln.lower() or "exitcode" in ln.lower()]
            raise LauncherError(f"torch.distributed.run exited with code {rc} and no rank reported an error: "
                                f"{(named or lines or ['no output'])[-1]}", failures, log)
        with open(out) as f:
            data = json.load(f)
    return data


def measure_distributed(
    spec: ModelSpec,
    setup: Setup,
    nproc: int,
    steps: int = 3,
    warmup: int = 2,
    device: str = "cpu",
    launcher_args: Sequence[str] = (),
    timeout: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    env: dict | None = None,
) -> list[RankResult]:
    """Run the standard step on `nproc` local processes (times the nodes in `launcher_args`) under the strategy
    for `setup.zero` and return each rank's result, in rank order (module docstring).

    `setup.dp` must be the total number of ranks (nproc x nodes); `device` "cpu" (gloo) or "cuda" (NCCL, one
    GPU per local rank). `progress(stage, i, n)` is called from this process as rank 0 advances.
    """
    return measure_distributed_many(spec, [setup], nproc, steps, warmup, device, launcher_args, timeout, progress,
                                    env)[0]


def measure_distributed_many(
    spec: ModelSpec,
    setups: Sequence[Setup],
    nproc: int,
    steps: int = 3,
    warmup: int = 2,
    device: str = "cpu",
    launcher_args: Sequence[str] = (),
    timeout: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    env: dict | None = None,
) -> list[list[RankResult]]:
    """`measure_distributed` for several setups in one launch (the same processes run them one after the other,
    each from a fresh model): one list of rank results per setup."""
    from ..step import stack_step

    if nproc < 1:
        raise SetupError(f"--nproc must be a positive integer, got {nproc}")
    multi_node = any(a.split("=")[0] in _RDZV_OPTS[:2] for a in launcher_args)
    for setup in setups:
        if setup.mode != "train":
            raise EngineUnavailableError("the distributed measure runs training steps; inference is measured on one process")
        if not multi_node and setup.dp != nproc:
            raise SetupError(f"--nproc {nproc} runs {nproc} data-parallel ranks: set --dp {nproc}")
        kit = stack_step(setup)
        if setup.ep > 1 and not getattr(kit, "EXPERT_PARALLEL", False):
            raise EngineUnavailableError(f"--ep {setup.ep}: the measure engine runs expert parallelism in "
                                         "torchtitan's and DeepSpeed's (AutoEP) own steps only (--stack torchtitan or "
                                         "deepspeed); use --engine analytic")
        kit.check_ranks(spec, setup)  # refused here, in one line, rather than by every rank
    try:
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover
        raise EngineUnavailableError(f"the distributed measure needs torch ({e})") from e
    dev = device.split(":")[0]
    if not dist.is_available():
        raise EngineUnavailableError("this torch build has no torch.distributed")
    if dev == "cpu" and not dist.is_gloo_available():
        raise EngineUnavailableError("--device cpu runs over gloo, which this torch build lacks")
    if dev == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
            raise EngineUnavailableError(f"--device cuda --nproc {nproc} needs {nproc} GPUs on this node")
    timeout = timeout if timeout is not None else 600 + 60 * nproc
    progress = progress or (lambda stage, i, n: None)
    try:
        data = _launch(spec, setups, nproc, steps, warmup, dev, launcher_args, timeout, progress, env)
    except LauncherError:
        # the launcher itself failed before any rank could report (e.g. its rendezvous on a busy machine): one
        # retry, since nothing of the job ran; a failure of the job is reported by its rank and not retried
        data = _launch(spec, setups, nproc, steps, warmup, dev, launcher_args, timeout, progress, env)
    return [[_rank_result(x) for x in sorted(run, key=lambda x: x["rank"])] for run in data]


def _wait(proc: subprocess.Popen, timeout: float, progress_path: str, progress) -> int | None:
    """Wait for the launcher, relaying rank 0's progress; on timeout stop its process group (SIGTERM, then
    SIGKILL after 10 s) and return None."""
    deadline = time.monotonic() + timeout
    seen = 0
    while True:
        try:
            rc = proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            rc = None
        try:
            with open(progress_path) as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for ln in lines[seen:]:
            stage, i, n = ln.split()
            progress(stage, int(i), int(n))
        seen = len(lines)
        if rc is not None:
            return rc
        if time.monotonic() > deadline:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return None


def to_estimates(results: list[RankResult], spec: ModelSpec, setup: Setup):
    """One measure-engine Estimate per rank (trainfit.measure.to_estimate), its records carrying the rank's
    extras."""
    from dataclasses import replace

    from .runner import to_estimate

    out = []
    for r in results:
        est = to_estimate(r, spec, setup)
        out.append(replace(est, detail=est.detail.with_records(
            rank=r.rank, host=r.host, comm_seconds=r.comm_seconds, comm_buffers=r.comm_buffers, strategy=r.strategy)))
    return out


def ranks_json(results: list[RankResult]) -> list[dict]:
    """The `ranks` list of `trainfit measure --nproc N --json`."""
    return [r.to_dict() for r in results]
