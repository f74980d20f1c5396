"""How long `import gpudiag` takes (goal: under 150 ms), measured against a bare interpreter.

Each sample is a fresh interpreter; the table shows the median over interleaved runs of
`python -c "import gpudiag"` and `python -c "pass"`, and their difference (gpudiag's own cost).

    python benchmarks/import_time.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

GOAL_MS = 150.0


def _run(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    bare, full = [], []
    _run("import gpudiag")  # warm the file cache
    for _ in range(args.runs):  # interleaved, so machine noise hits both alike
        bare.append(_run("pass"))
        full.append(_run("import gpudiag"))
    own = [f - b for f, b in zip(full, bare, strict=True)]
    print(f"{'':<28}{'median ms':>10}{'p10 ms':>9}{'p90 ms':>9}")
    for name, xs in (
        ("python -c pass", bare),
        ("python -c 'import gpudiag'", full),
        ("gpudiag's own cost", own),
    ):
        q = statistics.quantiles(xs, n=10)
        print(f"{name:<28}{statistics.median(xs):>10.1f}{q[0]:>9.1f}{q[-1]:>9.1f}")
    verdict = "meets" if statistics.median(own) < GOAL_MS else "MISSES"
    print(f"\nimport gpudiag {verdict} the {GOAL_MS:.0f} ms goal ({args.runs} runs).")


if __name__ == "__main__":
    main()
