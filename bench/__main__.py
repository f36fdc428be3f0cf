"""python -m bench list | run [--quick] [NAME ...] [ARGS ...] | report  (bench/README.md)."""
from __future__ import annotations

import importlib
import sys
import time

from bench.index import Entry, entries, find

USAGE = "usage: python -m bench list | run [--quick] [NAME ...] [ARGS ...] | report [ARGS ...]"


def show() -> int:
    rows = entries()
    width = max(len(e.name) for e in rows)
    for e in rows:
        quick = f"  (--quick: {' '.join(e.quick)})" if e.quick else ""
        print(f"{e.name:<{width}}  {e.kind:<8} {'~' + format(e.minutes, 'g') + ' min':>9}  {e.summary}{quick}")
    return 0


def run_one(e: Entry, quick: bool, args: list[str]) -> int:
    """`e`'s main(argv) with its quick arguments (if asked and it has them) before `args`; its exit status."""
    argv = (list(e.quick) if quick and e.quick else []) + args
    try:
        rc = importlib.import_module(e.module).main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    return rc if isinstance(rc, int) else (0 if rc is None else 1)


def run(argv: list[str]) -> int:
    """Names first, then the modules' own arguments: from the first word that starts with '-' or, after the first
    name, names no benchmark (a module's positional argument: `run kernels_replay FILE`), or after '--'; --quick
    anywhere is the runner's."""
    quick = "--quick" in argv
    words = [w for w in argv if w != "--quick"]
    cut = next((i for i, w in enumerate(words) if w.startswith("-") or (i and find(w) is None)), len(words))
    names, args = words[:cut], words[cut + 1:] if words[cut:cut + 1] == ["--"] else words[cut:]
    chosen = []
    for name in names:
        e = find(name)
        if e is None:
            print(f"no benchmark named {name!r}: python -m bench list", file=sys.stderr)
            return 2
        chosen.append(e)
    chosen = chosen or [e for e in entries() if e.kind == "targets"]
    failed = []
    for i, e in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {e.name}{' (quick)' if quick and e.quick else ''} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        rc = run_one(e, quick, args)
        print(f"[{i}/{len(chosen)}] {e.name}: exit {rc} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if rc:
            failed.append(e.name)
    if failed:
        print(f"failed: {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def report(argv: list[str]) -> int:
    from bench import report as page  # BENCHMARKS.md from bench/results

    return page.main(argv) or 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("list", "run", "report"):
        print(USAGE, file=sys.stderr)
        return 2
    return {"list": lambda: show(), "run": lambda: run(argv[1:]), "report": lambda: report(argv[1:])}[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
