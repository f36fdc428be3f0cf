"""Serving throughput and latency (--mode serve): vLLM V1's engine steps timed op by op, the training step's kernel
model (analytic/ops/ lists timed by the roofline, compute_time.time_ops), and continuous batching's steady state at
a concurrency and a request length mix. No utilisation constant: every kernel is the roofline's.

One engine step (vLLM 0.33 v1/worker/gpu_model_runner.py execute_model) runs every scheduled token of every request as
one flattened batch: the layers' GEMMs at M = the step's tokens (decode tokens + prefill chunk tokens), padded to the
next CUDA-graph capture size when graphs run (v1/cudagraph_dispatcher.py:71-90, 130-151);
  attention   decode: each running sequence's cached K and V read once per layer by the paged decode kernel
              (FlashAttention's / FlashInfer's split-KV decode: memory-bound, Σ context × the KV bytes per token of
              this GPU's layers and heads at the GPU's streaming bandwidth, roofline.memory_seconds); the step's new K
              and V written into the cache (reshape_and_cache: T × the KV bytes per token);
              prefill: the chunk's queries over their prompt, causal (roofline.attention_seconds, the fused kernel's
              measured fraction), the chunk's share of one prompt's attention;
  TP          RowParallelLinear's all-reduce after o_proj and down_proj (model_executor/layers/linear.py:1818
              tensor_model_parallel_all_reduce): 2 per layer of T × hidden in the model dtype (parallel/collectives.py,
              NCCL's algorithms). NB: vLLM's custom all-reduce (distributed/device_communicators/custom_all_reduce.py
              :138, :496-510, below 8 MiB) is a one-shot kernel faster than NCCL at these sizes: errs slow;
  head        the LM head over the rows that sample (the decodes and the prefills that finish: logits_indices);
  sampler     v1/sample/sampler.py:158 logits.to(float32), :300 apply_temperature div_, then
              ops/topk_topp_sampler.py:315-381 forward_cuda without top-k/top-p: fused_gumbel_argmax over the fp32
              logits — [rows, vocab] read and written at the streaming bandwidth;
  launches    with CUDA graphs (the default, FULL_AND_PIECEWISE) one replay per step: the host issues no kernel one
              by one (NB: the piecewise graphs of a mixed step replay per layer around eager attention, a few µs each,
              not counted: errs fast); --enforce-eager: every kernel from the host at the no-grad rate
              (roofline.host_seconds_per_kernel, measured), the step never faster than the host.
  scheduler   the engine core's host work per step (0.33.0 v1/engine/core.py:667-691 step, :708-793
              step_with_batch_queue): Scheduler.schedule() and update_from_output() over the step's requests, pure
              Python; seconds = fixed + per request × the requests scheduled (data/servers.toml scheduler_host,
              measured on a CPU with the version's own Scheduler: bench/tools/vllm_scheduler_cpu). With async
              scheduling (host_overlap: the default from vLLM 0.14, config/vllm.py async_scheduling None -> True;
              0.13 and earlier off) the next step is scheduled while this one runs on the GPU: a step takes
              max(GPU, host); without it, GPU + the scheduler. SGLang's overlap scheduler (on by default) overlaps
              the same way; its scheduler's cost is not measured and not counted. NB: the model runner's input
              preparation (_prepare_inputs) and the outputs' serialisation are not counted (errs fast where the host
              binds); the measuring CPU's speed is taken as the serving host's.
  API server  `vllm serve` streams every sampled token to its client from one API server process beside the
              engine core (api_server_count 1 at data parallel 1: 0.33.0 entrypoints/cli/serve.py:107-117): the
              output processor's detokenisation, the request's collector, the completion stream generator's chunk
              and its send, pure Python per token (data/servers.toml frontend_host, measured on a CPU with the
              version's own classes: bench/tools/vllm_frontend_cpu). It runs while the engine core does: a step
              takes at least the API server's time for the step's tokens. Offline runs (benchmark_latency /
              benchmark_throughput, the LLM class) have no API server: not counted there. NB: the requests' intake
              (HTTP parse, tokenisation) and the ZMQ and HTTP writes are not counted (errs fast); SGLang's tokenizer
              manager and detokenizer processes are not measured and not counted.
NB: vLLM's fused kernels (qkv and gate_up GEMMs, fused_add_rms_norm, its rotary) are timed as the stack's op list
(--stack's memory-bound ops): the GEMMs' FLOPs and bytes are the same, the elementwise launches differ.

The steady state (v1/core/sched/scheduler.py:701-720, 795, 1062: each step first gives the running requests their
next token, then fills the token budget, max_num_batched_tokens, with waiting requests' prompt chunks): C requests
in flight, each with P prompt and O output tokens, live `life` steps: its prompt in chunks, then O − 1 decode steps
(the first output token comes from its last prefill step). Per step the batch carries C × (O − 1) / life decode
tokens and C × P / life prompt tokens, never over the budget: life = max(prefill steps + O − 1,
C × (P + O − 1) / budget). TPOT = one step; TTFT = the prefill steps (+ the queue, Little's law, when C exceeds what
the engine holds at once); output tokens/s = C × O / (life × step).
NB: every request is taken at the mean mix (P, O); sequences decode at their mean context P + O / 2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import SetupError
from ..hardware import GPU
from .. import serving_versions
from ..setup import Setup
from ..spec import ModelSpec
from . import roofline
from .compute_time import ListTime, layer_kinds, time_ops
from .flops import forward_per_token
from .moe_imbalance import busiest_rank_load
from .ops import Op, compiled, head_forward, layer_forward, shape_of
from .ops.op import SIZE
from .parallel.collectives import Links, ranks_per_node
from .params import ParamCounts
from .precision import state_bytes
from .serving_state import attention_layers
from .timing import compute_dtype

FP32 = 4
CUSTOM_AR_MAX = 8 * 1024 * 1024  # custom_all_reduce.py:138 max_size=8192 * 1024


@dataclass(frozen=True)
class EngineStep:
    """One engine step's seconds by part (GPU kernels, TP all-reduces, the sampler) and the host's issue bound."""

    tokens: int  # the step's tokens as run (padded to a capture size under CUDA graphs)
    decodes: float
    prefill: float
    kernels: ListTime
    allreduce: float
    sampler: float
    host: float  # the host's time to issue the step's kernels (0 under CUDA graphs)
    scheduler: float = 0.0  # the engine's scheduler CPU time for the step (scheduler_host)
    overlapped: bool = True  # the scheduler runs while the GPU does (async scheduling / SGLang's overlap)
    api_server: float = 0.0  # the API server's CPU time streaming the step's tokens (frontend_host; its own process)

    @property
    def gpu_seconds(self) -> float:
        return self.kernels.seconds + self.allreduce + self.sampler

    @property
    def core_seconds(self) -> float:
        """The engine core's step: the GPU's and the host's (kernel issue, the scheduler)."""
        if self.overlapped:
            return max(self.gpu_seconds, self.host + self.scheduler)
        return max(self.gpu_seconds, self.host) + self.scheduler

    @property
    def seconds(self) -> float:
        return max(self.core_seconds, self.api_server)  # the API server streams beside the engine core


@dataclass(frozen=True)
class ServingTime:
    """Continuous batching's steady state at `concurrency` requests of `prompt` + `output` tokens."""

    concurrency: int  # requests the clients keep in flight
    running: float  # of them in the engine at once (the rest queue)
    prompt: int
    output: int
    life_steps: float  # engine steps from a request's admission to its last token
    prefill_steps: int
    step: EngineStep  # a step carrying prompt tokens beside the decodes
    ttft: float
    tpot: float
    output_tokens_per_second: float  # one replica (tp × pp GPUs)
    gpus: int

    @property
    def per_gpu(self) -> float:
        return self.output_tokens_per_second / self.gpus

    def as_dict(self) -> dict:
        s = self.step
        return {"concurrency": self.concurrency, "running": round(self.running, 2), "prompt_len": self.prompt,
                "output_len": self.output, "ttft_seconds": self.ttft, "tpot_seconds": self.tpot,
                "output_tokens_per_second": self.output_tokens_per_second,
                "output_tokens_per_second_per_gpu": self.per_gpu, "step_tokens": s.tokens,
                "step_decodes": round(s.decodes, 2), "step_prefill_tokens": round(s.prefill, 2),
                "step_seconds": {"gemm": s.kernels.gemm, "attention": s.kernels.attention,
                                 "memory": s.kernels.memory, "launches": s.kernels.launches,
                                 "allreduce": s.allreduce, "sampler": s.sampler, "host": s.host,
                                 "scheduler": s.scheduler, "api_server": s.api_server, "total": s.seconds}}


def padded(tokens: int, capture_sizes: tuple[int, ...]) -> int:
    """The token count a step runs at: the next capture size at or above it (cudagraph_dispatcher.py:71-90); above
    the largest, unpadded (no graph: PIECEWISE/NONE at the real size)."""
    return next((s for s in capture_sizes if s >= tokens), tokens)


def _weights_format(op: Op, setup: Setup) -> Op:
    """A layer's GEMM with --quant fp8 runs in fp8 (Fp8LinearMethod, model_executor/layers/quantization/fp8.py:225-
    232, 418-461: torch._scaled_mm / the platform's scaled-mm kernel on fp8 weights and dynamically quantised fp8
    activations): its weight bytes and FLOP rate are fp8's (the LM head stays in the model dtype: ParallelLMHead is
    not quantised). NB: the activations' quantisation kernel is not counted (tokens × hidden bytes per GEMM input:
    errs fast); --quant awq / gptq GEMMs are timed in the model dtype (their 4-bit weights read as 16-bit: errs
    slow in decode)."""
    if setup.quant == "fp8" and op.kind == "gemm" and op.wgrad:
        return op._replace(dtype="fp8")
    return op


def _step_ops(spec: ModelSpec, setup: Setup, pc: ParamCounts, gpu: GPU, tokens: int, rows: float,
              decode: bool) -> ListTime:
    """The layers' op lists at `tokens` flattened tokens without their attention core (timed apart), and the final
    norm + LM head over `rows` sampling rows. `decode`: every token is a sequence's next one (a decode-only step):
    `tokens` rows of one token, whose linear-attention / Mamba layers run their recurrent update (Shape.decode);
    else one flattened row (NB: a mixed step's decodes then run those layers' chunked form)."""
    # (MoE: the busiest rank's tokens at this step's count)
    n = max(1, tokens)
    sh = replace(shape_of(spec, setup, state_bytes(setup), compute_dtype(setup)), batch=n if decode else 1,
                 seq=1 if decode else n, decode=decode, moe_load=busiest_rank_load(spec, setup, n))
    total = ListTime()
    for w, moe, linear, block in layer_kinds(spec):
        ops = [_weights_format(o, setup) for o in layer_forward(spec, sh, moe, linear, block) if o.kind != "attention"]
        if not setup.enforce_eager:  # vLLM compiles the model with Inductor (VLLM_COMPILE, config/vllm.py:1827-1829;
            ops = compiled(ops)      # backend "inductor", config/compilation.py:461-465): its elementwise runs fused
        total = total + (w * spec.layers / setup.pp) * time_ops(gpu, ops)
    return total + time_ops(gpu, head_forward(spec, sh, logits_rows=max(1.0, rows)))


def allreduce_seconds(gpu: GPU, tp: int, nbytes: float) -> float:
    """One TP all-reduce of `nbytes` as vLLM runs it: below its custom all-reduce's limit (custom_all_reduce.py:138,
    max_size 8 MiB; :496-510 should_custom_ar) on fully connected GPUs its own kernel (csrc/custom_all_reduce.cuh
    allreduce, REDUCE_CASE): one stage, every rank reading the n − 1 peers' whole buffers, below 512 KiB at <= 4
    GPUs or 256 KiB at <= 8 (2 GPUs always); else two stages, a reduce-scatter and an all-gather of 1 / n each from
    every peer — at the GPU's link bandwidth (parallel/collectives.Links.intra), one launch. Larger: NCCL's
    algorithms (parallel/collectives.py). NB: the kernels' flag barriers (a few µs of peer round trips) are not
    counted: errs fast."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    links = Links.of(gpu)
    if nbytes >= CUSTOM_AR_MAX or not links.within_node(tp):
        return links.allreduce(tp, ranks_per_node(1, tp, gpu.gpus_per_node), nbytes)
    one_stage = tp == 2 or (tp <= 4 and nbytes < 512 * 1024) or (tp <= 8 and nbytes < 256 * 1024)
    moved = (tp - 1) * nbytes if one_stage else 2 * (tp - 1) / tp * nbytes
    return moved / links.intra + roofline.kernels_for(gpu).launch_seconds


def scheduler_seconds(setup: Setup, requests: float) -> tuple[float, bool]:
    """(the engine's scheduler CPU seconds for a step of `requests` scheduled requests, whether it overlaps the GPU):
    the version's measured line (data/servers.toml scheduler_host [fixed, per request]; absent: not measured, 0) and
    host_overlap (module docstring)."""
    facts = serving_versions.parse(setup.server or "vllm").facts
    fixed, per = facts.get("scheduler_host", (0.0, 0.0))
    return (fixed + per * max(0.0, requests) if requests > 0 else 0.0), facts["host_overlap"]


def api_server_seconds(setup: Setup, streamed: float) -> float:
    """The API server's CPU seconds streaming `streamed` tokens to their clients (module docstring): the version's
    measured seconds per token (data/servers.toml frontend_host; absent: not measured, 0)."""
    return serving_versions.parse(setup.server or "vllm").facts.get("frontend_host", 0.0) * max(0.0, streamed)


def engine_step(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, kv_bytes_per_token: float,
                decodes: float, context: float, prefill: float, prompt: int, capture_sizes: tuple[int, ...],
                finishing: float = 0.0, prefill_mfu: float | None = None, state: float = 0.0,
                requests: float | None = None, streamed: bool = False) -> EngineStep:
    """One step of `decodes` sequences at mean `context` cached tokens and `prefill` prompt tokens of `prompt`-token
    requests (`finishing` of them sample this step). kv_bytes_per_token: this GPU's, every layer (serving.py).
    prefill_mfu (--mfu): the prefill tokens timed at that model-FLOPs utilisation instead of their kernels.
    state: one sequence's linear-attention / Mamba states on this GPU (serving_state), read and written per decode.
    requests: the requests the scheduler schedules this step (default: the decodes and the finishing prefills).
    streamed: the sampled tokens go to clients through the API server (`vllm serve`; offline: not)."""
    graphs = bool(capture_sizes)
    real = max(1, math.ceil(decodes + (0 if prefill_mfu else prefill)))
    tokens = padded(real, capture_sizes) if graphs else real
    rows = decodes + finishing
    decode_only = not prefill or bool(prefill_mfu)
    kernels = _step_ops(spec, setup, pc, gpu, tokens, rows, decode_only)
    layers = spec.layers / setup.pp
    dtype = compute_dtype(setup)
    # decode attention: every cached token's K and V of this GPU's layers, once (memory-bound split-KV decode)
    # (this GPU's stage already: serving.py); a mixed step's decodes also read and write their recurrent states,
    # which a decode-only step's op list updates itself
    kv_read = decodes * (context * kv_bytes_per_token + (0 if decode_only else 2 * state))
    kv_write = real * kv_bytes_per_token  # reshape_and_cache: the step's new K and V
    attn_layers = attention_layers(spec) / setup.pp
    attn = roofline.memory_seconds(gpu, kv_read + kv_write, 0)  # (its launches: one per attention layer, below)
    launch = roofline.kernels_for(gpu).launch_seconds
    if prefill and not prefill_mfu:  # the chunk's share of its prompt's causal attention (fused kernel)
        heads = spec.heads / setup.tp
        one = roofline.attention_seconds(gpu, setup.attention_kernel, heads, prompt, prompt, spec.head_dim,
                                         True, dtype, False) - launch
        attn += attn_layers * one * prefill / prompt
    kernels = kernels + ListTime(attention=attn, launches=attn_layers * launch, kernels=attn_layers)
    if prefill_mfu:  # --mfu names the prefill's utilisation: its FLOPs at that share of the peak
        f = forward_per_token(spec, prompt, pc) * prefill / (setup.tp * setup.pp)
        kernels = kernels + ListTime(gemm=f / (gpu.flops_for(dtype) * prefill_mfu))
    # TP: two all-reduces per layer of the step's hidden states (RowParallelLinear, linear.py:1818)
    ar = 2 * layers * allreduce_seconds(gpu, setup.tp, tokens * spec.hidden * SIZE.get(dtype, 2))
    # sampler over [rows, vocab]: the fp32 cast (2 + 4 bytes), the temperature's in-place divide (4 + 4), the fused
    # Gumbel argmax's read (4); three kernels
    elems = max(1.0, rows) * spec.vocab
    sampler = roofline.memory_seconds(gpu, elems * (SIZE.get(dtype, 2) + FP32 + 2 * FP32 + FP32), 3)
    graphed = graphs and real <= capture_sizes[-1]
    host = 0.0 if graphed else kernels.kernels * roofline.host_seconds_per_kernel(no_grad=True)
    if graphed:  # a graph replays its kernels without per-kernel launches (ops/cuda_graphs.py's rule and its NB)
        kernels = kernels._replace(launches=0.0)
    sched, overlapped = scheduler_seconds(setup, decodes + finishing if requests is None else requests)
    api = api_server_seconds(setup, rows) if streamed else 0.0  # every sampled token is one streamed event
    return EngineStep(tokens, decodes, prefill, kernels, ar, sampler, host, sched, overlapped, api)


def steady_state(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, kv_bytes_per_token: float,
                 budget: int, max_seqs: int, kv_tokens: int, capture_sizes: tuple[int, ...], concurrency: int | None,
                 prompt: int, output: int, prefill_mfu: float | None = None, state: float = 0.0,
                 streamed: bool = True) -> ServingTime:
    """Continuous batching at `concurrency` requests of `prompt` + `output` tokens (module doc). budget:
    max_num_batched_tokens; max_seqs: max_num_seqs; kv_tokens: the KV pool's tokens (what it holds at once);
    concurrency None: as many requests as the engine holds at once. streamed: through the API server (`vllm
    serve`, the default); False: offline (benchmark_throughput's LLM class)."""
    held = min(max_seqs, kv_tokens // (prompt + output))
    if held < 1:
        raise SetupError(f"a request of --prompt-len {prompt} + --completion-len {output} tokens does not fit the "
                         f"{kv_tokens:,}-token KV cache; shorten them or give the engine more memory")
    concurrency = held if concurrency is None else concurrency
    running = min(concurrency, held)
    # a request's prompt goes in chunks of what the running decodes leave of the budget; iterate to the fixed point
    decodes = running * max(0, output - 1) / max(1, output)
    for _ in range(4):
        chunk = max(1.0, budget - decodes)
        prefill_steps = math.ceil(prompt / chunk)
        life = max(prefill_steps + output - 1, running * (prompt + output - 1) / budget)
        decodes = running * (output - 1) / life
    # the steps that carry prompt tokens: each request's own chunks (NB: prompts sharing a step when more than one
    # waits are not packed: over by their steps' weight reads), all steps when the budget binds
    carrying = min(life, running * prefill_steps)
    context = prompt + output / 2

    def step(prefill: float, finishing: float, prefilling: float) -> EngineStep:
        return engine_step(spec, setup, gpu, pc, kv_bytes_per_token, decodes, context, prefill, prompt,
                           capture_sizes, finishing, prefill_mfu, state, decodes + prefilling, streamed)

    # the scheduler walks every request it schedules: the decodes and the requests whose prompt chunk runs
    with_prompt = step(running * prompt / carrying, running / carrying, running * prefill_steps / carrying)
    plain = step(0.0, 0.0, 0.0) if carrying < life else with_prompt
    total = carrying * with_prompt.seconds + (life - carrying) * plain.seconds  # one request's life, seconds
    rate = running / total  # requests completed per second
    # Little's law: the requests beyond what the engine holds wait (concurrency - running) / rate in the queue
    ttft = (concurrency - running) / rate + prefill_steps * with_prompt.seconds
    tpot = total / life  # a decoding sequence gets a token every step, prompt-carrying or not
    return ServingTime(concurrency, running, prompt, output, life, prefill_steps, with_prompt, ttft, tpot,
                       rate * output, setup.tp * setup.pp)


def batch_latency(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, kv_bytes_per_token: float, batch: int,
                  prompt: int, output: int, capture_sizes: tuple[int, ...], budget: int, max_seqs: int | None = None,
                  kv_tokens: int | None = None, streamed: bool = False) -> float:
    """Seconds for one batch of `batch` requests submitted together (vLLM's benchmarks/benchmark_latency.py: one
    llm.generate of `batch` prompts, ignore_eos): their prompts in ceil(batch × prompt / budget) steps, then
    output − 1 decode steps of the whole batch at its mean context prompt + output / 2.
    The engine runs at most what it holds at once: max_num_seqs requests (the scheduler stops admitting at
    len(running) == max_num_running_reqs, 0.19.0 v1/core/sched/scheduler.py:105, :568) whose prompt + output tokens
    the KV pool (`kv_tokens`) holds; the rest wait, and equal requests finish together, so the batch runs in
    ceil(batch / held) waves one after another. NB: taken as equal waves of ceil(batch / waves) (the scheduler fills
    full waves, then a remainder: equal under a step time affine in the batch; padding and tiles differ); a KV-bound
    engine admits by the prompt's blocks and preempts as decodes grow (v1 allocate_slots on demand): not modelled.
    streamed: the batch is sent to `vllm serve` at once and streamed back through its API server (module doc)."""
    held = min(batch, max_seqs or batch, kv_tokens // (prompt + output) if kv_tokens is not None else batch)
    waves = math.ceil(batch / max(1, held))
    if waves > 1:
        return waves * batch_latency(spec, setup, gpu, pc, kv_bytes_per_token, math.ceil(batch / waves), prompt,
                                     output, capture_sizes, budget, streamed=streamed)
    steps = math.ceil(batch * prompt / budget)
    pre = engine_step(spec, setup, gpu, pc, kv_bytes_per_token, 0.0, 0.0, batch * prompt / steps, prompt,
                      capture_sizes, finishing=batch / steps, streamed=streamed)
    dec = engine_step(spec, setup, gpu, pc, kv_bytes_per_token, batch, prompt + output / 2, 0.0, prompt,
                      capture_sizes, streamed=streamed)
    return steps * pre.seconds + (output - 1) * dec.seconds


def vllm(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, sv, prefill_mfu: float | None = None) -> ServingTime:
    """vLLM's engine (analytic/serving.py's Serving `sv`) at --concurrency, --prompt-len and --completion-len."""
    k = sv.knobs
    return steady_state(spec, setup, gpu, pc, sv.kv_bytes_per_token,
                        k.max_num_batched_tokens, k.max_num_seqs, sv.kv_tokens, k.capture_sizes, setup.concurrency,
                        setup.prompt_len, setup.completion_len, prefill_mfu, sv.state_bytes)


def decode_seconds(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, sv, sequences: int) -> float:
    """One decode step of `sequences` requests at half the engine's longest request (`sv.context`) on average, on
    either server's engine (`sv`: serving.py's or serving_sglang.py's Serving): the planner's load."""
    k = sv.knobs
    sizes = tuple(range(1, k.cuda_graph_max_bs + 1)) if serving_versions.engine_of(setup.server) == "sglang" else k.capture_sizes
    return engine_step(spec, setup, gpu, pc, sv.kv_bytes_per_token, sequences, sv.context / 2, 0.0, 1, sizes,
                       state=sv.state_bytes, streamed=True).seconds


def sglang(spec: ModelSpec, setup: Setup, gpu: GPU, pc: ParamCounts, sv, prefill_mfu: float | None = None) -> ServingTime:
    """SGLang's engine (analytic/serving_sglang.py's Serving `sv`): its scheduler fills chunked_prefill_size tokens per
    step beside max_running_requests decodes, the same continuous batching; decode CUDA graphs up to
    cuda_graph_max_bs. NB: every batch size taken as captured (SGLang pads to its capture list: errs fast)."""
    k = sv.knobs
    sizes = tuple(range(1, k.cuda_graph_max_bs + 1))
    return steady_state(spec, setup, gpu, pc, sv.kv_bytes_per_token, k.chunked_prefill_size, sv.max_running_requests,
                        sv.kv_tokens, sizes, setup.concurrency, setup.prompt_len, setup.completion_len, prefill_mfu, sv.state_bytes)


__all__ = ["EngineStep", "ServingTime", "engine_step", "scheduler_seconds", "api_server_seconds", "steady_state", "batch_latency", "padded", "allreduce_seconds",
           "decode_seconds", "vllm", "sglang"]
