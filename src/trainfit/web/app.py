"""`trainfit serve`: a local web app on FastAPI (the `web` extra: fastapi + uvicorn).

Routes
  GET  /                      the page (page.py: one HTML document, vanilla JS, nothing fetched from elsewhere)
  GET  /api/estimate?model=…  the object `trainfit estimate --json` prints (api.estimate_dict: the analytic estimate
                              with the changes that would fit where it does not; run_engines' note on an unread
                              --host-memory, api.host_memory_noted)
  POST /api/estimate          the same, for a pasted config.json: {"config": {...} or "<json text>", knobs...}
  POST /api/view              what the page shows: the estimate plus its formatted rows, the phase chart's bars
                              and what the GPU holds (allocated peak, reserved, overheads, device total: `held`)
  GET  /api/timeline.svg?…    the trace engine's memory timeline, resolved as `trainfit estimate --engine trace` (api.trace;
                              needs trainfit[torch]; seconds per call)
  GET  /api/models, /api/gpus the catalogs (for the page's dropdowns)

Bounded work: each computing route (the estimates, the view and its fit advice, the timeline) runs in a worker thread
under the time limit of `trainfit serve --time-limit SECONDS` (DEFAULT_TIME_LIMIT), and stops (trainfit/cancel.py:
the engines' loops check a stop event) when the limit passes, when the client disconnects, or when the server stops.
Past the limit the answer is HTTP 503 with {"error": "stopped after N s (the time limit of `trainfit serve
--time-limit`): ..."}; sizes beyond what the engines can run are refused before any work (trainfit/limits.py).

Every error a user can cause answers HTTP 400 (a TrainfitError: unknown model, batch 0, tp not dividing the
heads, a malformed pasted config, a query parameter given twice) or 422 (a parameter of the wrong type, or one that
is no setting: never ignored), with the body {"error": "<one line>"}.
The app computes nothing itself: the numbers come from trainfit.api and the formatting from trainfit.report.
"""
from __future__ import annotations

import asyncio
import functools
import threading
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Annotated, Any, Optional, Union

from fastapi import FastAPI, Query
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BeforeValidator, ConfigDict, create_model

from .. import api, cancel
from ..errors import ConfigError, SetupError, TrainfitError
from ..estimate import Estimate
from .. import references
from ..models import resolve
from ..setup import SETTINGS, Request, Setting, parse_value
from ..spec import ModelSpec


def _not_a_switch(v):
    """JSON true/false where a number is expected is refused (pydantic would read true as 1)."""
    if isinstance(v, bool):
        raise ValueError(f"a number, not {str(v).lower()}")
    return v


def _knob_type(s: Setting):
    t = s.base_type
    # a number, or text the setting's parser reads ("15T")
    kind = Union[t, str, None] if s.meta.parse is not None else Optional[t]
    return Annotated[kind, BeforeValidator(_not_a_switch)] if t in (int, float) else kind


# The setup knobs, generated from trainfit.setup.SETTINGS with the CLI's defaults (query parameters or JSON body
# fields): the same names, defaults and validation as `trainfit estimate`. Blank fields take the defaults; a name
# that is none of them is refused (a misspelt knob would otherwise run the estimate at its default: _unknown_field).
Knobs = create_model("Knobs", __config__=ConfigDict(extra="forbid"), model=(Optional[str], None),
                     **{s.name: (_knob_type(s), s.request_default) for s in SETTINGS})


class PastedKnobs(Knobs):
    config: Union[dict[str, Any], str, None] = None  # a pasted config.json (object or its text)


# The server reads no file named by a request: every endpoint that computes runs under this rule (trainfit/references.py:
# model and GPU references resolve from the catalogs, without touching the disk, whatever the field).
def catalog_only():
    """The rule, as a context manager or a decorator (bounded wraps each request's work with it, in its thread)."""
    return references.catalog_only(
        models="the web app takes catalog names (see /api/models) or a pasted config.json",
        gpus="the web app takes catalog GPU names (see /api/gpus); set gpu_memory for another memory size")


def to_request(k: Knobs, model: str | None = None) -> Request:
    values = {}
    for s in SETTINGS:
        v = getattr(k, s.name)
        if isinstance(v, str) and not v.strip():
            v = None
        if v is None and s.request_default is not None:
            continue  # blank -> the CLI default
        if s.meta.names_model and v is not None:
            resolve.locate(v, field=s.name)  # the rule's one line now, whatever the mode (found, not yet built)
        values[s.name] = parse_value(s, v)
    return Request(model=model if model is not None else (k.model or ""), **values)


def _catalog_ref(model: str | None) -> str:
    """The model of a request without a pasted config (which references resolve: the catalog_only rule)."""
    if model is None or not model.strip():
        raise SetupError("choose a model: a catalog name (see /api/models) or paste a config.json")
    return model.strip()


def parse_config(config: Union[dict, str, None]) -> dict:
    if config is None or (isinstance(config, str) and not config.strip()):
        raise ConfigError("paste a config.json (a JSON object with the model's architecture)")
    if isinstance(config, str):  # the same reader as config.json files: NaN, nesting, non-objects refused
        from ..models.hf_config import loads_config

        config = loads_config(config, "the pasted config.json")
    if not isinstance(config, dict):
        raise ConfigError(f"the pasted config.json must be a JSON object, not {type(config).__name__}")
    return config


def _pasted(k: PastedKnobs) -> bool:
    return k.config is not None and not (isinstance(k.config, str) and not k.config.strip())


def _spec_and_request(k: PastedKnobs):
    """The model (catalog name, or the pasted config.json) and the request the knobs describe."""
    if not _pasted(k):
        req = to_request(k, model=_catalog_ref(k.model))
        return api.load_spec(req.model), req
    from ..models.hf_config import spec_from_config

    if k.model is not None and k.model.strip():  # (one of them is the model: the other would be dropped unsaid)
        raise SetupError("give a catalog model or a pasted config.json, not both")
    data = parse_config(k.config)
    name = str(data.get("_name_or_path") or data.get("model_type") or "pasted-config").split("/")[-1] or "pasted-config"
    req = to_request(k, model=name)
    return spec_from_config(data, name, source="pasted config.json"), req


def estimate_for(k: PastedKnobs):
    """(spec, request, the analytic Estimate) for a catalog model or a pasted config.json (as api.analytic)."""
    try:
        spec, req = _spec_and_request(k)
        return spec, req, api.host_memory_noted(req, api.analytic(req, spec))  # (as `trainfit estimate`'s notes)
    except TrainfitError:
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError, AttributeError) as e:
        if not _pasted(k):
            raise
        # NB: spec_from_config validates the fields it reads; this catches values of the wrong JSON type
        raise ConfigError(f"the pasted config.json cannot be estimated: {type(e).__name__}: {e}") from None


def view(e: Estimate) -> dict:
    """What the page draws: the estimate, its formatted rows and the phase chart's stacked bars."""
    from ..report import plots
    from ..report.held import fit_numbers, verdict_word
    from ..report.terminal import PHASE_NAMES, memory_rows, setup_line
    from ..units import fmt_bytes, fmt_count

    m, t = e.memory, e.time
    summary = {"model": e.model, "setup": setup_line(e), "peak": m.peak, "peak_text": fmt_bytes(m.peak),
               "peak_phase": PHASE_NAMES.get(m.peak_phase, m.peak_phase), "params_text": fmt_count(e.params),
               "fits": None, "gpu": None}
    if t is not None:
        # the verdict is the engine's fit rule (analytic/fit_rule.py): required <= capacity; the page shows the
        # numbers it was judged on beside it (a serving engine's: its device total of the GPU's memory)
        f = e.fit
        judged = (fit_numbers(f) if f is not None else
                  f"device total {fmt_bytes(m.device_total)} of {fmt_bytes(t.gpu_memory)}"
                  if m.device_total is not None and t.gpu_memory else None)
        summary.update(fits=t.fits, verdict=verdict_word(t, e.setup.mode), gpu=t.gpu, headroom=t.headroom,
                       headroom_text=fmt_bytes(t.headroom),
                       device_total=m.device_total, gpu_memory=t.gpu_memory, judged_text=judged,
                       time_text=time_text(e))
    rows = [{"name": n, "bytes": v, "text": fmt_bytes(v)} for n, v in memory_rows(e)]
    rows += [{"name": f"at {PHASE_NAMES.get(p, p)}", "bytes": v, "text": fmt_bytes(v), "phase": True,
              "peak": p == m.peak_phase} for p, v in m.phases.items()]
    bars = []
    for phase, cats in plots.phase_breakdown(e):
        parts = [{"key": k, "label": plots.category_label(k), "color": plots._BY_KEY[k].color,
                  "hatch": bool(plots._BY_KEY[k].hatch), "bytes": v, "text": fmt_bytes(v)} for k, v in cats.items()]
        total = sum(cats.values())
        bars.append({"phase": phase, "label": plots.PHASE_LABELS.get(phase, phase), "total": total,
                     "total_text": fmt_bytes(total), "peak": phase == m.peak_phase, "parts": parts})
    gpu_mem = t.gpu_memory if t is not None else None  # the GPU's memory as judged (--gpu-memory included)
    return {"estimate": e.to_dict(), "summary": summary, "rows": rows, "bars": bars, "capacity": gpu_mem,
            "held": held_rows(e), "notes": list(e.notes)}


def time_text(e: Estimate) -> str:
    """The timing in one line, by mode, in the terminal table's terms (report/terminal.py render_estimate); a
    figure the mode's Timing lacks (an encoder's decode, RL's prefill) is left out; training adds the --tokens budget."""
    from ..report.terminal import budget_rows
    from ..units import fmt_count, fmt_seconds

    t, s = e.time, e.setup
    if s.mode == "train":
        unit = "images" if s.image_size and s.images is None else "tokens"  # (a VLM: tokens)
        budget = "".join(f" · {label}: {value}" for label, value in budget_rows(t))  # (--tokens, as the CLI's rows)
        return (f"step {fmt_seconds(t.step_seconds)} at MFU {t.mfu:.0%} · {fmt_count(t.tokens_per_second)} "
                f"{unit}/s{budget}")
    if s.mode == "rl":
        return (f"step {fmt_seconds(t.step_seconds)} at MFU {t.mfu:.0%} · "
                f"{t.decode_tokens_per_second:,.0f} generated tokens/s")
    if s.mode == "serve":  # the engine under load (analytic/serving_time.py); empty when no request fits
        ld = e.detail.serving.load
        if not ld:
            return "no request of the mix fits the KV cache: nothing is served"
        return (f"{ld['concurrency']:,} requests: TTFT {fmt_seconds(ld['ttft_seconds'])} · TPOT "
                f"{fmt_seconds(ld['tpot_seconds'])} · {ld['output_tokens_per_second']:,.0f} output tokens/s")
    parts = [f"prefill {fmt_seconds(t.prefill_seconds)}"]
    if t.decode_tokens_per_second is not None:  # None for an encoder (BERT): nothing is decoded
        parts.append(f"decode {t.decode_tokens_per_second:,.0f} tokens/s")
    if t.max_batch is not None:  # serve: the sequences the KV pool holds at once, which decode runs at
        parts.append(f"max batch {t.max_batch:,}")
    return " · ".join(parts)


def held_rows(e: Estimate) -> dict:
    """What the GPU holds, allocated -> reserved -> device total (issue 13): the rows the page's "held" table
    shows (the estimate's own numbers, formatted) and the one sentence the reports use. The fit is judged on
    required (Estimate.fit), shown first."""
    from ..report.held import DEVICE_TOTAL_LABEL, REQUIRED_LABEL, RESERVED_LABEL, held_sentence, overhead_label
    from ..units import fmt_bytes

    m = e.memory

    def row(key: str, name: str, v: int | None) -> dict:
        return {"key": key, "name": name, "bytes": v, "text": fmt_bytes(v) if v is not None else None}

    rows = [row("peak", "peak (allocated)", m.peak)]
    if m.required is not None:
        rows.append(row("required", REQUIRED_LABEL, m.required))
    rows.append(row("reserved", RESERVED_LABEL, m.reserved))
    rows += [row(f"overhead:{k}", "+ " + overhead_label(k), v) for k, v in m.overheads.items()]
    rows.append(row("device_total", DEVICE_TOTAL_LABEL, m.device_total))
    return {"rows": rows, "sentence": held_sentence(device_total=m.device_total is not None)}


_trace_lock = threading.Lock()  # one fake-tensor trace at a time (they are CPU-bound and use global torch state)


@lru_cache(maxsize=16)
def _timeline_svg(req: Request) -> str:
    from ..report import plots

    spec = api.load_spec(req.model)
    deep = isinstance(spec, ModelSpec) and spec.layers > 16  # the whole step's curve unless deep; vision: traced whole
    while not _trace_lock.acquire(timeout=POLL_SECONDS):  # waiting for another trace: still stoppable
        cancel.check()
    try:
        traced = api.trace(req, extrapolate=deep)
    finally:
        _trace_lock.release()
    fig = plots.plot_timeline(traced, gpu=api.gpu_of(req))
    return plots.svg_text(fig)


def _catalog_estimate(knobs: Knobs) -> dict:
    req = to_request(knobs, model=_catalog_ref(knobs.model))
    return api.estimate_dict(req, api.host_memory_noted(req, api.analytic(req)))


def _pasted_estimate(knobs: PastedKnobs) -> dict:
    spec, req, e = estimate_for(knobs)
    return api.estimate_dict(req, e, spec)


def view_with_advice(knobs: PastedKnobs) -> dict:
    """The view, and where the setup does not fit, what would (the CLI's advice, checked by the engine)."""
    spec, req, e = estimate_for(knobs)
    v = view(e)
    if e.time is not None and not e.time.fits:
        v["would_fit"] = [x.line() for x in api.fit_advice(req, e, spec)]  # the CLI's advice
    return v


def _timeline_of(knobs: Knobs) -> str:
    req = to_request(knobs, model=_catalog_ref(knobs.model))
    api.refuse_host_memory(req, "the timeline draws the trace engine's step, which judges the device only",
                           "drop host_memory")
    api.resolve(req)  # bad knobs: a 400 before any trace
    return _timeline_svg(req)


class FiniteJSON(JSONResponse):
    """JSON as `trainfit estimate --json` writes it (report/json_out.py): a number that is not finite (a cost of
    --price x a huge --tokens budget overflowing to inf) is null; starlette's JSONResponse refuses it (a 500)."""

    def render(self, content: Any) -> bytes:
        from ..report.json_out import finite

        return super().render(finite(content))


def _error(status: int, message: str) -> JSONResponse:
    first = message.strip().splitlines()[0] if message.strip() else "bad request"
    return JSONResponse({"error": first}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "body"))
        if err.get("type") == "json_invalid":  # (loc: ("body", the character's position))
            why = (err.get("ctx") or {}).get("error", "")
            parts.append(f"the request body is not valid JSON at character {loc}{f' ({why})' if why else ''}: send "
                         "a JSON object of the knobs")
            continue
        parts.append(_unknown_field(loc) if err.get("type") == "extra_forbidden" else
                     f"{loc or 'request'}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"


def _unknown_field(name: str) -> str:
    """A parameter that is no knob: named, with the closest knob (the CLI's flag names with _ for -)."""
    from difflib import get_close_matches

    if name == "config":  # a PastedKnobs field, refused where only Knobs are read (the GET endpoints)
        return ("config: a pasted config.json goes in the JSON body of POST /api/estimate or /api/view "
                '({"config": {...}, knobs...}); a GET request takes a catalog model (model=NAME, see /api/models)')
    near = get_close_matches(name.replace("-", "_"), list(PastedKnobs.model_fields), n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    return (f"{name}: unknown parameter; {hint}the parameters are `trainfit estimate`'s settings with _ for - "
            "(see /api/openapi.json)")


def _once(request: HTTPRequest) -> None:
    """A query parameter given twice is refused (one value would silently win)."""
    seen = set()
    for name, _ in request.query_params.multi_items():
        if name in seen:
            raise SetupError(f"{name}: given more than once; give each parameter once")
        seen.add(name)


DEFAULT_TIME_LIMIT = cancel.DEFAULT_TIME_LIMIT
SHUTDOWN_GRACE = 1  # seconds uvicorn waits for running requests on Ctrl-C before it cancels them (and their work)
POLL_SECONDS = 0.05  # how often a waiting request looks for its client's disconnect and its deadline
LIMIT_NAME = "the time limit of `trainfit serve --time-limit`"


async def bounded(app: FastAPI, request: HTTPRequest, fn, *args):
    """fn(*args) in a worker thread as one cancel.Work under the app's time limit: stopped at the limit (answered
    at once with Stopped, a 503), when the client disconnects, or when the server stops (this task cancelled)."""
    work = cancel.Work(app.state.time_limit, LIMIT_NAME)
    app.state.running.add(work)
    # the catalog-only rule is entered in the worker thread itself (a ContextVar does not follow work there)
    job = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(_outcome, functools.partial(cancel.run, work, catalog_only()(fn)), *args))
    try:
        while True:
            done, _ = await asyncio.wait({job}, timeout=POLL_SECONDS)
            if done:
                ok, value = job.result()
                if ok:
                    return value
                raise value
            if work.expired():
                work.stop(work.timeout_message())
                raise cancel.Stopped(work.why)
            if await request.is_disconnected():
                work.stop("the client disconnected")
            if work.event.is_set():  # the client went away, or the server is stopping (stop_all)
                raise cancel.Stopped(work.why)
    except asyncio.CancelledError:  # the server is stopping (uvicorn cancels the requests still running)
        work.stop("the server is stopping")
        raise
    finally:
        app.state.running.discard(work)  # (a worker still running stops at its next cancel.check())


def _outcome(fn, *args) -> tuple[bool, object]:
    """(True, fn(*args)) or (False, the exception it raised): the worker's future never holds an exception, so
    work stopped after its request was answered (or after the server stopped) is not logged as an error nobody
    retrieved."""
    try:
        return True, fn(*args)
    except Exception as e:
        return False, e


def stop_all(app: FastAPI, why: str = "the server is stopping") -> None:
    """Stop every computation still running (at shutdown)."""
    for work in list(app.state.running):
        work.stop(why)


@asynccontextmanager
async def _lifespan(app: FastAPI):
    yield
    stop_all(app)  # the server is stopping: no computation outlives it


def create_app(time_limit: float = DEFAULT_TIME_LIMIT) -> FastAPI:
    """The app; `time_limit`: seconds each request's computation may take (503 beyond it)."""
    if not (isinstance(time_limit, (int, float)) and 0 < time_limit < float("inf")):
        raise SetupError(f"--time-limit must be a positive number of seconds, got {time_limit!r}")
    # No Swagger UI: it loads its scripts from a CDN, and this app must work offline. The schema is served.
    app = FastAPI(title="trainfit", description="Will it train (or serve) on my hardware?", docs_url=None,
                  redoc_url=None, openapi_url="/api/openapi.json", lifespan=_lifespan)
    app.state.time_limit = float(time_limit)
    app.state.running = set()  # the cancel.Work of each request computing now

    @app.exception_handler(cancel.Stopped)
    async def _stopped(request: HTTPRequest, exc: cancel.Stopped):  # the server's limit or its stop, not the user's
        if not str(exc).startswith("stopped after"):
            return _error(503, f"stopped: {exc}")
        return _error(503, f"{exc}: the request needs more than the server allows; ask for less (a smaller model, "
                           "batch or sequence) or start the server with a larger --time-limit")

    @app.exception_handler(TrainfitError)
    async def _trainfit_error(request: HTTPRequest, exc: TrainfitError):
        return _error(400, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: HTTPRequest, exc: StarletteHTTPException):  # e.g. a body FastAPI cannot parse
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: HTTPRequest, exc: RequestValidationError):
        return _error(422, _validation_message(exc))

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        from .page import PAGE

        return HTMLResponse(PAGE)

    @app.get("/api/estimate")
    async def get_estimate(request: HTTPRequest, knobs: Annotated[Knobs, Query()]) -> JSONResponse:
        """The analytic estimate for a catalog model: exactly `trainfit estimate MODEL ... --json`."""
        _once(request)
        return FiniteJSON(await bounded(app, request, _catalog_estimate, knobs))

    @app.post("/api/estimate")
    async def post_estimate(request: HTTPRequest, knobs: PastedKnobs) -> JSONResponse:
        """The same object, for a pasted config.json ({"config": ...}) or a catalog model ({"model": ...})."""
        return FiniteJSON(await bounded(app, request, _pasted_estimate, knobs))

    @app.post("/api/view")
    async def post_view(request: HTTPRequest, knobs: PastedKnobs) -> JSONResponse:
        return FiniteJSON(await bounded(app, request, view_with_advice, knobs))

    @app.get("/api/timeline.svg")
    async def get_timeline(request: HTTPRequest, knobs: Annotated[Knobs, Query()]) -> Response:
        _once(request)
        return Response(await bounded(app, request, _timeline_of, knobs), media_type="image/svg+xml")

    @app.get("/api/models")
    def get_models() -> JSONResponse:
        return JSONResponse(_models())

    @app.get("/api/gpus")
    def get_gpus() -> JSONResponse:
        from ..hardware import list_gpus

        return JSONResponse([{"name": g.name, "memory": g.memory, "vendor": g.vendor} for g in list_gpus()])

    return app


@lru_cache(maxsize=1)
def _models() -> list[dict]:
    return [{"name": m["name"], "family": m["family"], "params": m["params"]}
            for m in api.catalog_models() + api.vision_models()]
