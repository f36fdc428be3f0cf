"""DeepSpeed's ZeRO engine on CPU (gloo), per-rank peak of live tensor bytes vs trainfit's analytic estimate.

    python -m bench run deepspeed_cpu [--model tiny-llama] [--zero 0 1 2 3] [--precision bf16-master fp32]
                                                 [--out bench/results/deepspeed_cpu.md]

Every case runs in ONE `torch.distributed.run --nproc-per-node 2` launch of trainfit's distributed measure
(trainfit.measure.distributed.measure_distributed_many -> trainfit.measure.worker with trainfit.step.deepspeed, the
step `trainfit estimate --stack deepspeed --engine measure` runs): per case, deepspeed.initialize on the HF model
trainfit builds (seed 0) with the config `--emit deepspeed` writes (DeepSpeed's bucket defaults), the client optimizer
torch.optim.AdamW(fused=True) (FusedAdam needs CUDA; torch's fused CPU kernel has FusedAdam's no-temporaries
property), two warm-up steps, then one step whose live bytes are rebuilt from c10's allocation records
(trainfit.measure.dist_peak; the profiler runs from before the model is built). The step peak is the highest live
count after the first phase mark. Prints a markdown table and writes it to --out.
"""
from __future__ import annotations

import argparse
import os
import time

from bench.data import results_dir
from bench.figures import pct, record

from bench import child_env

ABOUT = {"summary": "--stack deepspeed vs DeepSpeed's ZeRO engine on 2 CPU ranks",
         "minutes": 3, "quick": ["--zero", "2", "--precision", "bf16-master"]}

CASE_FIELDS = ("model", "zero", "precision", "batch", "seq")


def case(model: str, zero: int, precision: str, batch: int = 1, seq: int = 64, dp: int = 2,
         overlap_comm: bool = False, ep: int = 1):
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec = load_model(model)
    setup = Setup(stack="deepspeed", device="cpu", zero=zero, dp=dp, precision=precision, batch=batch, seq=seq,
                  optimizer="adamw", overlap_comm=overlap_comm, ep=ep)
    return spec, setup


def measure_many(spec, setups, timeout: int | None = None) -> list[list[dict]]:
    """Per setup, per rank {rank, peak, phase_peaks, weights, optimizer_states, strategy}: one launch of
    setups[0].dp CPU ranks."""
    from trainfit.measure.distributed import measure_distributed_many

    runs = measure_distributed_many(spec, setups, setups[0].dp, steps=0, warmup=2, device="cpu", timeout=timeout,
                                    env={"OMP_NUM_THREADS": "1"})
    return [[{"rank": r.rank, "peak": r.peak, "phase_peaks": dict(r.phase_peaks), "weights": r.weights,
              "optimizer_states": r.optimizer_states, "strategy": r.strategy} for r in ranks] for ranks in runs]


def measure(spec, setup, timeout: int | None = None) -> list[dict]:
    return measure_many(spec, [setup], timeout)[0]


def analytic(spec, setup):
    from trainfit.analytic.memory import train_memory

    return train_memory(spec, setup)


def _norm_entry(engine, optimizer):
    """(owner, attribute, the gradients it is called on) of the clip's norm DeepSpeed's step calls for this engine
    (analytic/grad_clip.py deepspeed_clip): the ZeRO optimizers' get_grad_norm_direct(gradients, params),
    FP16_UnfusedOptimizer's module-level get_weight_norm(grads), fp32 stage 0's engine.clip_fp32_gradients()."""
    if hasattr(optimizer, "get_grad_norm_direct"):
        return optimizer, "get_grad_norm_direct", lambda a: a[0]
    if type(optimizer).__name__ == "FP16_UnfusedOptimizer":
        from deepspeed.runtime.fp16 import unfused_optimizer
        return unfused_optimizer, "get_weight_norm", lambda a: a[0]
    return engine, "clip_fp32_gradients", lambda a: [p.grad for p in engine.module.parameters() if p.grad is not None]


def clip_worker(job_path: str) -> None:
    """One rank of `clip_probe`: trainfit's DeepSpeed step (trainfit.step.deepspeed: build, deepspeed.initialize with
    the --emit deepspeed config, run_step), two warm-ups, then one step under the allocation recorder
    (trainfit.measure.dist_peak) with the stack's own norm entry wrapped to mark a "clip" phase and to note the
    gradients it visits."""
    import json
    import pickle

    import torch
    import torch.distributed as dist

    from trainfit.measure.cpu_peak import profile_run
    from trainfit.measure.dist_peak import analyse_blocks
    from trainfit.step import deepspeed as kit

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    spec, setup = job["spec"], job["setup"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state, seen, mark = {}, [], {"fn": lambda name: None}

    def run(phase):
        torch.manual_seed(0)
        engine, optimizer = kit.wrap(kit.build(spec, setup), setup, "cpu")
        owner, name, grads_of = _norm_entry(engine, optimizer)
        orig = getattr(owner, name)

        def marked(*a, **k):
            grads = list(grads_of(a))
            seen.append({"tensors": len(grads), "elements": sum(g.numel() for g in grads),
                         "largest": max(g.numel() for g in grads), "dtype": str(grads[0].dtype)})
            mark["fn"]("clip")
            out = orig(*a, **k)
            mark["fn"]("optimizer")
            return out

        setattr(owner, name, marked)
        torch.manual_seed(1000 + rank)
        batches = kit.make_batches(spec, setup)
        for _ in range(2):
            kit.run_step(engine, optimizer, batches, setup)
        mark["fn"] = phase
        kit.run_step(engine, optimizer, batches, setup, phase)
        state["strategy"] = type(optimizer).__name__

    prof, _ = profile_run(run)
    pk = analyse_blocks(prof)
    out = {"rank": rank, "live_at_clip": pk.live_at("clip"), "clip_peak": pk.phase_peaks["clip"],
           "optimizer_peak": pk.phase_peaks["optimizer"], "norm": seen[-1], "calls": len(seen),
           "optimizer": state["strategy"], "ops": _clip_ops(prof)}
    with open(os.path.join(job["dir"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


NORM_OPS = ("aten::linalg_vector_norm", "aten::norm")  # a gradient's norm (one reduction kernel)
CAST_OPS = ("aten::_to_copy",)  # its cast to the norm dtype (one copy kernel)


def _clip_ops(prof) -> dict:
    """{norms, casts}: the outermost norm and dtype-cast ops the profiled step ran inside its (last) "clip" phase,
    each one kernel on a GPU."""
    from trainfit.measure.cpu_peak import PHASE_PREFIX, _walk

    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    marks = sorted((e.start_time_ns, e.name[len(PHASE_PREFIX):]) for e in events if e.name.startswith(PHASE_PREFIX))
    start = max(t for t, name in marks if name == "clip")
    end = min(t for t, _ in marks if t > start)

    def outermost(e, names):
        p = e.parent
        while p is not None:
            if p.name in names:
                return False
            p = p.parent
        return True

    inside = [e for e in events if start <= e.start_time_ns < end]
    return {kind: sum(1 for e in inside if e.name in names and outermost(e, names))
            for kind, names in (("norms", NORM_OPS), ("casts", CAST_OPS))}


def rank_job(module: str, flag: str, job: dict, ranks: int, what: str, timeout: int = 600) -> list[dict]:
    """Run `python -m MODULE FLAG job.pkl` on `ranks` CPU ranks (torch.distributed.run, standalone): `job` (a dict
    the worker reads, with "dir": where each rank writes its rank*.json) pickled; the ranks' JSON, or one line of
    what failed."""
    import json
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"trainfit-ds-{what}-") as d:
        path = os.path.join(d, "job.pkl")
        with open(path, "wb") as f:
            pickle.dump({**job, "dir": d}, f)
        env = child_env({**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone",
               "-m", module, flag, path]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        files = sorted(x for x in os.listdir(d) if x.startswith("rank") and x.endswith(".json"))
        if p.returncode != 0 or len(files) != ranks:
            lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "Error" in ln]
            raise RuntimeError(f"deepspeed {what} probe failed (rc {p.returncode}): {(lines or ['no output'])[-1]}")
        return [json.load(open(os.path.join(d, x))) for x in files]


def clip_probe(spec, setup, timeout: int = 600) -> list[dict]:
    """Per rank {live_at_clip, clip_peak, norm: {tensors, elements, largest, dtype}}: the clip's norm in DeepSpeed's
    own step on setup.dp CPU ranks (clip_worker)."""
    return rank_job(__spec__.name, "--clip-worker", {"spec": spec, "setup": setup}, setup.dp, "clip", timeout)


def offload_probe(spec, setup, timeout: int = 600) -> list[dict]:
    """Per rank {host: bytes by buffer}: the host buffers DeepSpeed's ZeRO-Offload makes (offload_worker) on setup.dp
    CPU ranks, after one step (the optimizer's states are made at its first step)."""
    return rank_job(__spec__.name, "--offload-worker", {"spec": spec, "setup": setup}, setup.dp, "offload", timeout)


def offload_worker(job_path: str) -> None:
    """One rank of `offload_probe`: the HF model trainfit builds, deepspeed.initialize with the --emit deepspeed
    config (offload_optimizer / offload_param: cpu, pinned) and torch's AdamW as the client optimizer
    (zero_force_ds_cpu_optimizer off: DeepSpeedCPUAdam keeps the same fp32 states and needs a C++ build), one step;
    then the sizes of the buffers ZeRO-Offload puts on its offload device (stage3.py:333 / stage_1_and_2.py:278:
    the host on a GPU rank; this CPU rank's own memory here)."""
    import json
    import pickle

    import deepspeed
    import torch
    import torch.distributed as dist

    from trainfit.step import deepspeed as kit

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    spec, setup = job["spec"], job["setup"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kit._skip_shm_kernel(deepspeed)
    torch.manual_seed(0)
    model = kit.build(spec, setup)
    engine, opt, _, _ = deepspeed.initialize(
        model=model, optimizer=kit.client_optimizer(model, setup),
        config={**kit.ds_config(setup), "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False})
    torch.manual_seed(1000 + rank)
    kit.run_step(engine, opt, kit.make_batches(spec, setup), setup)

    def nb(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    states = [v for s in opt.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    if setup.zero == 3:
        host = {"fp32 partition": nb(opt.fp32_partitioned_groups_flat),
                "fp32 gradient": nb(t.grad for t in opt.fp32_partitioned_groups_flat),
                "gradient partition buffer": nb([opt.grad_partitions_flat_buffer]),
                "16-bit partition": nb(opt.param_groups_fp16_flat_cpu_memory) if setup.offload == "params" else 0}
    else:
        host = {"fp32 partition": nb(opt.single_partition_of_fp32_groups),
                "fp32 gradient": nb(t.grad for t in opt.single_partition_of_fp32_groups),
                "16-bit copy": nb(opt.param_buffer_of_bit16_for_cpu_offload_groups),
                "largest-parameter buffer": nb([opt.temp_grad_buffer_for_cpu_offload]),
                "accumulated gradients": nb(opt.accumulated_grads_in_cpu.values())}
    host["optimizer states"] = nb(states)
    with open(os.path.join(job["dir"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "host": host}, f)


def clip_row(spec, setup) -> str:
    """One clip_probe run of the setup against the analytic clip (grad_clip.clip_work) of the same rank."""
    from trainfit.analytic.compute_time import tensors_per_rank
    from trainfit.analytic.grad_clip import clip_work, clipped_params
    from trainfit.analytic.params import count_params
    from trainfit.analytic.parallel.pipeline import stages
    from trainfit.analytic.parallel.tensor import rank_params
    from trainfit.analytic.precision import state_bytes

    stage = stages(spec, setup)[0]
    n, largest = rank_params(spec, count_params(spec), setup, stage)
    tensors = tensors_per_rank(spec, stage.layers, stage.embedding, stage.head)
    work = clip_work(setup, state_bytes(setup), clipped_params(setup, n), tensors, largest)
    pieces = tensors if setup.zero in (0, 3) else (tensors + setup.dp - 1) / setup.dp
    ranks = clip_probe(spec, setup)
    meas = max(r["clip_peak"] - r["live_at_clip"] for r in ranks)
    ops = ranks[0]["ops"]
    return (f"| {setup.zero} | {setup.precision} | {' / '.join(str(r['norm']['tensors']) for r in ranks)} / "
            f"{pieces:g} | {ops['norms']} / {ops['casts']} | {meas:,} | {work.temporaries:,.0f} | "
            f"{err(work.temporaries, meas)} |")


def err(a: float, m: float) -> str:
    return f"{100 * (a - m) / m:+.2f} %"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clip-worker")
    ap.add_argument("--offload-worker")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--precision", nargs="+", default=["bf16-master", "fp32"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--out", default=str(results_dir() / "deepspeed_cpu.md"))
    a = ap.parse_args(argv)
    if a.clip_worker:
        return clip_worker(a.clip_worker)
    if a.offload_worker:
        return offload_worker(a.offload_worker)
    import deepspeed

    cases = [case(a.model, z, p, a.batch, a.seq) for p in a.precision for z in a.zero]
    # --overlap-comm at ZeRO-1/2 (the second reduce bucket DeepSpeed allocates for it: stage_1_and_2.py:3272-3278)
    cases += [case(a.model, z, a.precision[0], a.batch, a.seq, overlap_comm=True) for z in a.zero if z in (1, 2)]
    spec = cases[0][0]
    t0 = time.time()
    runs = measure_many(spec, [s for _, s in cases], timeout=600 + 300 * len(cases))
    lines = [f"{a.model}, batch {a.batch}, seq {a.seq}, 2 CPU ranks (gloo), deepspeed {deepspeed.__version__}, the "
             "`--emit deepspeed` config (DeepSpeed's bucket defaults), torch AdamW(fused=True); "
             f"`python -m bench run deepspeed_cpu` ({time.time() - t0:.0f} s, one launch)", "",
             "Errors are signed, (analytic - measured) / measured; measured = the rank with the highest value.", "",
             "| zero | precision | DeepSpeed optimizer | measured peak (max rank) | analytic | error | "
             "measured backward / optimizer phase | analytic | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    peaks, optimizer = {}, []  # (zero, precision) -> the peak's error; the optimizer phases' errors
    for (_, setup), ranks in zip(cases, runs):
        est = analytic(spec, setup)
        m = max(r["peak"] for r in ranks)
        mb = max(r["phase_peaks"]["backward"] for r in ranks)
        mo = max(r["phase_peaks"]["optimizer"] for r in ranks)
        ab, ao = est.phases["backward"], est.phases["optimizer_step"]
        zero = f"{setup.zero}{' overlap_comm' if setup.overlap_comm else ''}"
        lines.append(f"| {zero} | {setup.precision} | {ranks[0]['strategy']} | {m:,} | {est.peak:,} | "
                     f"{err(est.peak, m)} | {mb:,} / {mo:,} | {ab:,} / {ao:,} | {err(ab, mb)} / {err(ao, mo)} |")
        peaks[(zero, setup.precision)] = (est.peak - m) / m
        optimizer.append((ao - mo) / mo)
    lines += ["", "The clip's norm in DeepSpeed's own step (gradient_clipping 1.0; `clip_probe`: the engine's norm entry "
              "marked as a phase), against analytic/grad_clip.py deepspeed_clip: the gradient pieces it visits (per "
              "rank), its norm and dtype-cast ops, its temporaries (max rank).", "",
              "| zero | precision | pieces: measured / analytic | norm ops / casts (rank 0) | measured temporaries | "
              "analytic | error |", "|---|---|---|---|---|---|---|"]
    lines += [clip_row(spec, setup) for _, setup in cases]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("# DeepSpeed ZeRO on 2 CPU ranks: measured vs analytic\n\n" + text)
    if vars(a) == vars(ap.parse_args([])):  # the figures are the default run's
        record_figures(peaks, optimizer)


def record_figures(peaks: dict[tuple[int, str], float], optimizer: list[float]) -> None:
    (zero, _), worst = max(peaks.items(), key=lambda kv: abs(kv[1]))
    median = sorted(abs(e) for e in peaks.values())[len(peaks) // 2]
    opt = max(optimizer, key=abs)
    zeros = sorted({z for z, _ in peaks})
    what = f"ZeRO {zeros[0]}–{zeros[-1]} × {'/'.join(dict.fromkeys(p for _, p in peaks))}"
    record("deepspeed_cpu", "--stack deepspeed: analytic vs DeepSpeed's ZeRO engine on CPU, 2 ranks", "within 2 %",
           f"{what}: peaks worst {pct(worst, digits=2)} (ZeRO-{zero}), optimizer phases ≤ {pct(opt, False, 2)}",
           {"cases": len(peaks), "peak_median_pct": round(median * 100, 3), "peak_worst_pct": round(worst * 100, 3),
            "optimizer_phase_worst_pct": round(opt * 100, 3)}, "stacks",
           rows=[{"table": "accuracy", "stack": "deepspeed", "engine": "analytic",
                  "truth": f"DeepSpeed ZeRO {zeros[0]}–{zeros[-1]} on 2 CPU ranks", "cases": len(peaks),
                  "median |error|": pct(median, False, 2), "worst": f"{pct(worst, digits=2)} (ZeRO-{zero})"},
                 {"table": "cpu", "stack": "deepspeed", "case": f"{what}, 2 ranks", "cases": len(peaks),
                  "trace vs real": "—", "analytic vs real": f"worst {pct(worst, digits=2)} (ZeRO-{zero})"}])


if __name__ == "__main__":
    main()
