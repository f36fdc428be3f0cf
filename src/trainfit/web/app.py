"""`trainfit serve`: a local web app on FastAPI (the `web` extra: fastapi + uvicorn).

Routes
  GET  /                      the page (page.py: one HTML document, vanilla JS, nothing fetched from elsewhere)
  GET  /api/estimate?model=…  exactly `api.analytic(req).to_dict()`, the object `trainfit estimate --json` prints
  POST /api/estimate          the same, for a pasted config.json: {"config": {...} or "<json text>", knobs...}
  POST /api/view              what the page shows: the estimate plus its formatted rows, the phase chart's bars
                              and what the GPU holds (allocated peak, reserved, overheads, device total: `held`)
  GET  /api/timeline.svg?…    the trace engine's memory timeline, resolved as `trainfit estimate --engine trace` (api.trace;
                              needs trainfit[torch]; seconds per call)
  GET  /api/models, /api/gpus the catalogs (for the page's dropdowns)

Every error a user can cause answers HTTP 400 (a TrainfitError: unknown model, batch 0, tp not dividing the
heads, a malformed pasted config) or 422 (a parameter of the wrong type), with the body {"error": "<one line>"}.
The app computes nothing itself: the numbers come from trainfit.api and the formatting from trainfit.report.
"""
from __future__ import annotations

import os
import threading
from functools import lru_cache
from typing import Annotated, Any, Optional, Union

from fastapi import FastAPI, Query
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BeforeValidator, ConfigDict, create_model

from .. import api
from ..errors import ConfigError, SetupError, TrainfitError
from ..estimate import Estimate
from ..setup import SETTINGS, Request, Setting, parse_value


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
# fields): the same names, defaults and validation as `trainfit estimate`. Blank fields take the defaults.
Knobs = create_model("Knobs", __config__=ConfigDict(extra="ignore"), model=(Optional[str], None),
                     **{s.name: (_knob_type(s), s.request_default) for s in SETTINGS})


class PastedKnobs(Knobs):
    config: Union[dict[str, Any], str, None] = None  # a pasted config.json (object or its text)


def to_request(k: Knobs, model: str | None = None) -> Request:
    if isinstance(k.gpu, str) and k.gpu.strip():
        from ..hardware import is_gpu_file

        if is_gpu_file(k.gpu):  # the server reads no files named by a request
            raise SetupError(f"gpu {k.gpu.strip()!r}: the web app takes catalog GPU names (see /api/gpus); set "
                             "gpu_memory for another memory size")
    values = {}
    for s in SETTINGS:
        v = getattr(k, s.name)
        if isinstance(v, str) and not v.strip():
            v = None
        if v is None and s.request_default is not None:
            continue  # blank -> the CLI default
        values[s.name] = parse_value(s, v)
    return Request(model=model if model is not None else (k.model or ""), **values)


def _catalog_ref(model: str | None) -> str:
    """The web app resolves catalog names and cached hub ids, not paths on the server's disk."""
    if model is None or not model.strip():
        raise SetupError("choose a model: a catalog name (see /api/models) or paste a config.json")
    m = model.strip()
    if m.startswith(("/", ".", "~")) or "\\" in m or os.path.exists(m):
        raise SetupError(f"model {m!r}: the web app takes catalog names or hub ids; paste a config.json for other models")
    return m


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

    data = parse_config(k.config)
    name = str(data.get("_name_or_path") or data.get("model_type") or "pasted-config").split("/")[-1] or "pasted-config"
    req = to_request(k, model=name)
    return spec_from_config(data, name, source="pasted config.json"), req


def estimate_for(k: PastedKnobs):
    """(spec, request, the analytic Estimate) for a catalog model or a pasted config.json (as api.analytic)."""
    try:
        spec, req = _spec_and_request(k)
        return spec, req, api.analytic(req, spec)
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
    from ..report.held import fit_numbers
    from ..report.terminal import PHASE_NAMES, memory_rows, setup_line
    from ..units import fmt_bytes, fmt_count, fmt_seconds

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
        summary.update(fits=t.fits, gpu=t.gpu, headroom=t.headroom, headroom_text=fmt_bytes(t.headroom),
                       device_total=m.device_total, gpu_memory=t.gpu_memory, judged_text=judged)
        if e.setup.mode == "train":
            summary.update(time_text=f"step {fmt_seconds(t.step_seconds)} at MFU {t.mfu:.0%} · "
                                     f"{fmt_count(t.tokens_per_second)} tokens/s")
        else:
            summary.update(time_text=f"prefill {fmt_seconds(t.prefill_seconds)} · decode "
                                     f"{t.decode_tokens_per_second:,.0f} tokens/s · max batch {t.max_batch:,}")
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
    with _trace_lock:
        traced = api.trace(req, extrapolate=spec.layers > 16)
    fig = plots.plot_timeline(traced, gpu=api.gpu_of(req))
    return plots.svg_text(fig)


def _error(status: int, message: str) -> JSONResponse:
    first = message.strip().splitlines()[0] if message.strip() else "bad request"
    return JSONResponse({"error": first}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "body"))
        parts.append(f"{loc or 'request'}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"


def create_app() -> FastAPI:
    # No Swagger UI: it loads its scripts from a CDN, and this app must work offline. The schema is served.
    app = FastAPI(title="trainfit", description="Will it train (or serve) on my hardware?", docs_url=None,
                  redoc_url=None, openapi_url="/api/openapi.json")

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
    def get_estimate(knobs: Annotated[Knobs, Query()]) -> JSONResponse:
        """The analytic estimate for a catalog model: exactly `trainfit estimate MODEL ... --json`."""
        return JSONResponse(api.analytic(to_request(knobs, model=_catalog_ref(knobs.model))).to_dict())

    @app.post("/api/estimate")
    def post_estimate(knobs: PastedKnobs) -> JSONResponse:
        """The same object, for a pasted config.json ({"config": ...}) or a catalog model ({"model": ...})."""
        return JSONResponse(estimate_for(knobs)[2].to_dict())

    @app.post("/api/view")
    def post_view(knobs: PastedKnobs) -> JSONResponse:
        spec, req, e = estimate_for(knobs)
        v = view(e)
        if e.time is not None and not e.time.fits:  # what would fit: the CLI's advice, checked by the engine
            from ..studies.fit_advice import fit_advice

            v["would_fit"] = fit_advice(spec, e.setup, api.gpu_of(req), reserve=req.reserve)
        return JSONResponse(v)

    @app.get("/api/timeline.svg")
    def get_timeline(knobs: Annotated[Knobs, Query()]) -> Response:
        req = to_request(knobs, model=_catalog_ref(knobs.model))
        api.resolve(req)  # bad knobs: a 400 before any trace
        return Response(_timeline_svg(req), media_type="image/svg+xml")

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
