"""Layer extrapolation: trace 3, 4 and 5 periods of a model's repeated decoder layers, predict the full depth.

Why it is exact (and checked, not assumed): the step's events are a fixed head, the same events for
each repeated layer, and a fixed tail, in every phase. Cut the event stream into segments at
structural marks (module entry/exit, a gradient becoming ready, phase starts). A segment's highest
live total, and each category at that moment, is then
    outside the layers, or in the first or last layer:   a + c*n
    in interior layer period m (0 < m < n-1):            a + b*m + c*n
for a model of n layer periods (c: bytes that scale with depth and are live there, e.g. weights,
saved activations of all layers; b: what accumulates layer after layer). The first and last layers
are classes of their own: they share tensors with the embedding / final norm instead of with
another layer, so their segments differ from an interior layer's (by a few KB in a tiny llama).
We fit a, b, c from the 3- and 4-period traces and demand that the 5-period trace matches them
*exactly* in every segment, category, FLOP count and parameter count; if anything differs the
caller traces the full model. The full model's peak is then the max over segments, where an
interior segment's max over m in [1, n-2] sits at an end (linear in m). Taking maxima per segment,
not per phase, is what keeps this right when the peak moves (e.g. from the start of backward to its
end as depth grows).

tests/trace/test_extrapolate.py compares extrapolated and full traces field by field.
"""
from __future__ import annotations

import dataclasses
import math
import re
import time

from ..estimate import Detail, Estimate, Flops, Memory
from ..setup import Setup
from ..spec import ModelSpec
from .analysis import TRAIN_PHASES, segment_maxima
from .recorder import ACTIVATION, CATEGORIES, as_categories
from ..vlm_setup import lm_seq

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
MIN_PERIODS = 16  # below this many layer periods the full trace costs about as much as 3 + 4 + 5


def _period(values: list) -> int:
    for p in range(1, len(values) + 1):
        if len(values) % p == 0 and all(v == values[i % p] for i, v in enumerate(values)):
            return p
    return len(values)


def layer_period(spec: ModelSpec, setup: Setup) -> int | None:
    """Smallest number of layers after which the architecture repeats (gemma-2: 2, sliding/global),
    from every per-layer list in the transformers config; None if the layers do not repeat."""
    from ..step import hf_config

    if not any(k in spec.config for k in _LAYER_KEYS):
        return None
    cfg = hf_config(spec, setup).to_dict()
    n = spec.layers
    p = 1
    for key, v in cfg.items():
        if isinstance(v, (list, tuple)) and len(v) == n and n > 1:
            p = math.lcm(p, _period(list(v)))
    for key in ("mlp_only_layers", "first_k_dense_replace"):
        if cfg.get(key):
            return None
    if cfg.get("decoder_sparse_step", 1) not in (None, 1):
        p = math.lcm(p, int(cfg["decoder_sparse_step"]))
    if setup.layers_every > 1:  # --recompute layer:N checkpoints every N-th layer: the step repeats every N
        p = math.lcm(p, setup.layers_every)
    return p if n % p == 0 else None


def with_layers(spec: ModelSpec, layers: int) -> ModelSpec:
    """The same model with `layers` layers (per-layer config lists cut to length)."""
    cfg = dict(spec.config)
    for key in _LAYER_KEYS:
        if key in cfg:
            cfg[key] = layers
    for key, v in list(cfg.items()):
        if isinstance(v, list) and len(v) == spec.layers:
            cfg[key] = v[:layers]
    return dataclasses.replace(spec, layers=layers, config=cfg)


def _layer_list_prefix(model, layers: int) -> str | None:
    import torch

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == layers and layers > 0:
            return name
        # torchtitan keeps its blocks in a ModuleDict keyed "0".."n-1" (models/llama3/model/model.py:454-456)
        if isinstance(m, torch.nn.ModuleDict) and layers > 0 and list(m.keys()) == [str(i) for i in range(layers)]:
            return name
    return None


class _Split:
    """Splits a name into (generic name, layer index) for names inside the repeated layers."""

    def __init__(self, prefix: str, period: int):
        self.rx = re.compile(rf"^{re.escape(prefix)}\.(\d+)(.*)$")
        self.prefix = prefix
        self.p = period

    def __call__(self, name: str):
        m = self.rx.match(name)
        if not m:
            return name, None, None
        i = int(m.group(1))
        return f"{self.prefix}.*{m.group(2)}", i % self.p, i // self.p


TRACED = (3, 4, 5)  # layer periods traced: the first and last layer differ from the interior ones


def _groups(segs: dict, split: _Split, n: int) -> dict:
    """Segment maxima keyed by structure: {(phase index, phase, kind, generic, residue, position, occurrence):
    {m: vector}}. position: "first" / "last" layer period, "mid" for the interior ones (keyed by m),
    None outside the layers. The first and last layers are their own classes because their neighbours
    differ (the embedding before, the final norm after): the tensors they share with a neighbour live
    differently from an interior layer's."""
    out: dict = {}
    for (pi, phase, mark, occ), (best, cats) in segs.items():
        if len(mark) == 2:
            generic, r, m = split(mark[1])
            kind = mark[0]
        else:
            generic, r, m, kind = "", None, None, mark[0]
        pos = None if m is None else "first" if m == 0 else "last" if m == n - 1 else "mid"
        out.setdefault((pi, phase, kind, generic, r, pos, occ), {})[m if pos == "mid" else None] = (best, *cats)
    return out


def _sub(a, b):
    return tuple(x - y for x, y in zip(a, b))


def _axpy(base, k, d):
    return tuple(x + k * y for x, y in zip(base, d))


def _fit(points: list[dict]) -> dict | None:
    """points[j] = groups of the TRACED[j]-period trace. Returns {group: model} or None if any value
    is not exactly linear."""
    g3, g4, g5 = points
    if not (g3.keys() == g4.keys() == g5.keys()):
        return None
    models = {}
    for key in g3:
        a3, a4, a5 = g3[key], g4[key], g5[key]
        if key[5] != "mid":  # v(n) = v(3) + (n-3) * c
            if not (set(a3) == set(a4) == set(a5) == {None}):
                return None
            c = _sub(a4[None], a3[None])
            if _sub(a5[None], a4[None]) != c:
                return None
            models[key] = ("fixed", a3[None], c)
        else:  # interior period m of n: v(m, n) = v(1, 3) + b*(m-1) + c*(n-3)
            if set(a3) != {1} or set(a4) != {1, 2} or set(a5) != {1, 2, 3}:
                return None
            c = _sub(a4[1], a3[1])
            b = _sub(a4[2], a4[1])
            for m in (1, 2, 3):
                if a5[m] != _axpy(_axpy(a3[1], m - 1, b), 2, c):
                    return None
            models[key] = ("mid", a3[1], b, c)
    return models


def _predict(model, n: int):
    if model[0] == "fixed":
        _, v3, c = model
        return _axpy(v3, n - 3, c)
    _, v13, b, c = model
    first = _axpy(v13, n - 3, c)  # m = 1
    last = _axpy(first, n - 3, b)  # m = n - 2
    return last if last[0] > first[0] else first


def _linear(vals: list[int], n: int) -> int | None:
    d = vals[1] - vals[0]
    if vals[2] - vals[1] != d:
        return None
    return vals[0] + (n - TRACED[0]) * d


def _reserved(replays: list, n: int, peak: int, key: str = "reserved") -> int | None:
    """The fallback when depth_records.py cannot write the full depth's records (a structure it does not know):
    reserved of the full depth from the traced depths' allocator replays (alloc/replay.py Replay): the
    extrapolated peak plus the cache beyond it, `overhead` = reserved - max allocated of a replay, grown at its
    average per-layer increment over the traced depths (the line through the first and the last).

    Why not the reserved itself, linear through the last two depths: reserved moves in whole segments. When one
    traced depth needs one more segment than the depth before it (a vocab-sized block that no longer fits the
    cached ones, say), that step is in the last difference once and the line multiplied it by every missing
    layer: llama-3.1-8b bf16 (b2 s1024) replays reserved 15.32, 17.04 and 19.82 GB at 3, 4 and 5 layers, and the
    line read 94.7 GB at 32 layers against 71.7 GB measured on an H200 (tests/trace/test_extrapolate.py). Averaged
    over both increments a one-off step is spread, not doubled. Checked against 13 extrapolated training steps
    measured on an H200 (bench/results/gpu/H200-2026-11-27-unrecorded-6-truth.json): within 5.5 % (the smaller increment, as
    before, read up to 12 % low; the full-depth replays are within 3.3 %). NB: segment steps make the overhead
    noisy from depth to depth (llama-3.2-1b foreach: 0.62, 1.98, 1.30 GB), so either way it errs by a segment or
    two per traced depth; never below the extrapolated peak. key: "required" extrapolates the replays' least
    capacity (alloc/replay.py least_capacity) the same way."""
    if replays[-1] is None:
        return None
    over = [getattr(r, key) - r.allocated for r in replays]
    rate = (over[-1] - over[0]) / (TRACED[-1] - TRACED[0])
    return int(peak + max(0, over[-1] + (n - TRACED[-1]) * rate))


def _full_depth_replay(rec, split: _Split, period: int, n: int, peak: int, setup: Setup, alloc_conf: str | None):
    """The allocator's replay (reserved, required) of the full depth's records, written down from the deepest trace
    (depth_records.py); None off CUDA, or when they cannot be written or do not reach the extrapolated peak exactly
    (the caller falls back to `_reserved`'s line)."""
    from .depth_records import full_depth_stream, step_peak
    from .engine import replay_of

    if setup.device != "cuda":
        return None
    stream = full_depth_stream(rec, split.prefix, period, TRACED[-1], n)
    if stream is None or step_peak(stream) != peak:
        return None
    return replay_of(stream, setup, alloc_conf)


def trace_extrapolated(spec: ModelSpec, setup: Setup, *, flops: bool = True, min_periods: int = MIN_PERIODS,
                       alloc_conf: str | None = None) -> Estimate | None:
    """The extrapolated Estimate, or None when the model does not qualify or a check fails."""
    from .engine import NOTES, device_notes, kernel_records, replay_of, trace_train

    p = layer_period(spec, setup)
    if p is None or spec.layers // p < max(min_periods, TRACED[-1] + 1):
        return None
    n_target = spec.layers // p
    t0 = time.perf_counter()
    runs = []
    for k in TRACED:
        model, rec, an = trace_train(with_layers(spec, k * p), setup, flops=flops, segments=True)
        prefix = _layer_list_prefix(model, k * p)
        if prefix is None:
            return None
        split = _Split(prefix, p)
        runs.append((model, rec, an, _groups(segment_maxima(rec, rec.phase_marks[0][0]), split, k), split))
    models = _fit([r[3] for r in runs])
    if models is None:
        return None

    scalars = {
        "params": [sum(q.numel() for q in r[0].parameters()) for r in runs],
        "paged_optimizer_states": [getattr(r[1], "paged_bytes", 0) for r in runs],  # linear in layers too
    }
    if flops:
        for kind in ("forward", "backward", "recompute"):
            scalars[kind] = [r[1].flops.by_kind[kind] for r in runs]
    predicted = {}
    for name, vals in scalars.items():
        v = _linear(vals, n_target)
        if v is None:
            return None
        predicted[name] = v

    # Peak, phase maxima and their make-up from the segment models.
    phase_max: dict[str, int] = {}
    peak, peak_key, peak_vec = -1, None, None
    baseline_vec, acts = None, 0
    for key, model in models.items():
        vec = _predict(model, n_target)
        pi, phase, kind = key[0], key[1], key[2]
        if kind == "at":
            if pi == 0:
                baseline_vec = vec
            if phase == "backward":
                acts = max(acts, vec[1 + ACTIVATION])
            continue
        name = TRAIN_PHASES.get(phase)
        if name is None:
            continue
        if vec[0] > phase_max.get(name, -1):
            phase_max[name] = vec[0]
        if vec[0] > peak:
            peak, peak_key, peak_vec = vec[0], key, vec
    cats = {CATEGORIES[i]: v for i, v in enumerate(peak_vec[1:]) if v}
    base = {CATEGORIES[i]: v for i, v in enumerate(baseline_vec[1:]) if v}
    full = _full_depth_replay(runs[-1][1], runs[-1][4], p, n_target, peak, setup, alloc_conf)
    reserved_from = "full-depth records" if full is not None else "line through the traced depths"
    if full is not None:
        reserved, required = full.reserved, full.required
    else:
        replays = [replay_of(r[1], setup, alloc_conf) for r in runs]
        reserved, required = (_reserved(replays, n_target, peak, k) for k in ("reserved", "required"))
    memory = Memory(
        # HF models train every parameter, and each .grad has its parameter's dtype (see engine.grad_bytes)
        weights=base.get("parameter", 0), gradients=base.get("parameter", 0),
        optimizer_states=cats.get("optimizer_state", 0), master_weights=base.get("master_weight", 0),
        activations=acts, temporaries=cats.get("temporary", 0), kv_cache=cats.get("kv_cache", 0),
        peak=peak, peak_phase=TRAIN_PHASES[peak_key[1]], phases=phase_max, at_peak=as_categories(cats),
        reserved=reserved, required=required,
    )
    tokens = setup.batch * lm_seq(spec, setup) * setup.grad_accum
    if flops:
        fwd, bwd, rc = predicted["forward"], predicted["backward"], predicted["recompute"]
        fl = Flops(forward=fwd, backward=bwd, recompute=rc, step=fwd + bwd + rc, model_step=fwd + bwd,
                   per_token=(fwd + bwd) // max(tokens, 1))
    else:
        fl = Flops(0, 0, 0, 0, 0, 0)
    _, last_rec, last_an, _, split = runs[-1]
    records = {
        "extrapolated_from_layers": [k * p for k in TRACED],
        "top_tensors": last_an.top_tensors,
        "activations_by_module": last_an.activations_by_module,
        "timeline": last_an.timeline,
        "timeline_layers": TRACED[-1] * p,
        "baseline": base,
        "trace_seconds": round(time.perf_counter() - t0, 3),
        "storages": len(last_rec.records),
    }
    if reserved is not None:
        records["reserved_from"] = reserved_from  # depth_records.py, else _reserved's line
    if flops:  # per module, layer modules summed over all layers
        per = {}
        for name, v in last_rec.flops.by_module.items():
            generic, r, _ = split(name)
            per[generic] = per.get(generic, 0) + (v * n_target // TRACED[-1] if r is not None else v)
        records["flops_by_module"] = dict(sorted(per.items(), key=lambda kv: -kv[1]))
    probe_notes = kernel_records(records, [r[1] for r in runs])
    notes = (*NOTES, *device_notes(setup), *probe_notes, (
        f"trace: {spec.layers} layers extrapolated from traces of {', '.join(str(k * p) for k in TRACED)} layers "
        "(every segment's bytes, the FLOPs and the parameter count checked exactly linear); "
        f"top tensors, activations by module and timeline are from the {TRACED[-1] * p}-layer trace"))
    return Estimate(engine="trace", model=spec.name, params=predicted["params"], params_per_rank=predicted["params"],
                    setup=setup, memory=memory, flops=fl, notes=notes,
                    # bitsandbytes' paged states (unified memory, beside the allocator)
                    detail=Detail(paged_optimizer_states=predicted["paged_optimizer_states"] or None,
                                  records=records))
