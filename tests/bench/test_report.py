"""bench/report.py: BENCHMARKS.md is what the committed results give (the page cannot drift from them), fits in
200 lines, links only to files that exist and shows every figures file; the generator's own rules on fixtures."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "figures"
PAGE = (ROOT / "BENCHMARKS.md").read_text()


def test_committed_page_is_what_the_results_give():
    run = subprocess.run([sys.executable, "-m", "bench.report", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_page_fits_in_200_lines():
    assert PAGE.count("\n") <= 200


def test_every_link_resolves_to_a_file():
    links = re.findall(r"\]\(([^)#]+)\)", PAGE)
    assert links, "the page links its topic write-ups"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing


def test_every_topic_page_is_linked():
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "benchmarks").glob("*.md"))
    assert pages and all(f"]({page})" in PAGE for page in pages)


def test_every_figures_file_is_shown():
    for path in sorted(report.FIGURES.glob("*.json")):
        fig = json.loads(path.read_text())
        assert report.cell(fig["figure"], path.name) in PAGE and f"`{fig['command']}`" in PAGE, path.name


def test_first_screen_answers_accuracy_by_stack():
    text = report.render(report.load_figures(FIXTURES), None, [])
    lines = text.splitlines()
    assert lines[0] == "# trainfit benchmarks"
    first_table = next(i for i, line in enumerate(lines) if line.startswith("| "))
    assert first_table < 15 and lines[first_table].startswith("| stack | engine | truth |")
    assert "(prediction − truth) / truth" in text


def test_rows_go_to_their_tables_and_every_file_is_a_target_row():
    figures = report.load_figures(FIXTURES)
    text = report.render(figures, None, [])
    targets = text.split("## Every benchmark against its target")[1].split("## By area")[0]
    for fig in figures:
        assert f"`{fig['command']}`" in targets and fig["date"] in targets
    speed = text.split("### Speed")[1]
    assert "| analytic estimate, per setup (8B, 405B, Mixtral; 72 setups each) | 435–693 µs | ≤ 1 ms |" in speed
    assert "| step time: C1–C3 (Korthikanti, torchtune, torchtitan) | calibration (in sample) | 13 |" in text


def test_manifest_absent_is_one_line_present_is_a_table(tmp_path):
    figures = report.load_figures(FIXTURES)
    absent = report.render(figures, report.load_manifest(tmp_path / "manifest.toml"), [])
    assert "No GPU run manifest (bench/results/gpu/manifest.toml) is committed yet." in absent
    manifest = tmp_path / "manifest.toml"
    manifest.write_text('[[run]]\nfile = "H200-2026-11-27-b5841f1e.json"\ngpu = "H200"\ndate = 2026-11-27\n'
                        'chip = "b5841f1e"\nkind = "truth"\ncontains = "18 steps"\nfitted = []\n')
    present = report.render(figures, report.load_manifest(manifest), [])
    assert "| H200 | truth | 1 | 2026-11-27 | b5841f1e | 0 | 0 |" in present


def test_check_fails_on_a_stale_page_and_passes_once_written(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# an old page\n")
    topics = tmp_path / "topics"
    topics.mkdir()
    args = ["--figures", str(FIXTURES), "--manifest", str(tmp_path / "none.toml"), "--topics", str(topics),
            "--out", str(out)]
    assert report.main([*args, "--check"]) == 1
    assert report.main(args) == 0
    assert report.main([*args, "--check"]) == 0


def test_schema_is_enforced(tmp_path):
    fig = json.loads((FIXTURES / "speed.json").read_text())
    (tmp_path / "speed.json").write_text(json.dumps({k: v for k, v in fig.items() if k != "machine"}))
    with pytest.raises(ValueError, match="missing machine"):
        report.load_figures(tmp_path)
    (tmp_path / "speed.json").write_text(json.dumps({**fig, "figure": "x" * 121}))
    with pytest.raises(ValueError, match="longer than 120"):
        report.render(report.load_figures(tmp_path), None, [])
    (tmp_path / "speed.json").write_text(json.dumps({**fig, "rows": [{"table": "nowhere", "a": 1}]}))
    with pytest.raises(ValueError, match="nowhere"):
        report.load_figures(tmp_path)
