"""Megatron-Core's own GPT training step on CPU (gloo), per-rank peak of live tensor bytes vs trainfit's analytic
`--stack megatron` estimate.

    python -m bench run megatron_cpu [--cases tp1-fp32 tp2-bf16 ...] [--out bench/results/megatron_cpu.md]

Each case is one `torch.distributed.run --nproc-per-node TP` of this file in worker mode. The worker builds
megatron.core's GPTModel with the *local* layer spec (gpt_layer_specs.get_gpt_layer_local_spec: no Transformer
Engine, no apex) from a GPT-2-style config (LayerNorm, GeLU, biases, learned absolute positions, tied embeddings,
dropouts 0), wraps it as Megatron-LM does (Float16Module under bf16, megatron.core.distributed.
DistributedDataParallel with the contiguous grad buffer, grad_reduce_in_fp32 under bf16, the distributed optimizer
from get_megatron_optimizer, which on a machine without TE/apex uses torch.optim.Adam), runs two warm-up steps and
then one profiled step: zero_grad_buffer → forward with labels (per-token fp32 losses) → mean → backward →
finish_grad_sync → optimizer.step. Live bytes are rebuilt from c10's allocation records
(trainfit.measure.dist_peak, the profiler running from before the model is built).

Two patches make megatron-core run on CPU: torch.cuda.current_device returns "cpu" (GlobalMemoryBuffer, the grad
buffers and the optimizer ask CUDA for a device) and, with every dropout 0, the CUDA RNG tracker's fork is a no-op.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

from bench.data import results_dir
from bench.figures import pct, record

from bench import child_env

ABOUT = {"summary": "--stack megatron vs Megatron-Core's own GPT step on CPU ranks",
         "minutes": 1, "quick": ["--cases", "tp1-fp32"]}

# name: (tp, sequence_parallel, precision[, --loss-fusion: Megatron's cross_entropy_loss_fusion with
# cross_entropy_fusion_impl, megatron-core 0.16.1 model_parallel_config.py:241-249])
CASES = {
    "tp1-fp32": (1, False, "fp32"),
    "tp1-bf16": (1, False, "bf16-master"),
    "tp2-fp32": (2, False, "fp32"),
    "tp2-bf16": (2, False, "bf16-master"),
    "tp2-sp-bf16": (2, True, "bf16-master"),  # does not run: torch_norm.py:32 (local spec, no SP)
    # the native fused cross-entropy (fusions/fused_cross_entropy.py: torch.compile'd, which inductor builds for CPU)
    "tp1-bf16-ce-native": (1, False, "bf16-master", "native"),
    "tp2-bf16-ce-native": (2, False, "bf16-master", "native"),
}


def case(name: str) -> tuple[int, bool, str, str]:
    """(tp, sequence_parallel, precision, loss_fusion) of case `name`."""
    tp, sp, precision, *fusion = CASES[name]
    return tp, sp, precision, (fusion or ["none"])[0]
MODEL = {"hidden": 128, "heads": 4, "layers": 2, "ffn": 512, "vocab": 512, "positions": 128}
BATCH, SEQ = 2, 128
PHASES = ("forward", "backward", "optimizer")


def hf_config(m: dict = MODEL) -> dict:
    """The HF GPT-2 config of the same model (what trainfit's analytic side reads)."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": m["hidden"], "n_head": m["heads"],
            "n_layer": m["layers"], "vocab_size": m["vocab"], "n_positions": m["positions"], "n_inner": m["ffn"],
            "activation_function": "gelu", "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0,
            "tie_word_embeddings": False}  # GPTModel(share_embeddings_and_output_weights=False) default


def spec_and_setup(name: str, batch: int = BATCH, seq: int = SEQ, max_grad_norm: float | None = None):
    from trainfit.models.hf_config import spec_from_config
    from trainfit.setup import Setup

    tp, sp, precision, fusion = case(name)
    spec = spec_from_config(hf_config(), "megatron-cpu-gpt")
    setup = Setup(stack="megatron", device="cpu", attention="eager", tp=tp, sequence_parallel=sp,
                  precision=precision, batch=batch, seq=seq, optimizer="adam",  # dp 1: the distributed optimizer
                  max_grad_norm=max_grad_norm, loss_fusion=fusion)  # shards over 1 rank (= --zero 0)
    return spec, setup


def _patch_cpu() -> None:
    import contextlib

    import torch

    torch.cuda.current_device = lambda: "cpu"
    # the optimizers' flags and scalars are made with device='cuda' (optimizer.py:473-485): made on CPU instead
    for fn in ("tensor", "zeros", "ones", "empty", "full"):
        orig = getattr(torch, fn)

        def on_cpu(*a, _orig=orig, **k):
            if str(k.get("device", "")).startswith("cuda"):
                k["device"] = "cpu"
            return _orig(*a, **k)

        setattr(torch, fn, on_cpu)
    torch.Tensor.cuda = lambda self, *a, **k: self
    # the mixed-precision / distributed optimizers dispatch on param.type() == 'torch.cuda.FloatTensor' etc.
    # (distrib_optimizer.py:361,420, optimizer.py:671,690): CPU tensors answer with their CUDA type names
    orig_type = torch.Tensor.type

    def cuda_type(self, *a, **k):
        out = orig_type(self, *a, **k)
        if not a and not k and self.device.type == "cpu" and out.startswith("torch.") and ".cuda." not in out:
            return "torch.cuda." + out[len("torch."):]
        return out

    torch.Tensor.type = cuda_type
    from megatron.core.tensor_parallel import random as r

    r.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()


def worker(job_path: str) -> None:
    import torch
    import torch.distributed as dist

    _patch_cpu()
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    tp, sp, precision, batch, seq = job["tp"], job["sp"], job["precision"], job["batch"], job["seq"]
    clip_grad = job["clip_grad"]
    m = job["model"]
    bf16 = precision == "bf16-master"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tp, 1)
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    from trainfit.measure.cpu_peak import START
    from trainfit.measure.dist_peak import live_storage_ptrs, profiled

    state: dict = {"mark": lambda name: None}

    def step(phase=None):
        model, opt = state["model"], state["opt"]
        mark = state["mark"] = phase or (lambda name: None)
        model.zero_grad_buffer()
        opt.zero_grad()
        mark("forward")
        losses = model(state["ids"], state["pos"], None, labels=state["labels"])
        loss = losses.float().mean()
        mark("backward")
        loss.backward()
        model.finish_grad_sync()
        mark("optimizer")
        opt.step()
        mark("end")

    def run(phase):
        torch.manual_seed(0)
        cfg = TransformerConfig(
            num_layers=m["layers"], hidden_size=m["hidden"], num_attention_heads=m["heads"],
            ffn_hidden_size=m["ffn"], use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
            tensor_model_parallel_size=tp, sequence_parallel=sp, bf16=bf16,
            cross_entropy_loss_fusion=job["loss_fusion"] != "none",  # language_module.py:140-165
            cross_entropy_fusion_impl="native" if job["loss_fusion"] == "none" else job["loss_fusion"],
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
            pipeline_dtype=torch.bfloat16 if bf16 else torch.float32)
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: F401
        model = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=m["vocab"],
                         max_sequence_length=m["positions"])
        if bf16:
            model = Float16Module(cfg, model)
        ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=bf16, use_distributed_optimizer=True,
                                                overlap_grad_reduce=False)
        model = DistributedDataParallel(config=cfg, ddp_config=ddp_cfg, module=model)
        opt_cfg = OptimizerConfig(optimizer="adam", lr=1e-4, bf16=bf16, params_dtype=cfg.params_dtype,
                                  use_distributed_optimizer=True, clip_grad=clip_grad)
        state["model"], state["opt"] = model, get_megatron_optimizer(opt_cfg, [model])
        _mark_clip(state)
        g = torch.Generator().manual_seed(1000)  # every TP rank reads the same micro-batch
        state["ids"] = torch.randint(0, m["vocab"], (batch, seq), generator=g)
        state["labels"] = torch.randint(0, m["vocab"], (batch, seq), generator=g)
        state["pos"] = torch.arange(seq).unsqueeze(0).expand(batch, -1)
        for _ in range(2):
            step()
        step(phase)

    if os.environ.get("TRAINFIT_MG_DUMP"):
        return _dump(run, rank)
    pk, _ = profiled(run, alive=live_storage_ptrs)
    # the clip runs inside optimizer.step(): its marked stretch belongs to the optimizer phase
    phases = {k: v for k, v in pk.phase_peaks.items() if k not in (START, "clip")}
    phases["optimizer"] = max(phases["optimizer"], pk.phase_peaks.get("clip", 0))
    out = {"rank": rank, "peak": max(phases.values()), "phase_peaks": phases,
           "clip_peak": pk.phase_peaks.get("clip"),
           "marks": pk.marks, "notes": pk.notes,
           "optimizer": type(state["opt"]).__name__,
           "inner": type(getattr(state["opt"], "optimizer", None)).__name__,
           "grad_buffer": sum(b.grad_data.numel() * b.grad_data.element_size() for b in state["model"].buffers),
           "param_buffer": sum(b.param_data.numel() * b.param_data.element_size() for b in state["model"].buffers
                               if b.param_data is not None),
           "params": sum(p.numel() for p in state["model"].parameters()),
           "clip_at": pk.live_at("clip") if "clip" in pk.phase_peaks else None, "clip": state.get("clip")}
    with open(os.path.join(job["dir"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def _mark_clip(state: dict) -> None:
    """Megatron's own clip marked as a "clip" phase: get_megatron_optimizer returns a ChainedOptimizer (optimizer/
    __init__.py:689), whose step() takes get_grad_norm(), then clip_grad_by_total_norm_fp32 when clip_grad > 0, then
    step_with_ready_grads() (optimizer.py:1308-1335). The phase runs from the norm's start to the update's; the
    record notes what the norm reads (get_main_grads_for_grad_norm), the norm and clip_grad (the scale runs when the
    norm is above it: clip_grads.py:172-177)."""
    opt = state["opt"]
    norm_fn, update_fn = opt.get_grad_norm, opt.step_with_ready_grads

    def norm():
        grads = [g for o in opt.chained_optimizers for g in o.get_main_grads_for_grad_norm()]
        state["mark"]("clip")
        value = norm_fn()
        state["clip"] = {"tensors": len(grads), "elements": sum(g.numel() for g in grads),
                         "largest": max(g.numel() for g in grads), "dtype": str(grads[0].dtype),
                         "norm": float(value), "clip_grad": opt.config.clip_grad}
        return value

    def update():
        state["mark"]("optimizer")
        return update_fn()

    opt.get_grad_norm, opt.step_with_ready_grads = norm, update


def _dump(run, rank):
    from trainfit.measure.cpu_peak import PHASE_PREFIX, _walk, profile_run
    prof, _ = profile_run(run)
    ev = []
    for i, e in enumerate(_walk(prof.profiler.kineto_results.experimental_event_tree())):
        ef = e.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation":
            ev.append((e.start_time_ns, i, ef.ptr, ef.alloc_size, e))
        elif e.name.startswith(PHASE_PREFIX):
            ev.append((e.start_time_ns, i, None, e.name, e))
    ev.sort(key=lambda x: (x[0], x[1]))
    open_, phase = {}, None
    for t, i, ptr, size, e in ev:
        if ptr is None:
            phase = size
            continue
        if size > 0:
            names, p = [], e.parent
            while p is not None and len(names) < 5:
                names.append(p.name)
                p = p.parent
            open_[ptr] = (size, phase, " < ".join(names), e.start_thread_id if hasattr(e, "start_thread_id") else 0)
        else:
            open_.pop(ptr, None)
    with open(os.environ["TRAINFIT_MG_DUMP"] + f".{rank}", "w") as f:
        for ptr, (size, ph, names, th) in open_.items():
            if ph is not None and size >= 1000:
                f.write(f"{size} {ph} {names}\n")


def measure(name: str, batch: int = BATCH, seq: int = SEQ, model: dict = MODEL, timeout: int = 600,
            max_grad_norm: float | None = None) -> list[dict]:
    """Per-rank {peak, phase_peaks, clip_at, clip, ...} of one Megatron-Core step of case `name` on TP CPU ranks, with
    the setup's clip_grad (Setup.grad_clip_norm: Megatron's 1.0 unless `max_grad_norm`)."""
    tp, sp, precision, fusion = case(name)
    clip_grad = spec_and_setup(name, batch, seq, max_grad_norm)[1].grad_clip_norm
    with tempfile.TemporaryDirectory(prefix="trainfit-mg-") as d:
        job = os.path.join(d, "job.pkl")
        with open(job, "wb") as f:
            pickle.dump({"tp": tp, "sp": sp, "precision": precision, "batch": batch, "seq": seq, "model": model,
                         "clip_grad": clip_grad, "dir": d, "loss_fusion": fusion}, f)
        env = child_env({**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR",
                         "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(tp), "--standalone",
               "-m", __spec__.name, "--worker", job]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        files = sorted(x for x in os.listdir(d) if x.startswith("rank") and x.endswith(".json"))
        if p.returncode != 0 or len(files) != tp:
            lines = [ln for ln in (p.stdout + p.stderr).splitlines()
                     if "Error:" in ln and "ChildFailedError" not in ln]
            if os.environ.get("TRAINFIT_DEBUG"):
                print(p.stdout + p.stderr, file=sys.stderr)
            raise RuntimeError(f"megatron run failed (rc {p.returncode}): {(lines or ['no output'])[-1]}")
        return [json.load(open(os.path.join(d, x))) for x in files]


def analytic(name: str, batch: int = BATCH, seq: int = SEQ, max_grad_norm: float | None = None):
    from trainfit.analytic.engine import estimate

    spec, setup = spec_and_setup(name, batch, seq, max_grad_norm)
    return estimate(spec, setup).memory


MECHANISMS = """Local spec vs the TE model: what `--device cpu` changes in trainfit/analytic/megatron_*.py (each cited there):

* scores: masked_softmax_fusion off (transformer_config.py:357), torch softmax upcasts 16-bit scores and saves its
  fp32 output, bmm saves the 16-bit copy (fused_softmax.py:313-339, dot_product_attention.py:229): fp32 + 16-bit;
* causal mask: a fresh [s, s] bool per layer (transformer/utils.py:33-35), kept by masked_fill_;
* norm statistics: torch LayerNorm's mean/rstd in the input dtype on CPU (TE: fp32);
* GlobalMemoryBuffer: the baddbmm input [b·heads/t, s, s] lives for the process (dot_product_attention.py:189);
* gloo's all-gather of the param buffer after the step (param_and_grad_buffer.py:274): a buffer-sized temporary;
* head: the per-token fp32 loss is alive until backward; fp32 logits are not copied (cross_entropy.py:28);
  output_layer's backward makes a whole weight gradient (no gradient-accumulation fusion: layers.py:614);
* model states: the learned position embedding and row-parallel biases are replicated over TP;
* --loss-fusion native (the *-ce-native cases): the fused cross-entropy's torch.compile'd functions, built by inductor
  for CPU as for CUDA; its backward's functional fp32 copy of the softmax beside the bf16 gradient (megatron_loss.py).

Not modelled / not run: sequence parallelism (the local spec's torch LayerNorm asserts `not sequence_parallel`,
torch_norm.py:32); RMSNorm/SwiGLU (Llama-like) layers were not measured; a few KB of small tensors (position ids,
Adam step counters) are left out (under-counts < 0.1 %).
"""


def clip_row(name: str, ranks: list[dict]) -> str:
    """The clip's temporaries (its "clip" phase's high point over the live bytes at its start, max rank) against the
    analytic's (analytic/grad_clip.py megatron_clip), with the norm it took and the clip_grad it ran with."""
    from trainfit.analytic.memory import train_memory

    spec, setup = spec_and_setup(name)
    an = train_memory(spec, setup).detail["grad_clip_temporaries"]
    meas = max(r["clip_peak"] - r["clip_at"] for r in ranks)
    c = ranks[0]["clip"]
    return (f"| {name} | clip temporaries (norm {c['norm']:.3f}, clip_grad {c['clip_grad']:g}; {c['tensors']} fp32 "
            f"main grads, {c['elements']:,} elements on rank 0) | {meas:,} | {an:,} | {err(an, meas)} |")


def err(a: float, m: float) -> str:
    return f"{100 * (a - m) / m:+.2f} %"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--out", default=str(results_dir() / "megatron_cpu.md"))
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a.worker)
    lines = [f"Megatron-Core 0.16.1 GPTModel, local layer spec, {MODEL}, batch {BATCH}, seq {SEQ}, CPU ranks (gloo), "
             "DDP + distributed optimizer (torch Adam), Megatron's default clip_grad 1.0, one step after two "
             "warm-ups. Live tensor bytes per rank (trainfit.measure.dist_peak) vs trainfit's analytic `--stack "
             "megatron --device cpu`.\n",
             "| case | phase | measured (max rank) | analytic | error |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    errors = {}  # case -> (analytic - measured) / measured of each phase and the peak
    for name in a.cases:
        mem = analytic(name)
        try:
            ranks = measure(name)
        except Exception as e:  # noqa: BLE001 - the table records why a case did not run
            row = f"| {name} | - | does not run: {str(e).replace('|', '/')[-160:]} | {mem.peak:,} | |"
            print(row, flush=True)
            lines.append(row)
            continue
        amap = {"forward": "forward_end", "backward": "backward", "optimizer": "optimizer_step"}
        for ph in PHASES:
            meas = max(r["phase_peaks"][ph] for r in ranks)
            an = mem.phases[amap[ph]]
            per = " / ".join(f"{r['phase_peaks'][ph]:,}" for r in ranks)
            errors.setdefault(name, []).append((an - meas) / meas)
            row = f"| {name} | {ph} | {meas:,} ({per}) | {an:,} | {err(an, meas)} |"
            print(row, flush=True)
            lines.append(row)
        meas = max(r["peak"] for r in ranks)
        errors[name].append((mem.peak - meas) / meas)
        row = f"| {name} | **peak** | {meas:,} | {mem.peak:,} | {err(mem.peak, meas)} |"
        print(row, flush=True)
        lines.append(row)
        lines.append(clip_row(name, ranks))
        print(lines[-1], flush=True)
        notes = sorted({n for r in ranks for n in r["notes"]})
        if notes:
            lines.append(f"| {name} | recorder notes | {'; '.join(notes)} | | |")
    lines += ["", MECHANISMS]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    if a.cases == list(CASES) and errors:  # the figures are the whole run's
        record_figures(errors, len(CASES))


def record_figures(errors: dict[str, list[float]], cases: int) -> None:
    worst = max((e for errs in errors.values() for e in errs), key=abs)
    ran = f"{len(errors)} of {cases} cases ran" if len(errors) < cases else f"{cases} cases"
    record("megatron_cpu", "--stack megatron: analytic vs Megatron-Core's own GPT step on CPU", "within 2 %",
           f"TP 1/2 × fp32/bf16 (DDP + distributed optimizer), every phase ({ran}): worst {pct(worst, digits=2)}",
           {"cases": len(errors), "worst_pct": round(worst * 100, 3),
            "per_case_worst_pct": {n: round(max(e, key=abs) * 100, 3) for n, e in errors.items()}}, "stacks",
           rows=[{"table": "accuracy", "stack": "megatron", "engine": "analytic",
                  "truth": "Megatron-Core step on CPU, every phase", "cases": len(errors), "median |error|": "—",
                  "worst": pct(worst, digits=2)},
                 {"table": "cpu", "stack": "megatron", "case": "TP 1/2 × fp32/bf16, every phase", "cases": len(errors),
                  "trace vs real": "—", "analytic vs real": f"worst {pct(worst, digits=2)}"}])


if __name__ == "__main__":
    main()
