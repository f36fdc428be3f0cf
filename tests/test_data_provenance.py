"""Every number in the data files says where it comes from (issue 37): each numeric field of a table has a
`provenance` entry with a kind and a source, a measured or fitted one names the GPU runs (bench/results/gpu/
manifest.toml) or [sources] entries it was measured or fitted on, and the manifest's `fitted` lists agree with
those entries both ways."""
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from trainfit.data import load_toml

ROOT = Path(__file__).resolve().parents[1]
FILES = ["kernels.toml", "overheads.toml", "power.toml", "servers.toml"]
KINDS = {"measured": "measured_on", "fitted": "fitted_on", "datasheet": None, "paper": None, "code": None,
         "derived": None, "assumed": None}
ENTRY_KEYS = {"kind", "source", "measured_on", "fitted_on", "fields", "why", "versions"}
MANIFEST = tomllib.loads((ROOT / "bench/results/gpu/manifest.toml").read_text())
RUNS = {r["file"].removesuffix(".json"): r for r in MANIFEST["run"]}


def _raw(name: str) -> dict:
    return tomllib.loads(resources.files("trainfit.data").joinpath(name).read_text())


def _is_number(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, list) and any(_is_number(x) for x in v)


def _numbers(table: dict, prefix: tuple = ()):
    """Paths (tuples of keys) of the numeric leaves of `table`, inline tables walked, sub-tables with their own
    provenance left to that provenance."""
    for k, v in table.items():
        if k == "provenance":
            continue
        if isinstance(v, dict):
            if "provenance" not in v:
                yield from _numbers(v, prefix + (k,))
        elif _is_number(v):
            yield prefix + (k,)


def _tables(table: dict, path: tuple = ()):
    """The file's top level and every table that holds a `provenance`, with its path."""
    if not path or "provenance" in table:
        yield path, table
    for k, v in table.items():
        if isinstance(v, dict) and k != "provenance":
            yield from _tables(v, path + (k,))


def _entries(table: dict):
    """(entry name, entry, the field paths it covers)."""
    for name, e in table.get("provenance", {}).items():
        yield name, e, [tuple(f.split(".")) for f in e.get("fields", [name])]


def _covered(table: dict) -> set[tuple]:
    return {p for _, _, paths in _entries(table) for p in paths}


def _lookup(table: dict, path: tuple):
    for k in path:
        if not isinstance(table, dict) or k not in table:
            return None
        table = table[k]
    return table


@pytest.mark.parametrize("name", FILES)
def test_every_number_has_a_provenance_entry(name):
    raw = _raw(name)
    missing = []
    for path, table in _tables(raw):
        covered = _covered(table)
        for leaf in _numbers(table):
            if not any(leaf[:i] in covered for i in range(1, len(leaf) + 1)):
                missing.append(".".join(path + leaf))
    assert not missing, f"{name}: numbers without provenance: {missing}"


@pytest.mark.parametrize("name", FILES)
def test_provenance_entries_are_well_formed_and_resolve(name):
    raw = _raw(name)
    sources = raw.get("sources", {})
    for key, s in sources.items():
        assert isinstance(s, dict) and s.get("cite") and set(s) <= {"cite", "url"}, key
        assert "url" not in s or s["url"].startswith("https://"), key
    problems = []
    for path, table in _tables(raw):
        where = ".".join(path)
        for ename, e, paths in _entries(table):
            at = f"{name} [{where}] provenance.{ename}"
            if not isinstance(e, dict) or set(e) - ENTRY_KEYS:
                problems.append(f"{at}: unknown keys {set(e) - ENTRY_KEYS if isinstance(e, dict) else e}")
                continue
            if e.get("kind") not in KINDS or not e.get("source"):
                problems.append(f"{at}: needs a kind of {sorted(KINDS)} and a source")
            needs = KINDS.get(e.get("kind"))
            if needs and not e.get(needs):
                problems.append(f"{at}: kind {e['kind']} needs {needs}")
            for ref in e.get("measured_on", []) + e.get("fitted_on", []):
                if ref not in RUNS and ref not in sources:
                    problems.append(f"{at}: {ref!r} is neither a GPU run of the manifest nor a [sources] entry")
            for p in paths:
                v = _lookup(table, p)
                if v is None or not (_is_number(v) or isinstance(v, dict)):
                    problems.append(f"{at}: names {'.'.join(p)!r}, not a number of the table")
    assert not problems, "\n".join(problems)


def _provenance_runs() -> dict[str, set[str]]:
    """'src/trainfit/data/<file>:<dotted field>' -> the manifest runs its provenance names."""
    out = {}
    for name in FILES:
        for path, table in _tables(_raw(name)):
            for _, e, paths in _entries(table):
                runs = {r for r in e.get("measured_on", []) + e.get("fitted_on", []) if r in RUNS}
                for p in paths:
                    if runs:
                        out[f"src/trainfit/data/{name}:" + ".".join(path + p)] = runs
    return out


def _manifest_runs() -> dict[str, set[str]]:
    out = {}
    for stem, run in RUNS.items():
        for constant in run["fitted"]:
            out.setdefault(constant, set()).add(stem)
    return out


def test_manifest_fitted_lists_agree_with_the_provenance():
    """A constant the manifest says a run fitted or measured names that run in its provenance (a manifest key may
    name a whole table: then every field of it does), and a run a provenance entry names lists the constant."""
    prov, manifest = _provenance_runs(), _manifest_runs()

    def listed_as(field: str) -> str | None:  # the most specific manifest constant holding the field
        return max((c for c in manifest if field == c or field.startswith(c + ".")), key=len, default=None)

    problems = []
    for constant, runs in manifest.items():
        fields = {f: r for f, r in prov.items() if listed_as(f) == constant}
        if not fields:
            problems.append(f"manifest: {constant} has no provenance entry naming a run")
        for f, r in fields.items():
            if r != runs:
                problems.append(f"{f}: provenance runs {sorted(r)} != manifest {sorted(runs)}")
    for f, runs in prov.items():
        if listed_as(f) is None:
            problems.append(f"{f}: provenance names runs {sorted(runs)} the manifest does not list it under")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", FILES)
def test_loaders_see_no_provenance(name):
    def keys(d):
        for k, v in d.items():
            yield k
            if isinstance(v, dict):
                yield from keys(v)
    loaded = load_toml(name)
    assert "provenance" not in set(keys(loaded)) and "sources" not in loaded
