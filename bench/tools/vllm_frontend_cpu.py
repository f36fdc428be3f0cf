"""vLLM's API server CPU time per streamed output token, measured on this machine's CPU: the source of
data/servers.toml [vllm.versions.X] frontend_host (analytic/serving_time.py api_server_seconds).

`vllm serve` runs the engine core (scheduler, model runner) in one process and the OpenAI API server in another
(v1/engine/async_llm.py AsyncLLM over core_client.py's AsyncMPClient). For every engine step the API server turns each
request's new token into one server-sent event, in pure Python: OutputProcessor.process_outputs (v1/engine/
output_processor.py: incremental detokenisation, a RequestOutput into the request's RequestOutputCollector, in chunks
of VLLM_V1_OUTPUT_PROC_CHUNK_SIZE = 128 with a yield to the event loop between them: async_llm.py output_handler),
the request's own task waking on its collector (async_llm.py generate), merge_async_iterators (utils/
async_utils.py), OpenAIServingCompletion.completion_stream_generator (entrypoints/openai/completion/serving.py: a
CompletionStreamResponse per token, model_dump_json) and starlette's StreamingResponse handing the bytes to the ASGI
server. Here those classes run on a CPU with no GPU and no engine core: N streamed /v1/completions requests (the
body `vllm bench serve` sends: stream, stream_options.include_usage, max_tokens, no logprobs) each get one token per
step; the process CPU time per step (time.process_time: a loaded CPU's waits do not count) is timed over the steps.
Printed: the median seconds per step at each N and their least-squares seconds per streamed token.

The tokenizer is a byte-level BPE trained here on transformers' own modeling sources (no download): the detokeniser
(tokenizers' DecodeStream behind vLLM's FastIncrementalDetokenizer) does the same work per token whatever the
vocabulary's merges. vLLM is not a dependency: unpack its wheel as for bench/tools/vllm_scheduler_cpu.py (0.14 also
imports mistral_common, jsonschema, pydantic-extra-types, tiktoken, lm-format-enforcer and interegular; 0.11 needs
transformers 4.x, e.g. 4.57.1 with tokenizers 0.22.1, first on the path).

    python -m bench run vllm_frontend_cpu --path UNPACKED_WHEEL:DEPS_DIR [--requests 64 256 500]

NB: not timed, so the figure is low: the ZMQ receive and msgpack decode of the engine core's outputs
(core_client.py), the ASGI server's HTTP chunk framing and socket write (uvicorn), and the benchmark client, which
shares the host.
"""
from __future__ import annotations

import argparse
import tempfile

from bench.tools.vllm_scheduler_cpu import measure

ABOUT = {"summary": "vLLM API server CPU seconds per streamed token vs running requests (needs an unpacked vLLM)",
         "minutes": 2, "quick": None}

PROBE = r'''
import asyncio, glob, inspect, json, random, statistics, sys, time
from starlette.responses import StreamingResponse
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
try:  # 0.19 and later
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.tokenizers import get_tokenizer
except ImportError:  # 0.11: one protocol module, serving_completion.py
    from vllm.entrypoints.openai.protocol import CompletionRequest
    from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
    from vllm.transformers_utils.tokenizer import get_tokenizer
for home in ("openai.engine.protocol", "generate.base.protocol", "openai.protocol"):  # 0.19, 0.33, 0.11
    try:
        RequestResponseMetadata = __import__(f"vllm.entrypoints.{home}", fromlist=["x"]).RequestResponseMetadata
        break
    except (ImportError, AttributeError):
        pass
from vllm.sampling_params import RequestOutputKind, SamplingParams
try:
    from vllm.utils.async_utils import merge_async_iterators
except ImportError:  # 0.11: vllm/utils/__init__.py
    from vllm.utils import merge_async_iterators
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
from vllm.v1.metrics.stats import IterationStats

folder, counts, steps = sys.argv[1], [int(a) for a in sys.argv[2].split(",")], int(sys.argv[3])
PROMPT, CHUNK = 512, 128  # vllm bench serve random 512-token prompts; VLLM_V1_OUTPUT_PROC_CHUNK_SIZE
import transformers
sources = sorted(glob.glob(transformers.__path__[0] + "/models/*/modeling_*.py"))[:400]
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train(sources, trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False))
PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(folder)
tok = get_tokenizer(folder)
V = bpe.get_vocab_size() - 1
rng = random.Random(0)
# the server without its engine: the stream generator reads only its settings, each at `vllm serve`'s default (the
# constructors' keyword defaults; no request logger, no fingerprint: streamed chunks omit it)
serving = object.__new__(OpenAIServingCompletion)
for cls in OpenAIServingCompletion.__mro__:
    for name, par in inspect.signature(cls.__init__).parameters.items() if "__init__" in vars(cls) else ():
        if par.default is not inspect.Parameter.empty and not hasattr(serving, name):
            setattr(serving, name, par.default)
serving.request_logger = serving.system_fingerprint = None
# 0.11 passes enable_force_include_usage to the generator itself (its default: False)
late = [False] if "enable_force_include_usage" in inspect.signature(
    OpenAIServingCompletion.completion_stream_generator).parameters else []


async def generate(q):  # AsyncLLM.generate's loop over the request's collector
    finished = False
    while not finished:
        out = q.get_nowait() or await q.get()
        finished = out.finished
        yield out


async def run(n):
    op = OutputProcessor(tok, log_stats=True)
    sent = [0]

    async def send(message):  # the ASGI server's send: the bytes are dropped
        sent[0] += 1

    tasks = []
    for i in range(n):
        prompt = [rng.randrange(V) for _ in range(PROMPT)]
        text = tok.decode(prompt)
        sp = SamplingParams(max_tokens=steps, output_kind=RequestOutputKind.DELTA, ignore_eos=True)
        fields = dict(request_id=f"r{i}", prompt_token_ids=prompt, mm_features=None, sampling_params=sp,
                      pooling_params=None, eos_token_id=None, arrival_time=time.time(), lora_request=None,
                      cache_salt=None, data_parallel_rank=None, external_req_id=f"x{i}")
        req = EngineCoreRequest(**{k: v for k, v in fields.items() if k in EngineCoreRequest.__struct_fields__})
        q = RequestOutputCollector(RequestOutputKind.DELTA, *(  # (0.11 takes no request id)
            [f"r{i}"] if "request_id" in inspect.signature(RequestOutputCollector).parameters else []))
        op.add_request(req, text, None, 0, q)
        body = CompletionRequest(model="m", prompt=text, max_tokens=steps, stream=True, logprobs=None,
                                 repetition_penalty=1.0, stream_options={"include_usage": True})
        events = serving.completion_stream_generator(body, [None], merge_async_iterators(generate(q)), f"cmpl-{i}",
                                                     int(time.time()), "m", 1, tok,
                                                     RequestResponseMetadata(request_id=f"cmpl-{i}"), *late)
        tasks.append(asyncio.create_task(StreamingResponse(events, media_type="text/event-stream")
                                         .stream_response(send)))
    await asyncio.sleep(0)
    took = []
    for s in range(steps):
        last = s == steps - 1
        outs = [EngineCoreOutput(request_id=f"r{i}", new_token_ids=[rng.randrange(V)],
                                 finish_reason=FinishReason.LENGTH if last else None) for i in range(n)]
        t0 = time.process_time()
        for k in range(0, n, CHUNK):
            op.process_outputs(outs[k:k + CHUNK], time.monotonic(), IterationStats())
            await asyncio.sleep(0)
        # every request's event for this step handed to `send` (its response start came first)
        while (any(not t.done() for t in tasks) if last else sent[0] < (s + 2) * n):
            await asyncio.sleep(0)
        took.append(time.process_time() - t0)
    await asyncio.gather(*tasks)
    return statistics.median(took[5:-1])


rows = [[n, asyncio.run(run(n))] for n in counts]
print(json.dumps(rows))
'''


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", required=True, help="folders holding the unpacked vllm package and its requirements")
    p.add_argument("--requests", type=int, nargs="+", default=[64, 256, 500])
    p.add_argument("--steps", type=int, default=60)
    a = p.parse_args(argv)
    return measure(PROBE, a.path, tempfile.mkdtemp(), a.requests, a.steps, "streaming requests: API server",
                   "streamed token")


if __name__ == "__main__":
    raise SystemExit(main())
