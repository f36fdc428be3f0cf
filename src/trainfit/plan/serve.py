"""`trainfit plan MODEL --mode serve [--server vllm|sglang]`: the cheapest GPUs that serve N concurrent sequences
of --max-model-len tokens under vLLM or SGLang within a time per output token.

For each GPU type and tensor-parallel degree (a power of two within a node that divides the attention heads —
vLLM refuses others: config/model.py verify_with_parallel_config; SGLang asserts it: sglang/srt/models/llama.py:183),
one engine is sized as the server sizes it (analytic/serving.py for vLLM, analytic/serving_sglang.py for SGLang,
the setup's `server` picks); it holds min(its request limit — vLLM's max_num_seqs, SGLang's max_running_requests —,
its KV capacity in whole sequences) sequences, so N needs ceil(N / that) replicas; each replica decodes
ceil(N / replicas) sequences, one decode step of them timed op by op (analytic/serving_time.py decode_seconds:
the step's GEMMs, the paged KV reads at half of --max-model-len, TP all-reduces, the sampler, CUDA graphs). Plans within the target are ranked by price per
hour (GPUs × the catalog's, or --price), then by that time.
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
