"""accelerate's `estimate-memory` on a local config (run in its own venv: see bench/anchors/setup.sh).

    <accelerate-venv>/bin/python bench/anchors/accelerate_anchor.py cases.json out.json

This runs accelerate's own code path, `accelerate.commands.estimate.gather_data` (what
`accelerate estimate-memory MODEL --library_name transformers` prints), with one change: the Hub lookup
(`verify_on_hub`) is replaced by a local config directory, because nothing here can reach the Hub.
accelerate then builds the empty model itself (`AutoModel.from_config` under `init_empty_weights`, fp32),
measures it with `calculate_maximum_sizes`, and `estimate_training_usage` gives the training figure.

What it predicts (its intended reading):
- "Total Size" per dtype: the bytes to load the model (float32 row: 4 B/param; float16 row: 2 B/param).
  We compare it with the inference peaks (fp32 and amp-* -> float32 row; bf16/fp16 -> float16 row).
- "Training using Adam": the largest of its per-category figures for a batch size of 1 — float32:
  max(model 4N, grads 4N, Adam 8N, "step" 16N) = 16 B/param; float16 (mixed precision): max(4N, 6N, 8N, 8N)
  = 8 B/param. We compare it with the training peaks (fp32 -> float32 row; every other policy -> float16 row,
  which accelerate also uses for bfloat16).
It models no activations, no batch or sequence length, no optimizer other than Adam, no KV cache, and
AutoModel is the base model (no LM head: untied heads are not counted).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(cases_path: str, out_path: str) -> None:
    import accelerate
    import accelerate.commands.estimate as est

    cases = json.load(open(cases_path))
    out = {"tool": f"accelerate {accelerate.__version__}", "results": {}}
    cache: dict = {}
    for case in cases:
        key = json.dumps(case["config"], sort_keys=True)
        if key not in cache:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "config.json"), "w") as f:
                    json.dump(case["config"], f)
                # the only change to accelerate's path: the Hub answer is local
                est.verify_on_hub = lambda repo, token=None, _c=case["config"]: types.SimpleNamespace(
                    library_name="transformers", config=_c)
                args = types.SimpleNamespace(model_name=d, library_name="transformers", trust_remote_code=False,
                                             dtypes=["float32", "float16"])
                try:
                    rows = est.gather_data(args)
                    cache[key] = {r[0]: {"largest_layer": int(r[1]), "total_size": int(r[2]),
                                         "training_adam": int(max(r[3].values())), "training_parts": r[3]}
                                  for r in rows}
                except Exception as e:  # noqa: BLE001
                    cache[key] = {"error": f"{type(e).__name__}: {e}"}
        data = cache[key]
        if "error" in data:
            out["results"][case["id"]] = {"error": data["error"]}
            continue
        if case["mode"] == "train":
            row = "float32" if case["precision"] == "fp32" else "float16"
            pred = data[row]["training_adam"]
            out["results"][case["id"]] = {"step": pred, "row": row, "what": "Training using Adam",
                                          "total_size_fp32": data["float32"]["total_size"]}
        else:
            row = "float32" if case["precision"] in ("fp32", "amp-bf16", "amp-fp16") else "float16"
            pred = data[row]["total_size"]
            out["results"][case["id"]] = {"prefill": pred, "decode": pred, "row": row, "what": "Total Size"}
    json.dump(out, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
