"""bench/results/gpu/manifest.toml against the folder it describes: every run listed once with its facts, every
listed file present, every reader naming the file it reads, every fitted constant present in its data file."""
import re
import tomllib
from pathlib import Path

import pytest

from bench import data

ROOT = Path(__file__).resolve().parents[2]
GPU = data.results_dir() / data.GPU_DIR
NAME = re.compile(r"(?P<gpu>[A-Za-z0-9]+(?:-[0-9]+GB)?)-(?P<date>\d{4}-\d{2}-\d{2})-"
                  r"(?P<chip>[0-9a-f]{8}|unrecorded-\d+|none)-(?P<kind>truth|kernels|context|spread)(?:-[a-z0-9-]+)?\.json")
FIELDS = {"file", "gpu", "date", "chip", "chip_note", "kind", "contains", "torch", "driver", "transformers",
          "former_name", "fitted", "read_by"}
ENTRIES = data.manifest()


def test_every_file_listed_once():
    listed = [e["file"] for e in ENTRIES]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in GPU.glob("*.json")}
    assert not list(GPU.glob("*/*")), "runs sit directly in bench/results/gpu/"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_entry(entry):
    assert FIELDS <= set(entry), f"{entry['file']} lacks {sorted(FIELDS - set(entry))}"
    m = NAME.fullmatch(entry["file"])
    assert m, f"{entry['file']} is not <gpu>-<date>-<chip>-<kind>[-<what>].json"
    assert (m["gpu"], m["date"], m["chip"], m["kind"]) == (entry["gpu"], entry["date"], entry["chip"], entry["kind"])
    run = data.gpu_run(entry["file"])
    uuid = run.get("uuid") or (run.get("memory_totals") or {}).get("uuid")
    if uuid:  # a recorded chip is named by its uuid
        assert data.chip_id(uuid) == entry["chip"] and entry.get("uuid") == uuid
    assert run.get("torch") == entry["torch"]
    for path in entry["read_by"]:
        assert entry["file"].removesuffix(".json") in (ROOT / path).read_text(), f"{path} does not read {entry['file']}"
    for ref in entry["fitted"]:
        file, key = ref.split(":")
        value = tomllib.loads((ROOT / file).read_text())
        for part in key.split("."):
            assert isinstance(value, dict) and part in value, f"{ref}: no such constant"
            value = value[part]


def test_kind_readers_read_through_the_loader():
    kinds = {e["kind"] for e in ENTRIES}
    for kind, paths in data.kind_readers().items():
        assert kind in kinds
        for path in paths:
            assert f'gpu_runs("{kind}"' in (ROOT / path).read_text(), f"{path} does not read every {kind} run"


def test_former_names_are_gone():
    """The old names live in the manifest and in git history only."""
    for entry in ENTRIES:
        assert not (data.results_dir() / entry["former_name"]).exists()
