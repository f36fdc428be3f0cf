"""The web app's one page: HTML, CSS and vanilla JavaScript in one string (no build step, nothing external).

The page posts the form to /api/view on every change and draws what comes back: the verdict, the breakdown
table and a stacked bar chart of memory at each phase (an inline SVG built here from the server's bars).
What is shown always belongs to the inputs on screen: once an input changes, #result is marked stale
(data-stale) until the answer for the new inputs arrives (an older request is aborted, and a late answer is
dropped by a request counter); an error empties #result, so no number or verdict of other inputs stays beside
it; a traced timeline is dropped when an input changes.
Element ids used by the end-to-end test: #batch (and every knob by its name), #result, #peak (data-bytes holds
the peak in bytes), #verdict, #error, #status, #would-fit, #timeline (an SVG, or #timeline-error: one line);
the "held" table (allocated peak -> reserved -> overheads -> device total, issue 13) has #required, #reserved
and #device-total (data-bytes: the API's memory.required / .reserved / .device_total) and its labels and
sentence come from trainfit.report.held, as in the CLI table and the reports.

The knob inputs and the JavaScript's list of knobs are generated from trainfit.setup.SETTINGS (knob_fieldsets),
so a new setting appears on the page with its help as a tooltip, its default and its allowed values; a setting
that does not apply to the chosen mode is disabled and not sent, and the allowed values that depend on the mode
(setup.choices_for: precision, quant) are the mode's.
"""
import html
import json

from ..report.held import DEVICE_TOTAL_LABEL, REQUIRED_LABEL, RESERVED_LABEL, held_sentence
from ..setup import SETTINGS, Setting, choices_for
from ..setup.vocab import GROUPS as SETTING_GROUPS

# Which fieldset each setting sits in (a setting not named here lands in "More").
GROUPS = (("Hardware", ("gpu", "gpu_memory", "power_limit", "cluster", "mode", "device", "mfu")),
          ("Step", ("stack", "batch", "seq", "grad_accum", "precision", "optimizer", "optimizer_impl", "recompute",
                    "attention", "head")),
          ("Parallelism", ("dp", "tp", "pp", "zero", "sequence_parallel")),
          ("Inference and budget", ("kv_dtype", "tokens", "price")))


def mode_choices(s: Setting) -> dict | None:
    """{mode: allowed values} for a setting whose allowed values depend on the mode (precision, quant), else None;
    the script fills its select when the mode changes (setup.choices_for is the one definition)."""
    by_mode = {m: list(choices_for(s, m)) for m in s.meta.modes} if s.meta.choices else {}
    return by_mode if any(c != list(s.meta.choices) for c in by_mode.values()) else None


def _input(s: Setting) -> str:
    name, tip = s.name, html.escape(s.meta.help, quote=True)
    label = name.replace("_", " ")
    if s.name == "gpu":  # filled from /api/gpus
        field = '<select id="gpu" name="gpu"></select>'
    elif s.base_type is bool:
        field = f'<input id="{name}" name="{name}" type="checkbox" style="width:auto"{" checked" if s.default else ""}>'
    elif mode_choices(s) is not None:  # filled by the script for the chosen mode
        field = f'<select id="{name}" name="{name}"></select>'
    elif s.meta.choices:
        blank = '<option value="">(default)</option>' if s.default is None else ""
        opts = "".join(f'<option value="{html.escape(str(c))}"{" selected" if c == s.default else ""}>'
                       f'{html.escape(str(c))}</option>' for c in s.meta.choices)
        field = f'<select id="{name}" name="{name}">{blank}{opts}</select>'
    elif s.base_type in (int, float) and s.meta.parse is None:
        low = s.meta.minimum if s.meta.minimum is not None else s.meta.above
        attrs = (f' min="{low:g}"' if low is not None else "") + (f' max="{s.meta.maximum:g}"' if s.meta.maximum else "")
        step = ' step="any"' if s.base_type is float else ' step="1"'
        value = "" if s.request_default is None else f' value="{s.request_default}"'
        hint = f' placeholder="{html.escape(s.meta.auto or "default")}"' if s.request_default is None else ""
        field = f'<input id="{name}" name="{name}" type="number"{value}{attrs}{step}{hint}>'
    elif s.meta.suggestions:  # free-form with common values offered (e.g. recompute's layer:N)
        opts = "".join(f'<option value="{html.escape(str(c))}">' for c in s.meta.suggestions)
        # (an unset setting shows its automatic default as the placeholder, as the number fields do)
        value = (f' placeholder="{html.escape(s.meta.auto or "default")}"' if s.default is None
                 else f' value="{html.escape(str(s.default))}"')
        field = (f'<input id="{name}" name="{name}" type="text" list="{name}-values"{value}>'
                 f'<datalist id="{name}-values">{opts}</datalist>')
    else:
        field = f'<input id="{name}" name="{name}" type="text" placeholder="e.g. {html.escape(s.meta.example)}">'
    return f'    <label title="{tip}">{label} {field}</label>'


def knob_fieldsets() -> str:
    by_name = {s.name: s for s in SETTINGS}
    placed = {n for _, names in GROUPS for n in names}
    # the rest by concern (setup/vocab.py GROUPS)
    rest = [(f"More: {title.lower()}" if key in ("step", "parallel") else title,
             tuple(n for n, s in by_name.items() if n not in placed and s.meta.group == key))
            for key, (title, _) in SETTING_GROUPS.items()]
    groups = [*GROUPS, *rest]
    out = []
    for legend, names in groups:
        rows = [_input(by_name[n]) for n in names if n in by_name]
        if rows:
            out.append(f"  <fieldset><legend>{legend}</legend>\n" + "\n".join(rows) + "\n  </fieldset>")
    return "\n".join(out)


def settings_json() -> str:
    kind = {bool: "bool", int: "int", float: "float", str: "str"}
    return json.dumps([{"name": s.name, "kind": kind.get(s.base_type, "str"), "modes": list(s.meta.modes),
                        "choices": mode_choices(s), "default": s.request_default} for s in SETTINGS])


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>trainfit — will it train?</title>
<style>
:root { --fg:#1d2330; --muted:#5b6475; --line:#e3e6ec; --ok:#1a7f37; --bad:#c62828; --accent:#4C72B0; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, Arial, sans-serif;
       color: var(--fg); background:#f6f7f9; }
header { padding: 14px 24px; background:#fff; border-bottom:1px solid var(--line); }
header h1 { margin:0; font-size:20px; } header p { margin:2px 0 0; color:var(--muted); }
.wrap { display:grid; grid-template-columns: 330px minmax(0,1fr); gap:18px; padding:18px 24px; max-width:1300px; }
@media (max-width: 860px) { .wrap { grid-template-columns: 1fr; } }
form, .panel { background:#fff; border:1px solid var(--line); border-radius:8px; padding:14px 16px; }
fieldset { border:none; padding:0; margin:0 0 10px; }
legend { font-weight:600; margin-bottom:4px; }
label { display:flex; justify-content:space-between; align-items:center; gap:8px; margin:5px 0; }
label span { color:var(--muted); }
input, select, textarea { font: inherit; padding:3px 6px; border:1px solid #c9ced8; border-radius:5px; width: 150px; }
textarea { width:100%; height:140px; font: 12px/1.3 ui-monospace, Menlo, Consolas, monospace; }
.src { display:flex; gap:14px; margin-bottom:6px; } .src label { margin:0; } .src input { width:auto; }
.grid2 { display:grid; grid-template-columns: 1fr 1fr; gap: 0 12px; } .grid2 input, .grid2 select { width: 80px; }
#error { display:none; background:#fdecea; color:var(--bad); border:1px solid #f5c2c0; border-radius:6px;
         padding:8px 12px; margin-bottom:12px; font-weight:600; }
.cards { display:flex; flex-wrap:wrap; gap:12px; margin-bottom:14px; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px 14px; min-width:180px; }
.card .k { color:var(--muted); font-size:11.5px; text-transform:uppercase; letter-spacing:.04em; }
.card .v { font-size:24px; font-weight:650; }
.ok { color:var(--ok); } .bad { color:var(--bad); }
table { border-collapse:collapse; width:100%; font-size:13px; }
td { border-bottom:1px solid var(--line); padding:3px 6px; } td:last-child { text-align:right; font-variant-numeric: tabular-nums; }
tr.phase td { color:var(--muted); } tr.peak td { font-weight:700; }
.cols { display:grid; grid-template-columns: minmax(0,3fr) minmax(0,2fr); gap:16px; }
@media (max-width: 1100px) { .cols { grid-template-columns: 1fr; } }
#chart svg { width:100%; height:auto; } #timeline img, #timeline svg { width:100%; height:auto; }
.muted, #notes { color:var(--muted); font-size:12px; } #status { color:var(--muted); font-size:12px; min-height:1.2em; }
button { font:inherit; padding:5px 12px; border-radius:6px; border:1px solid var(--accent); background:var(--accent); color:#fff; cursor:pointer; }
button:disabled { opacity:.6; cursor:wait; }
label.off { opacity:.4; }  /* a setting that does not apply to the chosen mode: disabled, not sent */
#result[data-stale] { opacity:.35; }  /* the inputs changed: these numbers are the previous inputs' until the answer */
</style>
</head>
<body>
<header><h1>trainfit — will it train (or serve) on this GPU?</h1>
<p>Memory per GPU by category and phase, the fit verdict and step time, from the analytic engine. API: <code>/api/estimate?model=…</code> · schema <a href="/api/openapi.json">/api/openapi.json</a></p></header>
<div class="wrap">
<form id="form" autocomplete="off" onsubmit="return false">
  <fieldset><legend>Model</legend>
    <div class="src">
      <label><input type="radio" name="source" value="catalog" checked> catalog</label>
      <label><input type="radio" name="source" value="config"> paste config.json</label>
    </div>
    <div id="catalog-box"><select id="model" name="model" style="width:100%"></select></div>
    <div id="config-box" style="display:none"><textarea id="config" name="config" placeholder='{"model_type": "llama", "hidden_size": 4096, ...}'></textarea></div>
  </fieldset>
@@KNOB_FIELDSETS@@
  <div id="status"></div>
</form>
<div>
  <div id="error" role="alert"></div>
  <div id="result">
  <div class="cards">
    <div class="card"><div class="k">peak memory per GPU</div><div class="v" id="peak" data-bytes="">–</div><div class="muted" id="peak-phase"></div></div>
    <div class="card"><div class="k" id="verdict-k">fit</div><div class="v" id="verdict">–</div><div class="muted" id="headroom"></div></div>
    <div class="card"><div class="k">parameters</div><div class="v" id="params">–</div><div class="muted" id="time"></div></div>
  </div>
  <div class="panel">
    <div class="muted" id="setup"></div>
    <div class="cols">
      <div id="chart"></div>
      <div><table id="rows"></table>
        <table id="held" style="margin-top:10px">
          <tbody><tr><td>peak (allocated)</td><td id="held-peak">–</td></tr>
            <tr><td>@@REQUIRED_LABEL@@</td><td id="required" data-bytes="">–</td></tr>
            <tr><td>@@RESERVED_LABEL@@</td><td id="reserved" data-bytes="">–</td></tr></tbody>
          <tbody id="overheads"></tbody>
          <tbody><tr class="peak"><td>@@DEVICE_TOTAL_LABEL@@</td><td id="device-total" data-bytes="">–</td></tr></tbody>
        </table>
        <p class="muted" id="held-note">@@HELD_SENTENCE@@</p></div>
    </div>
    <div id="notes"></div>
  </div>
  </div>
  <div class="panel" style="margin-top:14px">
    <button id="trace-btn" type="button">Trace the step's memory timeline</button>
    <span class="muted">the real PyTorch step on fake tensors (needs trainfit[torch]; a few seconds, longer for big models)</span>
    <div id="timeline"></div>
  </div>
</div>
</div>
<script>
"use strict";
// generated from trainfit.setup.SETTINGS: name, kind, modes, default, and {mode: allowed values} where they depend on it
const SETTINGS = @@SETTINGS_JSON@@;
const $ = (id) => document.getElementById(id);
const BLANK = $("result").innerHTML;  // the result area before any answer: what an error leaves
let seq = 0, timer = null, inflight = null, tracing = null;

function esc(s) { return String(s).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c])); }

function setMode() {  // a setting that does not apply to the mode is disabled (so not sent); choices follow the mode
  const mode = $("mode").value;
  for (const s of SETTINGS) {
    const el = $(s.name);
    if (!el) continue;
    const on = s.modes.includes(mode);
    el.disabled = !on;
    el.closest("label").classList.toggle("off", !on);
    if (on && s.choices) fillChoices(el, s, s.choices[mode]);
  }
}

function fillChoices(el, s, allowed) {
  const old = el.value;
  el.innerHTML = (s.default === null ? `<option value="">(default)</option>` : "") +
    allowed.map(c => `<option value="${esc(c)}">${esc(c)}</option>`).join("");
  el.value = allowed.includes(old) ? old : (s.default === null ? "" : String(s.default));
}

function knobs() {  // the enabled settings (those that apply to the chosen mode) and the model
  const f = $("form"), body = {};
  for (const s of SETTINGS) {
    const el = f.elements[s.name];
    if (!el || el.disabled) continue;
    body[s.name] = s.kind === "bool" ? el.checked : (el.value === "" ? null : el.value);
  }
  if (f.elements["source"].value === "config") body.config = $("config").value; else body.model = $("model").value;
  return body;
}

function showError(msg) { const e = $("error"); e.textContent = msg || ""; e.style.display = msg ? "block" : "none"; }

async function answer(resp) {  // the JSON body; a body that is not JSON (a proxy's page, a crash) as one line
  const text = await resp.text();
  try { return JSON.parse(text); } catch (_) {
    return {error: `HTTP ${resp.status}: ${text.trim().split("\n")[0] || resp.statusText || "no answer"}`};
  }
}

function changed() {  // what is on screen is the previous inputs' from now on: marked stale, the timeline dropped
  $("result").dataset.stale = "1";
  dropTimeline();
  clearTimeout(timer); timer = setTimeout(update, 120);
}

async function update() {
  const mine = ++seq;
  if (inflight) inflight.abort();  // a late answer to older inputs must never land
  const ctl = inflight = new AbortController();
  $("result").dataset.stale = "1";
  $("status").textContent = "estimating…";
  let resp, data;
  try {
    resp = await fetch("/api/view", {method: "POST", headers: {"Content-Type": "application/json"},
                                     body: JSON.stringify(knobs()), signal: ctl.signal});
    data = await answer(resp);
  } catch (err) {
    if (mine === seq) fail("the trainfit server did not answer: " + err.message);
    return;
  }
  if (mine !== seq) return;  // a newer request is on its way
  inflight = null;
  if (!resp.ok) { fail(data.error || ("HTTP " + resp.status)); return; }
  $("status").textContent = "";
  showError("");
  $("result").innerHTML = BLANK;
  render(data);
  delete $("result").dataset.stale;
}

function fail(msg) {  // the error, and no number or verdict of other inputs beside it
  $("status").textContent = "";
  showError(msg);
  $("result").innerHTML = BLANK;
  delete $("result").dataset.stale;
}

function render(v) {
  const s = v.summary;
  $("peak").textContent = s.peak_text;
  $("peak").dataset.bytes = String(s.peak);
  $("peak-phase").textContent = "at " + s.peak_phase;
  $("params").textContent = s.params_text;
  $("time").textContent = s.time_text || "";
  $("setup").textContent = s.model + " · " + s.setup;
  if (s.fits === null) {
    $("verdict-k").textContent = "fit"; $("verdict").textContent = "pick a GPU"; $("verdict").className = "v";
    $("headroom").textContent = "";
  } else {
    $("verdict-k").textContent = "on " + s.gpu;
    $("verdict").textContent = s.verdict;
    $("verdict").className = "v " + (s.fits ? "ok" : "bad");
    $("headroom").textContent = (s.judged_text ? s.judged_text + " · " : "") + "headroom " + s.headroom_text;
  }
  renderHeld(v.held);
  $("rows").innerHTML = v.rows.map(r =>
    `<tr class="${r.phase ? "phase" : ""} ${r.peak ? "peak" : ""}"><td>${esc(r.name)}${r.peak ? " ◀ peak" : ""}</td><td>${esc(r.text)}</td></tr>`).join("");
  $("notes").innerHTML = wouldFit(v.would_fit) + v.notes.map(n => "· " + esc(n)).join("<br>");
  $("chart").innerHTML = chart(v.bars, v.capacity, s.gpu, s.device_total);
}

function wouldFit(advice) {  // present when it does not fit: the CLI's suggestions, fastest first
  if (advice === undefined) return "";
  return `<p id="would-fit"><b>What would fit</b> ` + (advice.length ? `(fastest first): ${advice.map(esc).join("; ")}`
    : ": no change the search tries makes this setup fit") + "</p>";
}

function renderHeld(h) {  // allocated -> reserved -> overheads -> device total, as the server formatted them
  const by = new Map(h.rows.map(r => [r.key, r]));
  const put = (id, r) => { $(id).textContent = r && r.text !== null ? r.text : "pick a GPU"; $(id).dataset.bytes = r && r.bytes !== null ? String(r.bytes) : ""; };
  put("held-peak", by.get("peak")); put("required", by.get("required")); put("reserved", by.get("reserved")); put("device-total", by.get("device_total"));
  $("overheads").innerHTML = h.rows.filter(r => r.key.startsWith("overhead:")).map(r =>
    `<tr class="phase"><td>${esc(r.name)}</td><td>${esc(r.text)}</td></tr>`).join("");
  $("held-note").textContent = h.sentence;
}

function unitFor(x) {
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [n, s] of units) if (x >= 2 * s) return [n, s];
  return ["B", 1];
}

function niceStep(max) {
  const raw = max / 5, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

function chart(bars, capacity, gpu, deviceTotal) {
  const W = 560, H = 330, L = 56, R = 12, T = 22, B = 40;
  const top = Math.max(...bars.map(b => b.total), capacity || 0, deviceTotal || 0) * 1.12 || 1;
  const [un, us] = unitFor(top), ymax = top / us, step = niceStep(ymax);
  const y = (bytes) => T + (H - T - B) * (1 - bytes / us / ymax);
  const bw = Math.min(90, (W - L - R) / bars.length * 0.55);
  let out = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="memory at each phase">`;
  out += `<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#777" stroke-width="1.2"/></pattern></defs>`;
  for (let t = 0; t <= ymax + 1e-9; t += step) {
    const yy = y(t * us);
    out += `<line x1="${L}" x2="${W - R}" y1="${yy}" y2="${yy}" stroke="#eee"/><text x="${L - 6}" y="${yy + 4}" font-size="11" text-anchor="end" fill="#555">${+t.toFixed(2)}</text>`;
  }
  out += `<text x="14" y="${(H - B + T) / 2}" font-size="11" fill="#555" transform="rotate(-90 14 ${(H - B + T) / 2})" text-anchor="middle">memory per GPU (${un})</text>`;
  const legend = new Map();
  bars.forEach((b, i) => {
    const cx = L + (W - L - R) * (i + 0.5) / bars.length, x = cx - bw / 2;
    let acc = 0;
    for (const p of b.parts) {
      const y1 = y(acc + p.bytes), y0 = y(acc);
      out += `<rect x="${x}" y="${y1}" width="${bw}" height="${Math.max(0, y0 - y1)}" fill="${p.color}"><title>${esc(p.label)}: ${esc(p.text)}</title></rect>`;
      if (p.hatch) out += `<rect x="${x}" y="${y1}" width="${bw}" height="${Math.max(0, y0 - y1)}" fill="url(#hatch)"/>`;
      acc += p.bytes; legend.set(p.key, p);
    }
    out += `<text x="${cx}" y="${y(b.total) - 5}" font-size="11.5" text-anchor="middle" font-weight="${b.peak ? 700 : 400}">${b.peak ? "peak " : ""}${esc(b.total_text)}</text>`;
    out += `<text x="${cx}" y="${H - B + 16}" font-size="12" text-anchor="middle">${esc(b.label)}</text>`;
  });
  if (capacity) {
    const yy = y(capacity);
    out += `<line x1="${L}" x2="${W - R}" y1="${yy}" y2="${yy}" stroke="#D62728" stroke-width="1.5" stroke-dasharray="6 4"/>`;
    out += `<text x="${W - R}" y="${yy - 4}" font-size="11" text-anchor="end" fill="#D62728">${esc(gpu)} memory</text>`;
  }
  if (deviceTotal) {  // what the fit is judged on: the bars are allocated bytes, this is what nvidia-smi would show
    const yy = y(deviceTotal);
    out += `<line x1="${L}" x2="${W - R}" y1="${yy}" y2="${yy}" stroke="#222" stroke-width="1.1" stroke-dasharray="3 3"/>`;
  }
  out += `<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#333"/></svg>`;
  out += `<div class="muted">` + [...legend.values()].reverse().map(p =>
    `<span style="display:inline-block;width:10px;height:10px;background:${p.color};margin:0 4px 0 10px"></span>${esc(p.label)}`).join("")
    + (deviceTotal ? `<span style="display:inline-block;width:14px;border-top:1.5px dashed #222;margin:0 4px 3px 10px"></span>@@DEVICE_TOTAL_LABEL@@` : "") + `</div>`;
  return out;
}

function dropTimeline() {  // the timeline belongs to the inputs it was traced for
  if (tracing) tracing.abort();
  tracing = null;
  $("timeline").innerHTML = "";
  $("trace-btn").disabled = false;
}

async function trace() {
  const btn = $("trace-btn"), body = knobs();
  dropTimeline();
  if (body.config !== undefined) { $("timeline").innerHTML = '<p class="muted">the timeline traces catalog models only here; use `trainfit timeline ./config.json`</p>'; return; }
  const q = new URLSearchParams(Object.entries(body).filter(([k, v]) => v !== null && v !== "")).toString();
  const ctl = tracing = new AbortController();
  btn.disabled = true; $("timeline").innerHTML = '<p class="muted">tracing…</p>';
  let out;
  try {
    const resp = await fetch("/api/timeline.svg?" + q, {signal: ctl.signal});
    const svg = resp.ok && (resp.headers.get("Content-Type") || "").startsWith("image/svg+xml");
    out = svg ? await resp.text() : `<p class="bad" id="timeline-error">${esc((await answer(resp)).error || "HTTP " + resp.status)}</p>`;
  } catch (err) {
    out = `<p class="bad" id="timeline-error">the trainfit server did not answer: ${esc(err.message)}</p>`;
  }
  if (ctl !== tracing) return;  // the inputs changed meanwhile: dropped
  tracing = null;
  $("timeline").innerHTML = out;
  btn.disabled = false;
}

async function init() {
  const [models, gpus] = await Promise.all([fetch("/api/models").then(r => r.json()), fetch("/api/gpus").then(r => r.json())]);
  const fams = new Map();
  for (const m of models) { if (!fams.has(m.family)) fams.set(m.family, []); fams.get(m.family).push(m); }
  const fmtP = (n) => n >= 1e9 ? (n / 1e9).toFixed(1) + "B" : (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + "M";
  $("model").innerHTML = [...fams].map(([f, ms]) => `<optgroup label="${esc(f)}">` +
    ms.map(m => `<option value="${esc(m.name)}">${esc(m.name)} (${fmtP(m.params)})</option>`).join("") + "</optgroup>").join("");
  $("model").value = models.some(m => m.name === "llama-3.1-8b") ? "llama-3.1-8b" : models[0].name;
  $("gpu").innerHTML = `<option value="">(none)</option>` + gpus.map(g => `<option>${esc(g.name)}</option>`).join("");
  $("gpu").value = gpus.some(g => g.name === "H100-80GB") ? "H100-80GB" : "";
  setMode();
  $("form").addEventListener("input", changed);
  $("form").addEventListener("change", (ev) => {
    if (ev.target.name === "mode") setMode();
    if (ev.target.name === "source") {
      const cfg = $("form").elements["source"].value === "config";
      $("catalog-box").style.display = cfg ? "none" : ""; $("config-box").style.display = cfg ? "" : "none";
    }
    changed();
  });
  $("trace-btn").addEventListener("click", trace);
  await update();
  document.body.dataset.ready = "1";
}
init().catch(err => showError("could not load the catalogs: " + err));
</script>
</body>
</html>
"""

PAGE = (_TEMPLATE.replace("@@KNOB_FIELDSETS@@", knob_fieldsets())
        .replace("@@REQUIRED_LABEL@@", html.escape(REQUIRED_LABEL)).replace("@@RESERVED_LABEL@@", html.escape(RESERVED_LABEL)).replace("@@DEVICE_TOTAL_LABEL@@", html.escape(DEVICE_TOTAL_LABEL))
        .replace("@@HELD_SENTENCE@@", html.escape(held_sentence()))
        .replace("@@SETTINGS_JSON@@", settings_json()))
