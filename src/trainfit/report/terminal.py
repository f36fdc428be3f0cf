"""Rich tables for the terminal. Reports never compute: they format an Estimate."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .console import console as stdout_console

from ..analytic import serving
from ..analytic.terms import time_terms
from ..estimate import Estimate
from ..units import fmt_bytes, fmt_count, fmt_energy, fmt_seconds
from .held import DEVICE_TOTAL_LABEL, REQUIRED_LABEL, RESERVED_LABEL, fit_numbers, verdict_word

# what the FLOPs row says where an engine counted none (not_counted)
NOT_COUNTED = {"measure": "not counted by real steps (the analytic engine's)",
               "trace": "not counted by this trace (the analytic engine's)"}
PHASE_NAMES = {"forward_end": "forward end", "backward": "backward", "optimizer_step": "optimizer step",
               "prefill": "prefill", "decode": "decode", "generate": "generate", "score": "score",
               "critic_step": "critic step", "weight_sync": "weight sync"}


def _unit(e: Estimate) -> str:
    return "GPU" if e.setup.device == "cuda" else "process (CPU semantics)"


def setup_line(e: Estimate) -> str:
    s = e.setup
    extra = [f"{k}={v}" for k, v, off in (("sp", "on", not s.sequence_parallel), ("cp", s.cp, s.cp == 1),
                                           ("ulysses", s.ulysses, s.ulysses == 1),
                                           ("tiled-mlp", s.tiled_mlp or "auto", s.tiled_mlp is None),
                                           ("vpp", s.vpp, s.vpp == 1), ("split", s.pp_split, s.pp_split == "even"),
                                           ("ep", s.ep, s.ep == 1), ("etp", s.etp, s.etp is None),
                                           ("offload", s.offload, s.offload == "none")) if not off]
    par = (f" dp={s.dp} tp={s.tp} pp={s.pp} zero={s.zero}" if s.world_size > 1 or s.zero else "") + \
        "".join(" " + x for x in extra)
    if s.mode == "rl":
        n = s.batch * s.group_size
        return (f"RL · {s.rl_algo} · rollout {s.rollout} · {s.batch} prompt(s) × group {s.group_size} = {n} "
                f"completions of {s.prompt_len} + {s.completion_len} tokens · train micro-batch "
                f"{n // s.grad_accum} × accum {s.grad_accum} · beta {s.beta:g} · {s.precision} · {s.optimizer} · "
                f"recompute {s.recompute} · {s.device}")
    if s.mode == "infer":
        decoder = f" · decoder {s.target_seq}" if s.target_seq else ""  # an encoder-decoder model's --target-seq
        return (f"inference · batch {s.batch} · context {s.seq}{decoder}{_images(e)} · {s.precision} · attention "
                f"{s.attention_kernel}{par}")
    sv = e.detail.serving
    if s.mode == "serve" and sv is not None:
        quant = f" · --quant {s.quant}" + (" (the checkpoint's)" if sv.quant_as_stored else "") if s.quant else ""
        experts = f" (routed experts {sv.experts_format.upper()}, as stored)" if sv.experts_format else ""
        return (f"serving · {sv.server} {sv.version} · {s.precision} weights{experts}{quant} · {sv.kv_cache_dtype} KV · "
                f"tp={s.tp} pp={s.pp} · max-model-len {sv.max_model_len:,} · " +
                (f"mem-fraction-static {sv.knobs['mem_fraction_static']}" if sv.server == "sglang" else
                 f"utilization {sv.knobs['gpu_memory_utilization']}"))
    if _classifier(s):  # a vision model (trainfit.vision_setup): the batch is images, no sequence or attention kernel
        return (f"training · {s.batch} images of {s.image_size}x{s.image_size} · {e.detail.num_labels} classes "
                f"· {s.precision} · {s.optimizer} ({s.optimizer_kernel})"
                f"{' · channels-last' if s.channels_last else ''}"
                f"{f' · recompute {s.recompute}' if s.recompute != 'none' else ''} · {s.device}")
    inputs = e.detail.records.get("example_batch")
    if inputs:  # a user's module traced on its example batch (trace/user.py): no sequence, no attention kernel
        shown = ", ".join(f"{k} {tuple(shape)} {dtype}" for k, (shape, dtype) in inputs.items())
        return (f"training · stack {s.stack} · micro-batch {s.batch} ({shown}) · accum {s.grad_accum} · "
                f"{s.precision} · {s.optimizer} ({s.optimizer_kernel}) · recompute {s.recompute} · {s.device}")
    labels = e.detail.num_labels
    head = f"{s.head} head{f' ({labels} labels)' if labels else ''} · " if s.head else ""
    target = f" · target {s.target_seq}" if s.target_seq else ""  # an encoder-decoder model's decoder tokens
    return (f"training · stack {s.stack} · {head}micro-batch {s.batch} · seq {s.seq}{target}{_images(e)} · "
            f"accum {s.grad_accum} · "
            f"{s.precision} · {s.optimizer} ({s.optimizer_kernel}) · recompute {s.recompute} · attention "
            f"{s.attention_kernel}{par} · {s.device}")


def _classifier(s) -> bool:
    """An image classifier's setup (its batch is images); a vision-language model's also sets --images."""
    return bool(s.image_size) and s.images is None


def _images(e: Estimate) -> str:
    """A vision-language model's images per sample and the language model's sequence (components.py)."""
    parts = e.detail.records.get("components")
    if not parts:
        return ""
    s, lm = e.setup, parts["language_model"]
    return (f" text + {s.images} image(s) of {s.image_size}x{s.image_size} ({lm['image_tokens_per_sample']} image "
            f"tokens; LM sequence {lm['tokens_per_sample']})")


def _split(e: Estimate, key: str) -> list[tuple[str, int]]:
    """The vision tower's and the language model's shares of a memory term (components.py), as indented rows."""
    parts = e.detail.records.get("components") or {}
    return [(f"  {label}", parts[part][key]) for part, label in (("vision_tower", "vision tower"),
                                                                  ("language_model", "language model"))
            if key in parts.get(part, {})]


def memory_rows(e: Estimate) -> list[tuple[str, int]]:
    m = e.memory
    rows = [("weights", m.weights), *_split(e, "weights")]
    if e.setup.mode == "train":
        rows += [("gradients", m.gradients), ("optimizer states", m.optimizer_states)]
        if m.master_weights:
            rows.append(("fp32 master weights", m.master_weights))
        rows += [("activations (saved for backward)", m.activations), *_split(e, "activations")]
    elif e.setup.mode == "rl":  # every model of the step (analytic/rl.py)
        rows = [("weights (all models)", m.weights), ("gradients (training step)", m.gradients),
                ("optimizer states", m.optimizer_states)]
        if m.master_weights:
            rows.append(("fp32 master weights", m.master_weights))
        rows += [("activations (saved for backward)", m.activations),
                 (f"KV pool ({e.setup.rl_placement} vLLM)" if e.setup.rollout == "vllm" else "KV cache (rollout)",
                  m.kv_cache)]
    elif e.setup.mode == "serve":  # the engine's budget as it splits it (analytic/serving.py, serving_sglang.py)
        # vLLM measures its activations in a profile run; SGLang runs none: its largest eager transient (a chunked
        # prefill's forward or the logits) lives outside mem_fraction_static (analytic/serving_sglang.py)
        sglang = e.detail.serving is not None and e.detail.serving.server == "sglang"
        return rows + [("activations (largest transient)" if sglang else "profile-run peak (activations)",
                        m.activations), ("CUDA graphs", m.temporaries), ("KV cache (all blocks)", m.kv_cache)]
    else:
        rows += [("KV cache", m.kv_cache), ("activations (one layer, transient)", m.activations)]
    if "other" in m.at_peak:  # measured: allocation records do not tell these apart (measure/runner.py to_estimate)
        rest = "gradients, activations, temporaries" if e.setup.mode == "train" else "activations, logits"
        rows.append((f"{rest} at the peak (not separated)", m.at_peak["other"]))
    else:
        rows.append(("temporaries at the peak", m.temporaries))
    return rows


def step_term_rows(e: Estimate) -> list[tuple[str, float, float]]:
    """(term, seconds, share of the step) for each non-zero term of the step-time model (none under --mfu)."""
    st = e.detail.step_time
    if st is None or not st.step_seconds:
        return []
    return [(k, v, v / st.step_seconds) for k, v in time_terms(st.as_dict()).items() if v > 0]


def verdict(e: Estimate, numbers: bool = True) -> tuple[str, str] | None:
    """(label, text) of the estimate's fit on its GPU: the fit rule's verdict (Estimate.fit), else the Timing's
    (serving engines, measured runs); None without a GPU. numbers: with the required and capacity bytes."""
    judged = e.fit or e.time
    if judged is None:
        return None
    held = f" ({fmt_bytes(judged.gpu_memory)})" if judged.gpu_memory else ""
    color = "green" if judged.fits else "red"
    text = f"[{color}]{verdict_word(judged, e.setup.mode)}[/{color}]"
    if e.fit is not None and numbers:
        text += f" ({fit_numbers(e.fit)})"
    f = e.fit
    short = f is not None and f.host_capacity is not None and f.host_required > f.host_capacity
    host = f"; host memory {fmt_bytes(f.host_required - f.host_capacity)} short on the node" if short else ""
    return f"on {judged.gpu}{held}", f"{text}, headroom {fmt_bytes(judged.headroom)}{host}"


def budget_line(tm) -> str:
    power = f" at {tm.average_power_watts:,.0f} W per GPU" if tm.average_power_watts else ""
    return f"{tm.gpu_hours:,.0f} GPU-h · ${tm.cost_usd:,.0f} · {fmt_energy(tm.energy_kwh)}{power}"


def budget_rows(tm) -> list[tuple[str, str]]:
    """The --tokens budget of a Timing as (label, value) rows (none without --tokens): the terminal table, the HTML
    report and the web page show these."""
    if tm is None or tm.train_seconds is None:
        return []
    return [(f"train on {fmt_count(tm.train_tokens)} tokens", fmt_seconds(tm.train_seconds)),
            ("budget (GPU boards)", budget_line(tm))]


def render_estimate(e: Estimate, console: Console | None = None) -> None:
    console = console or stdout_console()
    title = f"{e.model} — {e.engine} engine — per {_unit(e)}"
    t = Table(title=title, caption=setup_line(e), show_header=True, header_style="bold")
    t.add_column("memory", style="cyan")
    t.add_column("bytes", justify="right")
    for name, v in memory_rows(e):
        t.add_row(name, fmt_bytes(v))
    m = e.memory
    for phase, v in m.phases.items():
        mark = " ◀ peak" if phase == m.peak_phase else ""
        t.add_row(f"[dim]at {PHASE_NAMES.get(phase, phase)}[/dim]", f"[dim]{fmt_bytes(v)}{mark}[/dim]")
    t.add_row("[bold]peak[/bold]", f"[bold]{fmt_bytes(m.peak)}[/bold] ({PHASE_NAMES.get(m.peak_phase, m.peak_phase)})")
    if e.detail.host_memory:  # offloaded states or activations: pinned host memory, not the GPU's
        t.add_row("host memory (offloaded)", fmt_bytes(e.detail.host_memory))
        f = e.fit
        if f is not None and f.host_required is not None:  # the node's ranks together, judged where it is known
            cap = f" of {fmt_bytes(f.host_capacity)}" if f.host_capacity else " (node capacity unknown: --host-memory)"
            over = f.host_capacity is not None and f.host_required > f.host_capacity
            t.add_row("host memory per node", ("[red]" if over else "") + fmt_bytes(f.host_required) + cap
                      + (" — over[/red]" if over else ""))
    if m.required is not None:  # what the fit is judged on: the peak + the fragmentation no OOM retry releases
        t.add_row(REQUIRED_LABEL, fmt_bytes(m.required))
    if m.reserved is not None:  # not a component of the peak: allocated + what the allocator keeps cached
        t.add_row(RESERVED_LABEL, fmt_bytes(m.reserved))
    if m.device_total is not None:
        t.add_row(DEVICE_TOTAL_LABEL, fmt_bytes(m.device_total))
    console.print(t)

    c = Table(show_header=True, header_style="bold")
    c.add_column("compute", style="cyan")
    c.add_column("value", justify="right")
    c.add_row("parameters", f"{fmt_count(e.params)} ({e.params:,})")
    if e.params_per_rank != e.params:
        c.add_row("parameters per GPU", fmt_count(e.params_per_rank))
    f = e.flops
    measured = e.engine == "measure"
    if not_counted(e) is not None:
        c.add_row("FLOPs", not_counted(e))
    elif e.setup.mode == "rl":
        c.add_row("FLOPs per step (generate + score + train)", fmt_count(f.step, "FLOP"))
        c.add_row("model FLOPs per trained token", fmt_count(f.per_token, "FLOP"))
    elif e.setup.mode == "train":
        c.add_row("FLOPs per step (fwd / bwd / recompute)", f"{fmt_count(f.forward)} / {fmt_count(f.backward)} / {fmt_count(f.recompute)}")
        c.add_row("FLOPs per step (hardware)", fmt_count(f.step, "FLOP"))
        per = "image" if _classifier(e.setup) else "sample" if e.detail.records.get("example_batch") else "token"
        c.add_row(f"model FLOPs per {per}", fmt_count(f.per_token, "FLOP"))
    else:
        c.add_row("prefill FLOPs", fmt_count(f.forward, "FLOP"))
        c.add_row("forward FLOPs per token", fmt_count(f.per_token, "FLOP"))
    tm = e.time
    judged = verdict(e)
    if judged is not None:
        c.add_row(*judged)
    if tm is not None:
        if e.setup.mode == "rl":
            c.add_row(step_time_label(e),
                      fmt_seconds(tm.step_seconds))
            for name, secs in e.detail.rl.phase_seconds.items():
                c.add_row(f"[dim]  {PHASE_NAMES.get(name, name)}[/dim]",
                          f"[dim]{fmt_seconds(secs)} ({secs / tm.step_seconds:.1%})[/dim]")
            c.add_row("generated tokens/s", f"{tm.decode_tokens_per_second:,.0f}")
        elif e.setup.mode == "train":
            c.add_row(step_time_label(e),
                      fmt_seconds(tm.step_seconds))
            for name, secs, share in step_term_rows(e):
                c.add_row(f"[dim]  {name.replace('_', ' ')}[/dim]", f"[dim]{fmt_seconds(secs)} ({share:.1%})[/dim]")
            c.add_row(f"{'images' if _classifier(e.setup) else 'tokens'}/s ({'measured here' if measured else 'all GPUs'})",
                      fmt_count(tm.tokens_per_second))
        elif e.setup.mode == "serve":
            sv = e.detail.serving
            sglang = sv.server == "sglang"
            block = sv.knobs["page_size" if sglang else "block_size"]  # SGLang's pages, vLLM's blocks
            # (vLLM's "GPU KV cache size" counts whole requests: blocks over a request's blocks x max-model-len,
            # fewer than blocks x block where max-model-len is no multiple of the block: analytic/serving.py)
            whole = "" if sv.kv_tokens == sv.kv_blocks * block else \
                f" (as whole {sv.max_model_len:,}-token requests; {sv.kv_blocks * block:,} token slots)"
            c.add_row("KV cache", f"{sv.kv_tokens:,} tokens in {sv.kv_blocks:,} blocks of {block}{whole}")
            c.add_row(f"sequences of {sv.max_model_len:,} tokens at once", f"{sv.max_concurrent_sequences:,.2f}")
            if not sglang:  # vLLM's start-up lines, to compare with its log
                for label, gib in serving.log_lines(sv):
                    c.add_row(f"[dim]  {label}[/dim]", f"[dim]{gib:.2f} GiB[/dim]")
            ld = sv.load
            if ld:  # (empty when no request of the mix fits the KV cache: the notes say so)
                c.add_row(f"load: {ld['concurrency']:,} requests of {ld['prompt_len']:,} + {ld['output_len']:,} "
                          "tokens", f"{ld['running']:,.0f} running at once")
                c.add_row("TTFT", fmt_seconds(ld["ttft_seconds"]))
                c.add_row("TPOT", fmt_seconds(ld["tpot_seconds"]))
                c.add_row("output tokens/s (replica)", f"{ld['output_tokens_per_second']:,.0f}")
                c.add_row("output tokens/s per GPU", f"{ld['output_tokens_per_second_per_gpu']:,.0f}")
        else:
            c.add_row("prefill time", fmt_seconds(tm.prefill_seconds))
            if tm.decode_tokens_per_second is not None:
                c.add_row("decode tokens/s (batch)", f"{tm.decode_tokens_per_second:,.0f}")
            if tm.max_batch is not None:  # (the analytic engine's capacities; a measured step ran one batch)
                c.add_row(f"largest batch at {e.setup.seq} tokens", f"{tm.max_batch:,}")
            if tm.max_seq is not None:
                c.add_row(f"longest context at batch {e.setup.batch}", f"{tm.max_seq:,}")
        for label, value in budget_rows(tm):
            c.add_row(label, value)
    console.print(c)
    for n in e.notes:
        console.print(f"[dim]· {n}[/dim]")


def time_cells(e: Estimate) -> tuple[str, str]:
    """(time, tokens/s) of an estimate timed on its GPU, in render_estimate's terms: a training step's time and
    tokens/s (all GPUs), an inference's prefill time and decode tokens/s (the batch's); dashes where untimed."""
    tm = e.time
    if tm is None:
        return "—", "—"
    if e.setup.mode == "infer":
        decode = tm.decode_tokens_per_second
        return (f"prefill {fmt_seconds(tm.prefill_seconds)}",
                "—" if decode is None else f"{decode:,.0f} decode (batch)")
    return f"step {fmt_seconds(tm.step_seconds)}", f"{fmt_count(tm.tokens_per_second)} (all GPUs)"


def _share(ratio: float, of: str = "") -> str:
    """`ratio` of a reference as a percentage (two digits under 10 %), and how much more or less that is."""
    diff = ratio - 1
    more = "about the same" if round(abs(diff), 2) == 0 else f"{abs(diff):.0%} {'more' if diff > 0 else 'less'}"
    return f"{ratio:.1%}{of} ({more})" if ratio < 0.1 else f"{ratio:.0%}{of} ({more})"


def compare_summary(estimates: list[Estimate]) -> str:
    """api.compare's estimates (training, inference at its micro-batch, then at batch 1 where that is larger) in one
    sentence: each inference peak as a share of the training peak, and how much more or less that is."""
    train, same = estimates[0].memory.peak, estimates[1].memory.peak
    line = (f"inference at batch {estimates[1].setup.batch} (the training micro-batch) needs "
            f"{_share(same / train, ' of the training peak')}")
    if len(estimates) > 2:
        line += f"; at batch 1 it needs {_share(estimates[2].memory.peak / train)}"
    return line + "."


def render_side_by_side(estimates: list[Estimate], console: Console | None = None, labels: list[str] | None = None,
                        reference: int | None = None, times: bool = False) -> None:
    """Several estimates of the same model in columns (engines, or training vs inference), with the gap; `times`:
    with each one's time and tokens/s on its GPU (time_cells)."""
    console = console or stdout_console()
    labels = labels or [e.engine for e in estimates]
    t = Table(title=f"{estimates[0].model} — per {_unit(estimates[0])}", header_style="bold")
    t.add_column("", style="cyan")
    for label in labels:
        t.add_column(label, justify="right")
    fields = ["weights", "gradients", "optimizer_states", "master_weights", "activations", "kv_cache", "temporaries", "peak"]
    for fld in fields:
        vals = [getattr(e.memory, fld) for e in estimates]
        if not any(vals):
            continue
        ref = vals[reference] if reference is not None else 0
        row = [fmt_bytes(v) + (f" [dim]({v / ref:.2f}×)[/dim]" if ref and i != reference else "")
               for i, v in enumerate(vals)]
        t.add_row(fld.replace("_", " "), *row)
    t.add_row("peak phase", *[e.memory.peak_phase.replace("_", " ") for e in estimates])
    for label, fld in ((REQUIRED_LABEL, "required"), (RESERVED_LABEL, "reserved"), (DEVICE_TOTAL_LABEL, "device_total")):
        vals = [getattr(e.memory, fld) for e in estimates]
        if any(v is not None for v in vals):
            t.add_row(label, *[fmt_bytes(v) if v is not None else "—" for v in vals])
    judged = [verdict(e, numbers=False) for e in estimates]
    if any(judged):
        caps = [e.fit.capacity if e.fit is not None else None for e in estimates]
        if any(v is not None for v in caps):
            t.add_row("capacity (fit rule)", *[fmt_bytes(v) if v is not None else "—" for v in caps])
        t.add_row(next(j[0] for j in judged if j), *[j[1] if j else "—" for j in judged])
    if times and any(e.time is not None for e in estimates):
        cells = [time_cells(e) for e in estimates]
        t.add_row("time", *[c[0] for c in cells])
        t.add_row("tokens/s", *[c[1] for c in cells])
    if reference is not None:
        t.caption = f"(×) = ratio to {labels[reference]}"
    console.print(t)


def not_counted(e: Estimate) -> str | None:
    """What the FLOPs row says where the engine counted none (a step every engine times has matmuls: measure/
    runner.py to_estimate and the RL trace, trace/rl.py, count none), else None: no FLOP rows and no MFU then."""
    return None if e.flops.step > 0 else NOT_COUNTED.get(e.engine, "not counted (the analytic engine's)")


def step_time_label(e: Estimate) -> str:
    """The step-time row's label: with the MFU where the FLOPs were counted, else whether the step was measured."""
    if not_counted(e) is None:
        return f"step time (MFU {e.time.mfu:.0%})"
    return "step time (measured)" if e.engine == "measure" else "step time"
