"""Every real trace's full analysis, saved or compared: did a change move any result?

    python benchmarks/trace_results.py --save DIR        # write one JSON per trace
    python benchmarks/trace_results.py --against DIR     # compare with a saved run

For each trace file and multi-rank folder under ``tests/fixtures/traces`` this records
``gd.analyze_trace(path).to_dict()`` (and with ``include_last_step=True``), the report's text,
and the findings the rules draw from it. Floats are written by ``repr`` (JSON), so "identical"
means bit for bit. To compare a change with the code before it, save with the old code first
(e.g. ``git stash`` or ``PYTHONPATH=<old checkout>``), then compare with the new. Prints one
line per trace and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "traces"


def trace_paths(root: Path) -> list[Path]:
    """Every trace file and every folder of ranks directly under ``root`` (as
    ``real_traces.py``, which is not imported: it puts this checkout first on the path)."""
    out = []
    for p in sorted(root.iterdir()):
        is_ranks = p.is_dir() and any(p.glob("*.json*"))
        if is_ranks or p.name.endswith((".json", ".json.gz")):
            out.append(p)
    return out


def results(path: Path) -> dict[str, Any]:
    import gpudiag as gd
    from gpudiag.rules import EvidenceBundle, run_rules

    report = gd.analyze_trace(path)
    diagnosis = run_rules(EvidenceBundle(trace=report, env={}))
    return {
        "report": report.to_dict(),
        "with_last_step": gd.analyze_trace(path, include_last_step=True).to_dict(),
        "text": repr(report),
        "findings": [f.to_dict() for f in diagnosis.findings],
    }


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{where}.{key}: only in {'the saved run' if key in a else 'this run'}"
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {str(a)[:80]!r} vs {str(b)[:80]!r}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, help="write the results into this folder")
    group.add_argument("--against", type=Path, help="compare with the results in this folder")
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    args = parser.parse_args(argv)
    import gpudiag

    print(f"gpudiag from {Path(gpudiag.__file__).parent}")
    differ = 0
    for path in trace_paths(args.fixtures):
        t0 = time.perf_counter()
        # A round trip through JSON: what is saved is what is compared.
        got = json.loads(json.dumps(results(path), sort_keys=True))
        elapsed = time.perf_counter() - t0
        saved = (args.save or args.against) / f"{path.name}.json"
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(got, sort_keys=True, indent=1))
            print(f"saved     {path.name} ({elapsed:.1f} s)")
            continue
        if not saved.exists():
            print(f"NOT SAVED {path.name}")
            differ += 1
            continue
        found = _first_difference(json.loads(saved.read_text()), got)
        differ += found is not None
        print(f"{'DIFFERS  ' if found else 'identical'} {path.name} ({elapsed:.1f} s)")
        if found:
            print(f"          first difference at {found}")
    if args.against:
        print(f"\n{differ} of the traces differ" if differ else "\nevery trace identical")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
