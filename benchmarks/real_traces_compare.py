"""Top findings on every real trace at other commits beside the working tree's: the table a
rule change is judged by.

    python benchmarks/real_traces_compare.py REV [REV ...] [--top 3]

Each REV is checked out into a temporary git worktree and run in a fresh process against the
traces of this checkout (``tests/fixtures/traces``), with only the APIs every commit has
(``gd.analyze_trace``, ``EvidenceBundle``, ``run_rules``) and the trace alone (no live system),
as ``benchmarks/real_traces.py`` does. Prints a Markdown table: one row per trace, one column
per REV and one for the working tree ("same" where it equals the column before it). Each cell:
finding id, severity, estimated gain over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "fixtures" / "traces"

HARNESS = """
import json, sys
from pathlib import Path
import gpudiag as gd
from gpudiag.rules import EvidenceBundle, run_rules
root, top, out = Path(sys.argv[1]), int(sys.argv[2]), {}
for p in sorted(root.iterdir()):
    if not ((p.is_dir() and any(p.glob("*.json*"))) or p.name.endswith((".json", ".json.gz"))):
        continue
    try:
        d = run_rules(EvidenceBundle(trace=gd.analyze_trace(p), env={}))
        out[p.name] = [
            f"{f.id} {f.severity.value}"
            + ("" if f.estimated_gain is None else f" {100 * f.estimated_gain:.1f}%")
            for f in d.findings[:top]
        ]
    except Exception as exc:  # a commit that cannot read a trace says so in its cell
        out[p.name] = [f"error: {type(exc).__name__}"]
print(json.dumps(out))
"""


def findings_at(code_root: Path, top: int) -> dict[str, list[str]]:
    env = dict(os.environ, PYTHONPATH=str(code_root), TQDM_DISABLE="1")
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, str(TRACES), str(top)],
        capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), check=True,
    )  # fmt: skip
    result: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="commits to compare with the working tree")
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args(argv)
    columns: list[tuple[str, dict[str, list[str]]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for rev in args.revs:
            tree = Path(scratch) / rev.replace("/", "_")
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev],
                check=True,
            )
            try:
                columns.append((rev, findings_at(tree, args.top)))
            finally:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )
    columns.append(("working tree", findings_at(REPO, args.top)))
    print("| trace | " + " | ".join(name for name, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for trace in columns[-1][1]:
        cells, before = [], None
        for _, found in columns:
            cell = "; ".join(found.get(trace, ["(not there)"])) or "(none)"
            cells.append("same" if cell == before else cell)
            before = cell
        print(f"| {trace} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
