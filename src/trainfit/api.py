"""The library's front door: what the CLI, the web UI, the report and scripts call. No torch at import time.

A request is resolved once (`resolve`: the model loaded, its defaults such as the sequence applied) and handed to
trainfit.engines, the only way to run an engine: `analytic`, `trace` and `measure` here are those engines on a
Request."""
from __future__ import annotations

from . import engines
from .engines import ENGINES
from .errors import EngineUnavailableError, SetupError
from .estimate import Estimate
from .setup import GPU_SETTINGS, Request, Setup, refuse_unread, refuse_written, run_settings

__all__ = ["Request", "Setup", "Estimate", "estimate", "analytic", "trace", "measure", "measure_ranks", "run_engines",
           "compare", "resolve", "load_spec", "load_gpu", "gpu_of", "trace_factory", "catalog_models", "vision_models",
           "token_model"]


def estimate(model: str, engine: str = "analytic", **settings) -> Estimate:
    """One estimate of `model` (catalog name, config.json path or cached hub id) with any settings of
    trainfit.setup (batch, seq, precision, optimizer, recompute, dp/tp/pp, zero, gpu, tokens, ...).

    >>> from trainfit import estimate
    >>> e = estimate("llama-3.1-8b", batch=2, seq=4096, gpu="H100-80GB")
    >>> e.memory.peak > e.memory.weights > 0, e.time.gpu
    (True, 'H100-80GB')
    """
    if engine == "all":
        raise SetupError("estimate() returns one Estimate: pick analytic, trace or measure (run_engines for several)")
    refuse_unread(settings, "estimate()")  # (a misspelt keyword named, not a TypeError)
    req = Request(model=model, **settings)
    # a keyword given at its default is refused too where it does not apply
    refuse_written(frozenset(settings), req.mode, req.rollout, req.server)
    return run_engines(req, engine)[0]


def load_spec(model: str):
    from .models.resolve import load_model

    return load_model(model)


def token_model(model: str, command: str):
    """The ModelSpec of a token model, for the commands that search or draw a transformer's layouts (fit, plan,
    compare, report); a vision model (VisionSpec) is refused with one line."""
    from .spec import VisionSpec

    spec = load_spec(model)
    if isinstance(spec, VisionSpec):
        raise SetupError(f"trainfit {command} works on token models (sequence, attention, parallel layouts); "
                         f"{spec.name} is a {spec.family} image classifier: use trainfit estimate (docs/vision.md)")
    return spec


def load_gpu(name: str | None, price: float | None = None, memory: float | None = None,
             power_limit: float | None = None, cluster: str | None = None, host_memory: float | None = None):
    """The GPU `--gpu` names (a catalog name or a .json/.toml file), with --price (USD/h), --gpu-memory (GiB) and
    --power-limit (W) replacing its own price, memory and board power, in the nodes of --cluster (a catalog name or
    a .toml file; cluster.py)."""
    if name is None:
        if price is not None:
            raise SetupError("--price needs --gpu")
        if memory is not None:
            raise SetupError("--gpu-memory replaces a GPU's memory, which needs --gpu (see `trainfit gpus`)")
        if power_limit is not None:
            raise SetupError("--power-limit caps a GPU's board power, which needs --gpu (see `trainfit gpus`)")
        if cluster is not None:
            raise SetupError("--cluster places GPUs in nodes, which needs --gpu (see `trainfit gpus`)")
        if host_memory is not None:
            raise SetupError("--host-memory sets the memory of the GPU's node, which needs --gpu (see `trainfit gpus`)")
        return None
    from .hardware import resolve_gpu

    from .cluster import resolve_cluster, with_cluster

    gpu = resolve_gpu(name)
    if power_limit is not None:
        from .analytic.energy import check_power_limit

        check_power_limit(gpu, power_limit)
    gpu = gpu.with_price(price).with_memory(memory).with_power_limit(power_limit)
    gpu = with_cluster(gpu, resolve_cluster(cluster) if cluster is not None else None)
    return gpu.with_host_memory(host_memory)  # --host-memory replaces the cluster's


def gpu_of(req: Request):
    """The request's GPU: --gpu with its --price, --gpu-memory, --power-limit, --cluster and --host-memory
    (trainfit.setup.GPU_SETTINGS)."""
    return load_gpu(req.gpu, req.price, req.gpu_memory, req.power_limit, req.cluster, req.host_memory)


def resolve(req: Request, spec=None):
    """(spec, setup) of a request: the model loaded (or `spec`: one already built, e.g. from a pasted config.json),
    its model-dependent defaults resolved (seq within the learned positions, the task head)."""
    spec = load_spec(req.model) if spec is None else spec
    return spec, req.setup(spec)


def analytic(req: Request, spec=None) -> Estimate:
    spec, setup = resolve(req, spec)
    gpu = gpu_of(req)
    return _gpu_noted(spec, setup, gpu, engines.analytic(spec, setup, gpu, **run_settings(req)))


def _gpu_noted(spec, setup, gpu, e: Estimate) -> Estimate:
    """`e` with a warning where the GPU lacks what the setup's dtype runs best on (gpu_support.bf16_warning)."""
    from .analytic.gpu_support import bf16_warning
    from .spec import VisionSpec

    attention = not isinstance(spec, VisionSpec) or spec.family == "vit"
    warning = bf16_warning(setup, gpu, attention)
    return _noted(e, warning) if warning else e


def trace(req: Request, extrapolate: bool = True) -> Estimate:
    """The trace engine on the resolved request (`trainfit estimate --engine trace`, timeline, report, web timeline);
    with a GPU, its device total and its fit (fit_rule.with_fit: the allocator simulator's least capacity against the
    GPU's capacity). extrapolate=False: the whole step's curve (engines.trace)."""
    from .analytic.fit_rule import reserve_bytes, with_fit
    from .overheads import with_device_total

    spec, setup = resolve(req)
    gpu = gpu_of(req)
    traced = with_device_total(engines.trace(spec, setup, extrapolate=extrapolate, alloc_conf=req.alloc_conf), gpu,
                               spec)
    return _gpu_noted(spec, setup, gpu, with_fit(traced, gpu, reserve_bytes(req.reserve), spec))


def measure(req: Request, steps: int = 3, warmup: int = 1, progress=None, force: bool = False) -> Estimate:
    """Real steps of the resolved request here, after checking the predicted peak fits the free memory (--force
    skips the check)."""
    spec, setup = resolve(req)
    if not force:  # the analytic estimate in it refuses a layout the model does not allow
        ranks = setup.dp if (setup.stack_facts.measured_on_ranks and setup.mode == "train") else 1  # one process a rank
        check_room(spec, setup, processes=ranks)
    with quiet_native_stderr():
        return engines.measure(spec, setup, steps=steps, warmup=warmup, progress=progress)


def measure_ranks(req: Request, nproc: int, launcher_args: tuple = (), steps: int = 3, warmup: int = 2,
                  progress=None, force: bool = False) -> tuple[list[Estimate], list[dict]]:
    """A real run on `nproc` local processes (torch.distributed.run): each rank's Estimate and the ranks JSON."""
    spec, setup = resolve(req)
    if not force:
        check_room(spec, setup, processes=nproc if setup.device == "cpu" else 1)
    return engines.measure_ranks(spec, setup, nproc, steps=steps, warmup=warmup, launcher_args=launcher_args,
                                 progress=progress)


def trace_factory(ref: str, batch: int | None, setup: Setup) -> Estimate:
    """Trace any nn.Module from a 'package.module:function' factory (trainfit trace)."""
    return engines.trace_factory(ref, batch, setup)


def check_room(spec, setup: Setup, processes: int = 1) -> None:
    """Refuse a real run whose predicted peak exceeds the memory free on the device (--force overrides). CPU
    ranks share the host's memory, so their peaks add up."""
    from .units import fmt_bytes

    predicted = engines.analytic(spec, setup).memory.peak * processes
    free = available_memory(setup.device)
    if free is not None and predicted > free:
        raise SetupError(f"the analytic engine predicts a {fmt_bytes(predicted)} peak but only {fmt_bytes(free)} is free "
                         f"on {setup.device}: lower --batch/--seq, or pass --force to try anyway")


def available_memory(device: str) -> int | None:
    import os

    if device == "cpu":
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    import torch

    if not torch.cuda.is_available():
        raise EngineUnavailableError("--device cuda: no CUDA device here; measure on this machine with --device cpu")
    free, _ = torch.cuda.mem_get_info()
    return free


class quiet_native_stderr:
    """Silence the profiler's C++ start/stop lines (Kineto writes them to fd 2 directly); Python errors still
    propagate as exceptions and are printed by the CLI after the fd is restored."""

    def __enter__(self):
        import os
        import sys

        sys.stderr.flush()
        self._saved = os.dup(2)
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 2)

    def __exit__(self, *exc):
        import os

        os.dup2(self._saved, 2)
        os.close(self._saved)
        os.close(self._null)


def run_engines(req: Request, engine: str, measure_too: bool = False) -> list[Estimate]:
    """Estimates from the requested engines, most exact last ('all' = analytic and trace)."""
    if engine not in ENGINES:
        raise SetupError(f"--engine {engine!r} is not one of: {', '.join(ENGINES)}")
    refuse_unread_by(req, engine)
    order = {"analytic": [analytic], "trace": [trace], "measure": [measure], "all": [analytic, trace]}[engine]
    skipped = None
    if engine == "all":
        setup = resolve(req)[1]
        skipped = _trace_refused(setup)
        if skipped is not None:
            # the trace does not run this stack's step: skipped with its reason, and the measure engine takes its
            # place where it runs the stack (DeepSpeed on --dp ranks)
            order = [analytic] + ([measure] if setup.stack_facts.engine_runs("measure") else [])
    if measure_too and measure not in order:
        order = [*order, measure]
    if measure in order:  # refused before any engine runs, so the refusal names the engine, not another's need
        engines.check_stack(resolve(req)[1], "measure")
    unmodelled = _alloc_conf_unmodelled(req) if engine == "all" else None
    if unmodelled:  # the trace replays the setting; the analytic answers without it, and says so
        from dataclasses import replace

        results = [analytic(replace(req, alloc_conf=None))] + [f(req) for f in order[1:]]
        results[0] = _noted(results[0], f"{unmodelled}: its answer is without it")
    else:
        results = [f(req) for f in order]
    if skipped is not None:
        results[0] = _noted(results[0], f"trace engine skipped: {skipped}")
    results[0] = host_memory_noted(req, results[0])
    return results


# --host-memory (the node's host memory) is read by the analytic engine's verdict on what a step keeps in host memory
# (fit_rule.host_verdict: Fit.host_required) and by the offloads the advice (fit_advice, shown when the step does not
# fit), `trainfit fit` and `trainfit plan` try. Where nothing can read it, it is refused (refuse_host_memory); where
# the step decides, an estimate or a sweep that read nothing says so in a note.
_NOTHING_KEPT = "(no --offload or --offload-layers, no paged optimizer states evicted)"
HOST_MEMORY_UNREAD = (f"--host-memory judges nothing here: this step keeps nothing in host memory {_NOTHING_KEPT} and "
                      "fits, so no offloading change is judged against it: drop it")
HOST_MEMORY_UNREAD_SWEEP = (f"--host-memory judges no point of this sweep: none keeps anything in host memory "
                            f"{_NOTHING_KEPT}, and a sweep suggests no offloads")
HOST_MEMORY_UNREAD_COMPARE = (f"--host-memory judges nothing here: the training step keeps nothing in host memory "
                              f"{_NOTHING_KEPT}, and compare suggests no offloads: drop it")
HOST_MEMORY_UNREAD_PLAN = ("--host-memory judges nothing here: plans fit without offloading, so no offload was "
                           "searched against it: drop it")


# The run settings an engine never reads (the analytic engine reads them all): the trace judges the step's memory on
# the GPU (no Timing: no step time, so no budget, --mfu or power cap; no host-memory verdict, fit_rule.host_verdict
# running in the analytic engine only, and no advice), the measure engine runs the step on this machine's --device
# (its fit the device's free memory, its time the clock's: no catalog GPU at all). Refused before any engine runs.
UNREAD_BY = {"trace": ("judges the step's memory on the GPU, not its time nor the node's host memory",
                       ("tokens", "price", "mfu", "power_limit", "host_memory")),
             "measure": ("runs the step on this machine's --device, not on a catalog GPU",
                         (*GPU_SETTINGS, "reserve", "tokens", "mfu"))}


def refuse_unread_by(req: Request, engine: str) -> None:
    """Refuse the settings given that `engine` never reads (UNREAD_BY) in one line naming them."""
    from .setup.settings import given_flags

    what, names = UNREAD_BY.get(engine, ("", ()))
    given = given_flags(req, names)
    if given:
        raise SetupError(f"--engine {engine} {what}: it reads no {', '.join(given)}; use --engine analytic or all "
                         f"(the analytic engine reads {'it' if len(given) == 1 else 'them'}), or drop "
                         f"{'it' if len(given) == 1 else 'them'}")


def refuse_host_memory(req: Request, where: str, instead: str) -> None:
    """Refuse --host-memory where nothing can read it: `where` says what runs instead, `instead` what to do."""
    if req.host_memory is not None:
        raise SetupError("--host-memory is read by the analytic engine (what an offloading step keeps in host memory) "
                         f"and by trainfit fit and plan (the offloads they try); {where}: {instead}")


def host_memory_noted(req: Request, e: Estimate) -> Estimate:
    """`e`, with HOST_MEMORY_UNREAD among its notes where --host-memory was given and nothing reads it
    (host_memory_unread): run_engines' estimates and the web app's."""
    return _noted(e, HOST_MEMORY_UNREAD) if host_memory_unread(req, e) else e


def _noted(e: Estimate, note: str) -> Estimate:
    from dataclasses import replace

    return replace(e, notes=(*e.notes, note))


def host_memory_unread(req: Request, e: Estimate, advised: bool = True) -> bool:
    """Whether --host-memory was given and nothing reads it: the analytic estimate judges the node's host memory
    only for what the step keeps there (fit_rule.host_verdict: Fit.host_required), and the advice (fit_advice, shown
    when the step does not fit) its offloading suggestions; `trainfit fit` and `plan` read it for theirs.
    `advised`: the caller shows the advice when the step does not fit (estimate, check, the web app; a sweep does
    not)."""
    return (req.host_memory is not None and e.engine == "analytic" and e.fit is not None
            and e.fit.host_required is None and (e.fit.fits or not advised))


def _alloc_conf_unmodelled(req: Request) -> str | None:
    """What of --alloc-conf the analytic engine does not model (analytic/expandable.py), or None."""
    if not req.alloc_conf:
        return None
    from .alloc.config import parse_alloc_conf
    from .analytic.expandable import unmodelled
    from .spec import VisionSpec

    spec, setup = resolve(req)
    applies = setup.mode == "train" and setup.device == "cuda" and not isinstance(spec, VisionSpec)
    return unmodelled(parse_alloc_conf(req.alloc_conf), applies)


def _trace_refused(setup: Setup) -> str | None:
    """Why the trace engine refuses this setup's stack (engines.check_stack), or None when it runs it."""
    try:
        engines.check_stack(setup, "trace")
    except SetupError as e:
        return str(e)
    return None


def measure_with_predictions(req: Request, steps: int, warmup: int, progress=None, force: bool = False,
                             with_trace: bool = False) -> tuple[Estimate, list[Estimate]]:
    """The real run, and the predictions of the other engines for the same step."""
    predictions = [analytic(req)]
    if with_trace:
        predictions.append(trace(req))
    return measure(req, steps, warmup, progress, force), predictions


def gaps(results: list[Estimate]) -> dict:
    """Signed relative gap of each estimate's peak against the last one (the most exact engine run)."""
    ref = results[-1].memory.peak
    return {"reference": results[-1].engine,
            "peak_gap": {e.engine: (e.memory.peak - ref) / ref if ref else None for e in results[:-1]}}


def estimate_dict(req: Request, est: Estimate, spec=None) -> dict:
    """`est` as `trainfit estimate --json` prints it (and the web app's /api/estimate returns it): its to_dict(), with
    the changes that would fit (fit_advice, as dicts) where it does not fit its GPU."""
    d = est.to_dict()
    advice = fit_advice(req, est, spec)
    if advice:
        d["would_fit"] = [x.as_dict() for x in advice]
    return d


def fit_advice(req: Request, est: Estimate, spec=None) -> list:
    """For an estimate that does not fit its GPU: the changes that would, fastest first (studies/fit_advice.py
    Suggestion objects); none for one that fits or has no GPU time. spec: the model when it is not req.model's (the
    web page's pasted config.json)."""
    from .spec import VisionSpec
    from .studies.fit_advice import suggestions as advise

    if est.time is None or est.time.fits:
        return []
    spec = spec if spec is not None else load_spec(req.model)
    if isinstance(spec, VisionSpec):
        return []  # the advice searches a transformer's settings (recompute, sequence, parallelism)
    return advise(spec, est.setup, gpu_of(req), reserve=req.reserve)


def compare(req: Request | str, **settings) -> dict[str, Estimate]:
    """Training step vs inference (prefill + decode) at the same batch, and inference at batch 1 (when the batch is
    larger): {label: Estimate}, training first. Inference serves the weights in the training compute dtype and reads
    every setting that applies to it; the inference estimates note the flags given that it does not read
    (compare_setup.unused_note: --quant, --lora-rank, --zero, --recompute, ...). Without --seq both run at the
    model's default for inference (a causal model's decode writes position --seq, so a learned position table allows
    one token fewer than training: GPT-2 1023). `req`: a Request, or a model with `settings` as estimate() takes
    them."""
    from dataclasses import replace

    from .compare_setup import inference_request, unused_note
    from .setup import default_seq

    if isinstance(req, str):
        refuse_unread(settings, "compare()")
        req = Request(model=req, **settings)
    elif not isinstance(req, Request) or settings:
        raise SetupError("compare() takes a Request, or a model name with its settings: compare('llama-3.1-8b', "
                         "batch=8)")

    if req.mode != "train":
        raise SetupError("compare contrasts a training step with inference: drop --mode")
    spec = token_model(req.model, "compare")
    if req.seq is None:
        req = replace(req, seq=default_seq(spec, "infer"))
    train = analytic(req)
    infer, note = replace(inference_request(req), seq=train.setup.seq), unused_note(req)
    if host_memory_unread(req, train, advised=False):  # (compare shows no advice)
        train = _noted(train, HOST_MEMORY_UNREAD_COMPARE)
        note = unused_note(replace(req, host_memory=None))  # (that note says drop it, for every column)
    sizes = (req.batch, 1) if req.batch > 1 else (req.batch,)
    rows = {f"train (batch {req.batch})": train}
    for batch in sizes:
        e = analytic(replace(infer, batch=batch))
        rows[f"infer (batch {batch})"] = _noted(e, note) if note else e
    return rows


def catalog_models() -> list[dict]:
    from .analytic.params import count_params
    from .models.resolve import catalog_entry, list_models

    out = []
    for s in list_models():
        meta = catalog_entry(s.name)
        out.append({"name": s.name, "family": s.family, "params": count_params(s).total, "layers": s.layers,
                    "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads, "vocab": s.vocab,
                    "hf_id": meta.get("hf_id"), "aliases": meta.get("aliases", []), "source": meta.get("source", "")})
    return sorted(out, key=lambda m: (m["family"], m["params"], m["name"]))  # by size within a family


def vision_models() -> list[dict]:
    """The vision catalog (models/catalog/vision) in catalog_models' fields: layers = all stages' blocks, hidden =
    the last stage's width, heads (ViT), no vocabulary; plus the default image size and the number of classes."""
    from .analytic.vision_graph import vision_params
    from .models.vision import list_vision_models, vision_entry

    out = []
    for s in list_vision_models():
        meta = vision_entry(s.name)
        out.append({"name": s.name, "family": s.family, "params": vision_params(s), "layers": sum(s.depths),
                    "hidden": s.widths[-1], "heads": s.heads, "kv_heads": s.heads, "vocab": 0,
                    "image_size": s.image_size, "num_labels": s.num_labels, "hf_id": meta.get("hf_id"),
                    "aliases": meta.get("aliases", []), "source": meta.get("source", "")})
    return sorted(out, key=lambda m: (m["family"], m["params"], m["name"]))
