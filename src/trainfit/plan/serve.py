"""`trainfit plan MODEL --mode serve [--server vllm|sglang]`: the cheapest GPUs that serve N concurrent sequences
of --max-model-len tokens under vLLM or SGLang within a time per output token, or a request rate within TTFT and
TPOT targets.

For each GPU type and tensor-parallel degree (a power of two within a node that divides the attention heads —
vLLM refuses others: config/model.py verify_with_parallel_config; SGLang asserts it: sglang/srt/models/llama.py:183),
one engine is sized as the server sizes it (analytic/serving.py for vLLM, analytic/serving_sglang.py for SGLang,
the setup's `server` picks); it holds min(its request limit — vLLM's max_num_seqs, SGLang's max_running_requests —,
its KV capacity in whole sequences) sequences, so N needs ceil(N / that) replicas; each replica decodes
ceil(N / replicas) sequences, one decode step of them timed op by op (analytic/serving_time.py decode_seconds:
the step's GEMMs, the paged KV reads at half of --max-model-len, TP all-reduces, the sampler, CUDA graphs). Plans within the target are ranked by price per
hour (GPUs × the catalog's, or --price), then by that time.

With --request-rate R (requests/s of --prompt-len + --completion-len tokens; serve_rate_plans) each engine is timed
under load by serving_time's continuous batching (steady_state: TTFT, TPOT and the requests it completes per second
at C requests in flight, C up to what it holds at once): the most requests/s r it completes with TTFT and TPOT within
--ttft-ms and --tpot-ms (the largest such C: both grow with C, as does r) sets ceil(R / r) replicas; each replica
then carries R / replicas, and its TTFT and TPOT are those at the fewest requests in flight that complete that rate.
NB: a replica's load is taken as the closed loop of C clients (vllm bench serve --max-concurrency), not Poisson
arrivals: a Poisson queue at the same mean rate waits longer (errs fast on TTFT).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import engines, serving_versions
from ..analytic import serving, serving_sglang, serving_time
from ..analytic.params import count_params
from ..analytic.layout import validate_layout
from ..errors import SetupError
from ..hardware import GPU
from ..setup import Setup
from ..spec import ModelSpec



@dataclass(frozen=True)
class ServePlan:
    gpu: str
    tp: int
    replicas: int
    sequences_per_replica: int
    kv_tokens: int  # per replica
    tpot_seconds: float  # time per output token at that load
    price_per_hour: float  # all GPUs
    setup: Setup = field(repr=False)

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "tp": self.tp, "replicas": self.replicas, "gpus": self.gpus,
                "sequences_per_replica": self.sequences_per_replica, "kv_tokens_per_replica": self.kv_tokens,
                "tpot_seconds": self.tpot_seconds, "price_per_hour": self.price_per_hour}


@dataclass(frozen=True)
class RatePlan:
    gpu: str
    tp: int
    replicas: int
    in_flight: int  # requests in flight per replica at its share of the rate
    requests_per_second: float  # per replica, at that load
    ttft_seconds: float
    tpot_seconds: float
    price_per_hour: float
    setup: Setup = field(repr=False)

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "tp": self.tp, "replicas": self.replicas, "gpus": self.gpus,
                "in_flight_per_replica": self.in_flight, "requests_per_second_per_replica": self.requests_per_second,
                "ttft_seconds": self.ttft_seconds, "tpot_seconds": self.tpot_seconds,
                "price_per_hour": self.price_per_hour}


def tp_degrees(spec: ModelSpec, gpu: GPU) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16) if t <= gpu.gpus_per_node and spec.heads % t == 0]


def server_model(setup: Setup):
    """The module that sizes the setup's server: serve_memory; its Serving has
    `max_sequences` (the server's request limit) and `context` (the longest request, tokens)."""
    return serving_sglang if serving_versions.engine_of(setup.server) == "sglang" else serving


def serve_plans(spec: ModelSpec, gpus: list[GPU], concurrency: int, base: Setup, tpot: float | None,
                top: int = 5, tp: int | None = None) -> tuple[list[ServePlan], list[str]]:
    """The plans that serve `concurrency` sequences (cheapest first, the `top` of them) and a line per GPU type that
    cannot. `tp`: only that tensor-parallel degree is searched (a constraint before the ranking), refused in one
    line when the model cannot split its heads over it (the estimate's own check, engine.validate_layout)."""
    if concurrency < 1:
        raise SetupError(f"--concurrency must be a positive integer, got {concurrency}")
    if tp is not None:
        validate_layout(spec, base.with_(tp=tp))
    plans, why_not = [], []
    pc = count_params(spec)
    model = server_model(base)
    for gpu in gpus:
        best_reason = None
        degrees = tp_degrees(spec, gpu) if tp is None else [tp]
        if tp is not None and tp > gpu.gpus_per_node:
            why_not.append(f"{gpu.name}: --tp {tp} exceeds its {gpu.gpus_per_node} GPUs per node")
            continue
        for degree in degrees:
            setup = base.with_(tp=degree)
            try:
                sv = model.serve_memory(spec, setup, gpu)
                fits = engines.analytic(spec, setup, gpu).time.fits
            except SetupError as e:
                best_reason = str(e)
                continue
            per_replica = serving.concurrency(sv)
            if not fits or per_replica < 1:
                best_reason = f"tp up to {degree} holds no {sv.context}-token sequence"
                continue
            replicas = math.ceil(concurrency / per_replica)
            load = math.ceil(concurrency / replicas)
            t = serving_time.decode_seconds(spec, setup, gpu, pc, sv, load)
            if tpot is not None and t > tpot:
                best_reason = f"{t * 1e3:.1f} ms per token at best (tp {degree})"
                continue
            plans.append(ServePlan(gpu.name, degree, replicas, load, sv.kv_tokens, t,
                                   replicas * degree * gpu.price_per_hour, setup))
        if best_reason and not any(p.gpu == gpu.name for p in plans):
            why_not.append(f"{gpu.name}: {best_reason}")
    plans.sort(key=lambda p: (p.price_per_hour, p.tpot_seconds, p.gpus))
    return plans[:top], why_not


def _load(spec, setup, gpu, pc, sv, in_flight: int):
    """serving_time's steady state of this engine at `in_flight` requests (either server)."""
    at = setup.with_(concurrency=in_flight)
    if serving_versions.engine_of(setup.server) == "sglang":
        return serving_time.sglang(spec, at, gpu, pc, sv)
    return serving_time.vllm(spec, at, gpu, pc, sv)


def _largest(lo: int, hi: int, ok) -> int:
    """The largest n in [lo, hi] with ok(n), ok monotone (true then false); lo − 1 when none."""
    if not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def serve_rate_plans(spec: ModelSpec, gpus: list[GPU], rate: float, base: Setup, ttft: float | None,
                     tpot: float | None, top: int = 5, tp: int | None = None) -> tuple[list[RatePlan], list[str]]:
    """The plans that serve `rate` requests/s of base.prompt_len + base.completion_len tokens within `ttft` and
    `tpot` seconds (module doc), cheapest first, and a line per GPU type that cannot."""
    if tp is not None:
        validate_layout(spec, base.with_(tp=tp))
    plans, why_not = [], []
    pc = count_params(spec)
    model = server_model(base)
    request = base.prompt_len + base.completion_len
    if base.max_model_len is not None and request > base.max_model_len:
        # the server refuses a request past its model length, and the estimate serves none (analytic/engine.py
        # _serving_estimate): no replica count serves the rate
        raise SetupError(f"--max-model-len {base.max_model_len:,} is shorter than one request (--prompt-len "
                         f"{base.prompt_len} + --completion-len {base.completion_len} = {request:,} tokens), which "
                         f"the server refuses: raise --max-model-len to at least {request}, or drop it (default: one "
                         "request's length)")
    for gpu in gpus:
        reason = None
        if tp is not None and tp > gpu.gpus_per_node:
            why_not.append(f"{gpu.name}: --tp {tp} exceeds its {gpu.gpus_per_node} GPUs per node")
            continue
        for degree in tp_degrees(spec, gpu) if tp is None else [tp]:
            setup = base.with_(tp=degree)
            try:
                sv = model.serve_memory(spec, setup, gpu)
                fits = engines.analytic(spec, setup, gpu).time.fits
            except SetupError as e:
                reason = str(e)
                continue
            held = min(sv.max_sequences, sv.kv_tokens // request)
            if not fits or held < 1:
                reason = f"tp up to {degree} holds no {request}-token request"
                continue
            cache = {}

            def at(c):
                if c not in cache:
                    cache[c] = _load(spec, setup, gpu, pc, sv, c)
                return cache[c]

            def within(c):
                st = at(c)
                return (ttft is None or st.ttft <= ttft) and (tpot is None or st.tpot <= tpot)

            most = _largest(1, held, within)
            if most < 1:
                st = at(1)
                reason = f"TTFT {st.ttft * 1e3:.1f} ms, TPOT {st.tpot * 1e3:.1f} ms at one request (tp {degree})"
                continue
            replicas = math.ceil(rate / _rate(at(most)))  # the most requests/s one replica completes in target
            share = rate / replicas
            # the fewest requests in flight that complete the replica's share (requests/s grows with them)
            c = _largest(1, most, lambda n: n == 1 or _rate(at(n - 1)) < share)
            st = at(c)
            plans.append(RatePlan(gpu.name, degree, replicas, c, _rate(st), st.ttft, st.tpot,
                                  replicas * degree * gpu.price_per_hour, setup.with_(concurrency=c)))
        if reason and not any(p.gpu == gpu.name for p in plans):
            why_not.append(f"{gpu.name}: {reason}")
    plans.sort(key=lambda p: (p.price_per_hour, p.ttft_seconds + p.tpot_seconds, p.gpus))
    return plans[:top], why_not


def _rate(st) -> float:
    """Requests one replica completes per second at steady state st (its output tokens/s over each request's)."""
    return st.output_tokens_per_second / st.output
