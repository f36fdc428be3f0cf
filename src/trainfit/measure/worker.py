"""One rank of a distributed measurement (issue 7). Started by torch.distributed.run, never by hand:

    python -m torch.distributed.run --nproc-per-node N --standalone -m trainfit.measure.worker JOB.pkl

JOB.pkl (written by trainfit.measure.distributed) holds the ModelSpec, a list of Setups (run one after the other
in the same processes: the imports and the rendezvous, ~10 s a process on a busy 2-core machine, are paid once)
and the run options. For each setup, each rank:
1. sends its fd 1/2 to `<job dir>/rank<R>.log` (Kineto prints lines on fd 2; per-rank noise stays out of the
   user's terminal; the parent shows the log's tail only when something fails);
2. joins the process group (gloo on CPU, NCCL on CUDA; env:// rendezvous from the launcher);
3. builds the model with seed 0 (the same weights on every rank), wraps it for `setup.zero`
   (trainfit.step.strategy), makes its own batches (seed 1000 + rank), runs warm-up steps (at least 2:
   DDP rebuilds its buckets at the second step's forward, after which they are fixed);
4. measures one step's peak (CPU: trainfit.measure.cpu_peak, the same reconstruction as the one-process
   measure engine, rebuilt block by block (trainfit.measure.dist_peak: gloo frees some tensors in its own
   threads), with the profiler running from before the model is built; the step starts from the sum of what
   is resident (weights, optimizer state, inputs, DDP's buckets), as in the one-process engine; CUDA:
   max_memory_allocated after reset_peak_memory_stats), then one step under the profiler without
   memory to time its collectives, then `steps` timed steps;
5. sends its result to rank 0 (torch.distributed.gather_object), which writes the JSON: one list of rank
   results per setup.

A rank that fails writes `<job dir>/rank<R>.error.json` ({rank, type, error, traceback}) and exits 1 at once
(no barrier, no destroy_process_group, which could wait on the dead peers); the launcher then stops the
other ranks. `TRAINFIT_DIST_FAIL_RANK=R` (and optionally `TRAINFIT_DIST_FAIL_STAGE=build|warmup|peak`,
default peak) makes rank R raise there: the tests use it to check that nothing hangs.
"""
from __future__ import annotations

import datetime
import gc
import json
import math
import os
import pickle
import socket
import statistics
import sys
import traceback

# c10d collectives as they appear in the profiler: the c10d op dispatch ("c10d::allreduce_") and the
# backend's own work record ("gloo:all_reduce", "nccl:all_gather", ...), which spans the work from its
# enqueue to its completion.
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")


class InjectedFailure(RuntimeError):
    """Raised on purpose (TRAINFIT_DIST_FAIL_RANK) to test failure handling."""


def _maybe_fail(rank: int, stage: str) -> None:
    want = os.environ.get("TRAINFIT_DIST_FAIL_RANK")
    if want is not None and want != "" and int(want) == rank and os.environ.get("TRAINFIT_DIST_FAIL_STAGE", "peak") == stage:
        raise InjectedFailure(f"injected failure on rank {rank} at stage {stage!r} (TRAINFIT_DIST_FAIL_RANK)")


def _redirect(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _union_seconds(intervals: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e9


def comm_seconds(prof) -> tuple[float, dict[str, int]]:
    """Seconds of the step during which at least one collective was in flight (union of the intervals of the
    backend's work records, e.g. "gloo:all_reduce"), and how many of each kind ran."""
    from .cpu_peak import _walk

    work, ops, counts = [], [], {}
    for e in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        name = e.name
        if name.startswith(("gloo:", "nccl:")):
            work.append((e.start_time_ns, e.end_time_ns))
            counts[name] = counts.get(name, 0) + 1
        elif name.startswith("c10d::"):
            ops.append((e.start_time_ns, e.end_time_ns))
    # the backend's work records cover the whole collective; the dispatch op only its launch
    return _union_seconds(work or ops), counts


def run_rank(job: dict, setup, rank: int, world: int, local_rank: int, progress) -> dict:
    import torch
    import torch.distributed as dist

    from ..step import stack_step, strategy_name
    from .cpu_peak import START, batch_tensors, storage_bytes
    from .dist_peak import live_storage_ptrs, profiled
    from ..step.strategy import local, resident_tensors

    kit = stack_step(setup)
    run_step = kit.run_step

    spec, device = job["spec"], job["device"]
    dev_type = torch.device(device).type
    if dev_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    state: dict = {}
    grad_info: dict = {}

    def on_phase(name: str) -> None:
        if name == "optimizer":
            w = state["wrapped"]
            grad_info["bytes"] = storage_bytes([local(p.grad) for p in w.parameters() if p.grad is not None])
        _maybe_fail(rank, "peak" if name == "optimizer" else name)

    def build_and_warm_up():
        progress("build", 0, 1)
        _maybe_fail(rank, "build")
        torch.manual_seed(0)
        model = kit.build(spec, setup, device=device)
        state["wrapped"], state["optimizer"] = kit.wrap(model, setup, dev_type, local_rank)
        torch.manual_seed(1000 + rank)
        state["batches"] = kit.make_batches(spec, setup, device=device)
        warmup = max(2, job["warmup"])
        for i in range(warmup):
            _maybe_fail(rank, "warmup")
            run_step(state["wrapped"], state["optimizer"], state["batches"], setup)
            progress("warmup", i + 1, warmup)
        progress("peak", 0, 1)

    notes = [f"strategy: {strategy_name(kit, setup)}, {world} ranks, backend {dist.get_backend()}"] + \
        ([kit.NOTE] if kit.NOTE else [])
    if dev_type == "cpu":
        # The memory profiler runs from before the model is built, so that every block the step frees was born in
        # the session (DDP rebuilds its buckets and FSDP2 its buffers during the warm-up steps).
        def run(phase):
            build_and_warm_up()
            run_step(state["wrapped"], state["optimizer"], state["batches"], setup, phase)

        # a stack whose engine keeps every buffer as a Python-held tensor (no C++-held buckets, as DDP's Reducer)
        # says so (its python_held(setup): trainfit.step.deepspeed, .torchtitan): a block no live tensor holds at the
        # end was freed without a report, by a gloo worker thread dropping the collective's last reference
        # (dist_peak.analyse_blocks alive)
        alive = live_storage_ptrs if getattr(kit, "python_held", lambda s: False)(setup) else None
        pk, _ = profiled(run, on_phase, alive)
        step_peaks = {k: v for k, v in pk.phase_peaks.items() if k != START}
        read_baseline = pk.live_at("forward", 0)
        activations = pk.live_at("backward") - pk.live_at("forward")
        notes += pk.notes
        if pk.end != read_baseline:
            notes.append(f"live bytes after the step differ from its start by {pk.end - read_baseline} bytes")
    else:
        build_and_warm_up()
        baseline = torch.cuda.memory_allocated()
        peak, peak_phase, phase_peaks, activations = _cuda_peak(state["wrapped"], state["optimizer"],
                                                                state["batches"], setup, on_phase)
    progress("peak", 1, 1)
    wrapped, optimizer, batches = state["wrapped"], state["optimizer"], state["batches"]
    res = getattr(kit, "resident_tensors", resident_tensors)(wrapped, optimizer)
    seen: set = set()
    weights = storage_bytes(res["weights"], seen)
    states = storage_bytes(res["states"], seen)
    inputs = storage_bytes(batch_tensors(batches), seen)
    buckets = sum(t.numel() * t.element_size() for t in res["buckets"])
    kept = storage_bytes(res.get("gradients", []), seen)  # FSDP1's flat gradients, kept to the next forward
    other = 0
    if dev_type == "cpu" and (getattr(kit, "READ_BASELINE", False) or alive is not None):
        # the stack's engine keeps buffers no resident-tensor sum sees (trainfit.step.deepspeed's; torchtitan's
        # ExpertParallel keeps each MoE layer's permuted indices on its instance from one step's forward to the
        # next, distributed/expert_parallel.py:157-161, read back by _token_combine :168-173) and every buffer is a
        # Python-held tensor, so the blocks gloo freed unreported are closed by the alive analysis: the level read
        # from the session's allocation records is the measurement
        baseline, phase_peaks = read_baseline, step_peaks
        peak_phase = max(phase_peaks, key=phase_peaks.get)
        peak = phase_peaks[peak_phase]
    elif dev_type == "cpu":
        # The step's own curve is exact (births and deaths during the step); its starting level is the sum of what
        # is resident, as in the one-process engine. The level read from the session (`other_resident` = read -
        # summed) is a diagnostic: blocks that gloo frees in its threads without a report and whose address is
        # never reused stay in it (DDP's first buckets, released with the work that held them, 15 MB here).
        baseline = weights + states + inputs + buckets + kept
        other = read_baseline - baseline
        phase_peaks = {k: v - other for k, v in step_peaks.items()}
        peak_phase = max(phase_peaks, key=phase_peaks.get)
        peak = phase_peaks[peak_phase]
        if other:
            notes.append(f"{other} bytes live at the step start in the allocation records besides weights, optimizer "
                         "state, inputs and DDP buckets (frees made by process-group threads outside the profiler)")

    # one step under the profiler (no memory events) for the time spent in collectives
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev_type == "cuda" else [])
    with profile(activities=acts) as prof:
        run_step(wrapped, optimizer, batches, setup)
        if dev_type == "cuda":
            torch.cuda.synchronize()
    comm, comm_counts = comm_seconds(prof)
    del prof

    from .runner import timed_steps

    times = timed_steps(lambda: run_step(wrapped, optimizer, batches, setup), job["steps"], dev_type,
                        lambda i: progress("time", i + 1, job["steps"]))
    step = statistics.median(times) if times else 0.0
    tokens = setup.batch * setup.seq * setup.grad_accum
    params_local = sum(local(p).numel() for p in wrapped.parameters())
    return {
        "rank": rank, "world_size": world, "host": socket.gethostname(), "local_rank": local_rank,
        "peak": int(peak), "peak_phase": peak_phase, "phase_peaks": {k: int(v) for k, v in phase_peaks.items()},
        "weights": weights, "optimizer_states": states, "gradients": grad_info.get("bytes", 0),
        "activations": int(activations), "inputs": inputs, "comm_buffers": buckets, "baseline": baseline,
        "other_resident": other,
        "step_seconds": step, "step_times": times,
        "tokens_per_second": tokens / step if step > 0 else math.inf,
        "comm_seconds": comm, "comm_calls": comm_counts, "params": params_local,
        "device": "cpu" if dev_type == "cpu" else torch.cuda.get_device_name(), "strategy": strategy_name(kit, setup),
        "notes": notes,
    }


def _cuda_peak(model, optimizer, batches, setup, on_phase):
    import torch

    from ..step import run_step

    phase_peaks, marks, current = {}, [], {"name": "start"}

    def phase(name):
        prev = current["name"]
        phase_peaks[prev] = max(phase_peaks.get(prev, 0), torch.cuda.max_memory_allocated())
        on_phase(name)
        marks.append((name, torch.cuda.memory_allocated()))
        torch.cuda.reset_peak_memory_stats()
        current["name"] = name

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_step(model, optimizer, batches, setup, phase)
    torch.cuda.synchronize()
    phase_peaks[current["name"]] = max(phase_peaks.get(current["name"], 0), torch.cuda.max_memory_allocated())
    peak = max(phase_peaks.values())
    peak_phase = next(k for k in ("forward", "backward", "optimizer", "end", "start") if phase_peaks.get(k) == peak)
    fw = [v for n, v in marks if n == "forward"]
    bw = [v for n, v in marks if n == "backward"]
    return peak, peak_phase, {k: v for k, v in phase_peaks.items() if k != "start"}, (bw[-1] - fw[-1]) if fw and bw else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], "rb") as f:
        job = pickle.load(f)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    jobdir = job["dir"]
    _redirect(os.path.join(jobdir, f"rank{rank}.log"))
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    def progress(stage: str, i: int, n: int) -> None:
        if rank == 0:
            with open(os.path.join(jobdir, "progress"), "a") as f:
                f.write(f"{stage} {i} {n}\n")

    try:
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.device(job["device"]).type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=job["timeout"]))
        torch.set_num_threads(max(1, job.get("threads") or torch.get_num_threads()))
        runs = []
        for k, setup in enumerate(job["setups"]):
            os.environ["TRAINFIT_DIST_RUN"] = str(k)
            result = run_rank(job, setup, rank, world, local_rank, progress)
            result["run"] = k
            gc.collect()
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(result, gathered, dst=0)
            runs.append(gathered)
        if rank == 0:
            tmp = job["out"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(runs, f)
            os.replace(tmp, job["out"])
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure is reported with its rank
        oom = type(e).__name__ == "OutOfMemoryError"
        info = {"rank": rank, "run": int(os.environ.get("TRAINFIT_DIST_RUN", "0")), "host": socket.gethostname(), "type": "out of memory" if oom else type(e).__name__,
                "error": (str(e).strip().splitlines() or [type(e).__name__])[0], "traceback": traceback.format_exc()}
        try:
            with open(os.path.join(jobdir, f"rank{rank}.error.json"), "w") as f:
                json.dump(info, f)
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)  # no barrier / destroy: the peers may be dead or blocked in a collective
    return 0


if __name__ == "__main__":
    sys.exit(main())
