"""DeepSpeed's ZeRO model-state estimators (run in its own venv: see bench/anchors/setup.sh).

    <deepspeed-venv>/bin/python bench/anchors/deepspeed_anchor.py cases.json out.json

Calls `deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs` and
`deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs`, the functions behind the documented
`estimate_zero2_model_states_mem_needs_all_cold` / `estimate_zero3_..._all_cold` (those only print a table
of the same numbers). Inputs: the parameter count and the largest layer's parameter count, computed by
bench/anchors/anchors.py from the real HF model on the meta device exactly as DeepSpeed's `_all_live` variants
count them. Settings: 1 node, 1 GPU, no CPU offload (our cases are one unsharded process); ZeRO-3 with
`zero_init=True`.

What it predicts: per-GPU bytes of model states for DeepSpeed's mixed-precision Adam: ZeRO-2: 2 B/param
(16-bit params) + 18 B/param (16-bit grads 2 + fp32 grads 4 + fp32 master 4 + Adam 8); ZeRO-3:
4 × largest layer + 18 B/param. No activations, no temporaries, no batch/sequence, Adam only, and training
only (no inference estimator).
"""
from __future__ import annotations

import json
import sys


def main(cases_path: str, out_path: str) -> None:
    import deepspeed
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    out = {"tool": f"deepspeed {deepspeed.__version__}", "results": {}}
    for case in json.load(open(cases_path)):
        if case["mode"] != "train":
            continue
        n, largest = case["params"], case["largest_layer_params"]
        _, z2 = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=1, num_nodes=1, cpu_offload=False)
        _, z3, _ = estimate_zero3_model_states_mem_needs(n, largest, num_gpus_per_node=1, num_nodes=1,
                                                         cpu_offload=False, cpu_offload_params=False,
                                                         zero_init=True)
        out["results"][case["id"]] = {"step": int(z2), "zero3": int(z3), "what": "model states per GPU"}
    json.dump(out, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
