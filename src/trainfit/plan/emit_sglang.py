"""`--emit sglang` (with --mode serve --server sglang): the `python -m sglang.launch_server` command line that runs
the setup trainfit sized.

Every flag is SGLang 0.5.23's own (its ServerArgs fields, each the flag with dashes: sglang/srt/arg_groups/fields/
model.py:51-57 --model-path, :110-117 --context-length, :160-176 --dtype, :177-183 --quantization, :197-219
--kv-cache-dtype; parallel.py:45-66 --tp-size, --pp-size; schedule.py:27-30 --mem-fraction-static, :52-55
--chunked-prefill-size, :143-145 --page-size; exec_.py:629-631 --cuda-graph-max-bs-decode, :662-669
--disable-decode-cuda-graph / --disable-prefill-cuda-graph; spec.py:31-70 --speculative-algorithm,
--speculative-draft-model-path, --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens),
so the server starts with the settings the estimate
assumed: the dtype, TP/PP, the static fraction, the context length, the chunk and graph sizes the default fraction
was computed from, the page size and the KV dtype.
"""
from __future__ import annotations

import shlex

from .. import serving_versions
from ..errors import SetupError
from ..estimate import Serving
from ..models.resolve import serving_ref
from ..setup import Setup
from .emit_vllm import DTYPES, model_argument

# --kv-cache-dtype (fields/model.py:197-219: auto, fp8_e5m2, fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, ...): no fp16
# choice, the model's own dtype is "auto"
KV_DTYPES = {"fp8": "fp8_e4m3", "bf16": "bfloat16"}
FLAGS_OF = "0.5.23"  # the SGLang release whose ServerArgs flags this writes (the lines the docstring cites)


def sglang_command(model: str, setup: Setup, serving: Serving) -> str:
    """`model`: the model's reference as given (models.resolve.serving_ref turns it into what --model-path takes);
    `serving`: the estimate's resolved settings (Estimate.detail.serving, analytic/serving_sglang.py)."""
    version = serving_versions.of(setup).version
    if version != FLAGS_OF:  # the 0.4.x wheels' srt/server_args.py: no --pp-size, --cuda-graph-max-bs-decode
        raise SetupError(f"--emit sglang writes SGLang {FLAGS_OF}'s launch_server flags, and SGLang {version}'s parser "
                         "has no --pp-size or --cuda-graph-max-bs-decode (it would reject the command): emit with "
                         f"--server sglang (={FLAGS_OF}), or drop --emit")
    k = serving.knobs
    args = ["python", "-m", "sglang.launch_server", "--model-path", model_argument(model, setup, "sglang"),
            "--dtype", DTYPES[setup.precision], "--tp-size", str(setup.tp), "--pp-size", str(setup.pp),
            "--mem-fraction-static", f"{k['mem_fraction_static']:g}",
            "--context-length", str(serving.max_model_len),
            "--chunked-prefill-size", str(k["chunked_prefill_size"]), "--page-size", str(k["page_size"])]
    if setup.kv_dtype is not None:
        args += ["--kv-cache-dtype", KV_DTYPES.get(setup.kv_dtype, "auto")]
    if setup.quant:
        args += ["--quantization", setup.quant]
    if "speculative_algorithm" in k:  # the algorithm's builtin name is upper case (fields/spec.py:31-34)
        args += ["--speculative-algorithm", k["speculative_algorithm"].upper()]
        if k["draft_model"]:
            args += ["--speculative-draft-model-path", serving_ref(k["draft_model"], field="draft_model")]
        args += ["--speculative-num-steps", str(k["speculative_num_steps"]),
                 "--speculative-eagle-topk", str(k["speculative_eagle_topk"]),
                 "--speculative-num-draft-tokens", str(k["speculative_num_draft_tokens"])]
    if setup.enforce_eager:
        args += ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
    else:
        args += ["--cuda-graph-max-bs-decode", str(k["cuda_graph_max_bs"])]
    return shlex.join(args)
