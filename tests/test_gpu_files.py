"""A GPU file written from `trainfit gpus --json`'s own entry is that GPU: the same step time and memory as the
catalog name, whatever the file calls it. Before, a file's GPU had no kernel data and was timed as one SM
(llama-3.1-8b on a copy of the H100-80GB: 7.31 s a step against 392.5 ms)."""
import json

import pytest

from trainfit.analytic.roofline import kernels_for
from trainfit.hardware import load_gpu_file

# SM / CU counts from the vendors' whitepapers, not from data/kernels.toml: NVIDIA H100 Table 3 (SXM5), A100
# Table 3 (SXM4), the L4 datasheet's 7424 CUDA cores / 128 per Ada SM, AMD CDNA3 (MI300X)
SMS = {"H100-80GB": 132, "A100-80GB": 108, "L4": 58, "MI300X": 304}


def _toml(d: dict) -> str:
    """A flat TOML table; JSON's strings and numbers are valid TOML values."""
    def value(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)
    return "".join(f"{k} = {value(v)}\n" for k, v in d.items())


def _catalog_entry(cli, name: str) -> dict:
    code, out, _ = cli("gpus", "--json")
    assert code == 0
    return next(g for g in json.loads(out) if g["name"] == name)


def _estimate(cli, gpu: str) -> dict:
    code, out, err = cli("estimate", "llama-3.2-1b", "--gpu", gpu, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("name", sorted(SMS))
@pytest.mark.parametrize("fmt", ["json", "toml"])
def test_a_gpu_file_from_gpus_json_is_that_gpu(tmp_path, cli, name, fmt):
    entry = _catalog_entry(cli, name) | {"name": "MyCard", "aliases": []}  # its label says nothing of the chip
    path = tmp_path / f"card.{fmt}"
    path.write_text(json.dumps(entry) if fmt == "json" else _toml(entry))
    assert kernels_for(load_gpu_file(str(path))).sms == SMS[name]
    mine, catalog = _estimate(cli, str(path)), _estimate(cli, name)
    assert mine["time"]["step_seconds"] == catalog["time"]["step_seconds"]
    assert mine["memory"]["device_total"] == catalog["memory"]["device_total"]
    assert mine["fit"]["capacity"] == catalog["fit"]["capacity"]


@pytest.mark.parametrize("kernels, words", [
    (None, ["missing field 'kernels'", 'kernels = "H100-80GB"', "SM count"]),
    ("H100-80", ["field 'kernels'", "names no catalog GPU", "Did you mean", 'kernels = "H100-80GB"']),
])
def test_a_gpu_file_without_the_time_models_fields_is_refused_by_name(tmp_path, cli, kernels, words):
    entry = _catalog_entry(cli, "H100-80GB")
    entry = {k: v for k, v in (entry | {"kernels": kernels}).items() if v is not None}
    path = tmp_path / "card.toml"
    path.write_text(_toml(entry))
    code, out, err = cli("estimate", "llama-3.2-1b", "--gpu", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error:") and all(w in err for w in words), err
