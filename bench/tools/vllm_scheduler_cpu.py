"""vLLM V1's scheduler CPU time per engine step, measured on this machine's CPU: the source of data/servers.toml
[vllm.versions.X] scheduler_host (analytic/serving_time.py host_seconds).

The engine core's host work around each step (v1/engine/core.py step / step_with_batch_queue) is
Scheduler.schedule() (v1/core/sched/scheduler.py) and Scheduler.update_from_output() on the model runner's output.
Both are pure Python over the running requests; they run on a CPU here with the version's own classes, no GPU:
N requests of a 512-token prompt are prefilled, then 200 decode steps of all N are timed (one token sampled per
request per step, prefix caching on with its default sha256 block hash: the `vllm serve` defaults), by the thread's
CPU time (time.thread_time: a shared, loaded CPU's waits do not count; its contended caches and SMT siblings do:
repeated runs here spread ±20 %). Printed: the median schedule + update seconds per step at each N and their
least-squares seconds per request.

vLLM is not a dependency: unpack the version's wheel (pip download vllm==X --no-deps; unzip 'vllm/*.py') and its
pure-Python requirements (pip install --no-deps --target DIR: cbor2 cachetools msgspec pyzmq blake3 cloudpickle
pybase64 prometheus_client diskcache setproctitle partial-json-parser sentencepiece gguf uvloop openai-harmony
openai llguidance xgrammar apache-tvm-ffi) and pass those folders; the compiled vllm._C is not needed (the scheduler
imports none of it), torch is this environment's.

    python -m bench run vllm_scheduler_cpu --path UNPACKED_WHEEL:DEPS_DIR [--requests 16 64 256 500]

NB: not timed (the measured line is under the engine's host work per step): the model runner's input preparation
(v1/worker/gpu_model_runner.py _prepare_inputs: numpy over the batch, then the host-to-device copies), the outputs'
serialisation to the API server process, and the API server's detokenisation and streaming (its own process).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ABOUT = {"summary": "vLLM V1 scheduler CPU seconds per decode step vs running requests (needs an unpacked vLLM)",
         "minutes": 2, "quick": None}

PROBE = r'''
import inspect, json, statistics, sys, time
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
try:
    from vllm.utils.hashing import get_hash_fn_by_name
except ImportError:  # 0.11.x keeps it in vllm/utils/__init__.py
    from vllm.utils import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

model, counts, steps = sys.argv[1], [int(a) for a in sys.argv[2].split(",")], int(sys.argv[3])
BLOCK, PROMPT, LEN = 16, 512, 2048


def scheduler(n):
    mc = ModelConfig(model=model, skip_tokenizer_init=True, max_model_len=LEN, dtype="bfloat16")
    fields = inspect.signature(SchedulerConfig).parameters
    sc = SchedulerConfig(**{k: v for k, v in dict(max_num_seqs=1024, max_num_batched_tokens=8192, max_model_len=LEN,
                                                 is_encoder_decoder=False).items() if k in fields})
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=CacheConfig(block_size=BLOCK),
                    device_config=DeviceConfig(device="cpu"))
    blocks = n * (LEN // BLOCK) + 10
    vc.cache_config.num_gpu_blocks = blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    more = {"block_size": BLOCK} if "block_size" in inspect.signature(Scheduler).parameters else {}
    s = Scheduler(vllm_config=vc, kv_cache_config=kv, log_stats=True,
                  structured_output_manager=StructuredOutputManager(vc), **more)
    fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    hasher = get_request_block_hasher(BLOCK, fn)
    sp = SamplingParams(max_tokens=10**6, ignore_eos=True)
    extra = {"eos_token_id": None} if "eos_token_id" in inspect.signature(Request).parameters else {}
    for i in range(n):  # distinct prompts: no prefix hits
        s.add_request(Request(str(i), [i] + list(range(PROMPT - 1)), sp, None, block_hasher=hasher, **extra))
    return s


def output(so):
    ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[7]] * len(ids), logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[])


rows = []
for n in counts:
    s = scheduler(n)
    while True:
        so = s.schedule()
        s.update_from_output(so, output(so))
        if len(so.num_scheduled_tokens) == n and sum(so.num_scheduled_tokens.values()) == n:
            break
    took = []
    for _ in range(steps):
        t0 = time.thread_time()
        so = s.schedule()
        s.update_from_output(so, output(so))
        took.append(time.thread_time() - t0)
        assert sum(so.num_scheduled_tokens.values()) == n
    rows.append([n, statistics.median(took)])
print(json.dumps(rows))
'''


def fit(rows: list[list[float]]) -> float:
    """Least-squares seconds per request of seconds = per × n (through the origin: a step with no request schedules
    nothing; the fixed part, ~40 us at one request, is under the noise of a shared CPU at hundreds)."""
    return sum(n * t for n, t in rows) / sum(n * n for n, _ in rows)


def run_probe(probe: str, path: str, folder: str, requests: list[int], steps: int) -> list | None:
    """Run a probe (its source) over the unpacked vLLM at `path` in its own interpreter: its last line's JSON rows of
    [requests, seconds per step]; None (its error printed) when it fails."""
    env = {**os.environ, "PYTHONPATH": path, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, "-c", probe, folder, ",".join(map(str, requests)), str(steps)], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(probe: str, path: str, folder: str, requests: list[int], steps: int, what: str, per: str) -> int:
    """run_probe, then print each row's seconds per step (`what` names them) and the fit's seconds per `per`; the
    exit status."""
    rows = run_probe(probe, path, folder, requests, steps)
    if rows is None:
        return 1
    for n, s in rows:
        print(f"{n:5d} {what} {s * 1e6:8.0f} us per step")
    print(f"fit: {fit(rows) * 1e6:.2f} us per {per}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="folders holding the unpacked vllm package and its requirements")
    p.add_argument("--requests", type=int, nargs="+", default=[16, 64, 256, 500])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--model-config", default="qwen3-0.6b", help="a catalog model: its config.json (no weights)")
    a = p.parse_args(argv)
    from bench import ROOT

    folder = tempfile.mkdtemp()
    with open(ROOT / "src" / "trainfit" / "models" / "catalog" / f"{a.model_config}.json") as f:
        cfg = json.load(f)
    cfg.pop("_trainfit", None)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return measure(PROBE, a.path, folder, a.requests, a.steps, "running requests: schedule + update_from_output",
                   "request")


if __name__ == "__main__":
    raise SystemExit(main())
