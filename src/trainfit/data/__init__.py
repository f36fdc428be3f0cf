"""The data files of trainfit. `load_toml` reads one without its provenance: every table may carry a `provenance`
sub-table (where each number comes from) and a file a top-level `[sources]` table (the citations they name), which
tests/test_data_provenance.py checks and no estimate reads."""
import tomllib
from importlib import resources

PROVENANCE_KEYS = ("provenance",)  # anywhere
SOURCES_KEY = "sources"  # top level only


def load_toml(name: str) -> dict:
    """`name` (e.g. "kernels.toml") as its loaders read it: values only."""
    raw = tomllib.loads(resources.files(__name__).joinpath(name).read_text())
    raw.pop(SOURCES_KEY, None)
    return _values(raw)


def _values(table: dict) -> dict:
    return {k: _values(v) if isinstance(v, dict) else v for k, v in table.items() if k not in PROVENANCE_KEYS}
