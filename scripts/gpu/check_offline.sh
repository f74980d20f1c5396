#!/usr/bin/env bash
# Every GPU path of gpudiag for real, on a GPU machine without network, in one command:
#
#   bash scripts/gpu/check_offline.sh OUT_DIR [PART ...]
#
# Run from the repository root with the folder .gpu-wheels/ beside it (make gpu-wheels makes
# it; it travels with the checkout). Nothing is fetched: the wheels the machine's Python lacks
# are installed with --no-index into a folder of their own put on PYTHONPATH, beside the
# machine's torch, which is never touched (its version and folder are compared before and
# after). Then the parts below run one after the other, each in its own process and time box,
# the slow ones last, all before a deadline (GPU_CHECK_DEADLINE_S, 450 s from the start), and
# the one table is printed, even when a part ran out of time.
#
# OUT_DIR receives at most 8 files, none over 16 MiB, no sub-folder: table.txt (the table),
# rows.json (its rows), env.txt (machine, Python, torch, what was installed), log.txt (all
# output) and recording-<gpu>-<count>x.tar.gz (the `gpudiag record` folder, for
# tests/fixtures/recorded/; split into .partNN files past 15 MiB). CONTRIBUTING.md says how.
#
# Exit status: 0 when every row passed or was not applicable, 1 when a row failed or a part
# was not run, 2 or 3 when the check could not start (not a checkout; no wheels, torch missing
# or changed).
#
# PARTs (default: all, in this order): deps, gpu-paths, record, doctor, nccl, compare.
# A second try can run only what needs it, e.g. `... OUT_DIR compare`.
# Environment: GPU_CHECK_PYTHON (python3), GPU_CHECK_WHEELS (.gpu-wheels),
# GPU_CHECK_DEADLINE_S (450), GPU_CHECK_WORK (a new folder under /tmp).
set -u -o pipefail

OUT_DIR=${1:-gpu-check-out}
shift || true
PYTHON=${GPU_CHECK_PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.gpu-wheels}
DEADLINE_S=${GPU_CHECK_DEADLINE_S:-450}
ALL_PARTS="deps gpu-paths record doctor nccl compare"
PARTS=${*:-$ALL_PARTS}
START=$SECONDS

if [ ! -f pyproject.toml ] || [ ! -d gpudiag ] || [ ! -d tests/gpu ]; then
  echo "check_offline: run from the root of a gpudiag checkout" >&2
  exit 2
fi
for part in $PARTS; do
  case " $ALL_PARTS " in *" $part "*) ;; *) echo "check_offline: unknown part $part (parts: $ALL_PARTS)" >&2; exit 2 ;; esac
done
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpudiag-offline.XXXXXX)}
SITE=$WORK/site
SPARE_SITE=$WORK/spare-site
ROWS=$WORK/parts
REC_ROOT=$WORK/recording
mkdir -p "$ROWS" "$REC_ROOT"
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1
TEE_PID=$!

say() { printf '[check_offline %4ds] %s\n' "$((SECONDS - START))" "$*"; }
left() { echo $((DEADLINE_S - (SECONDS - START))); }

# pip with no configuration of the machine's (an index, find-links or a constraint file there
# must not change what is installed) and never an index.
offline_pip() {
  (
    for var in $(compgen -e); do case $var in PIP_*) unset "$var" ;; esac; done
    PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip install --no-index --no-deps --no-compile \
      --no-cache-dir --disable-pip-version-check --quiet "$@"
  )
}

FINISHED=
# shellcheck disable=SC2317  # run by the EXIT trap
finish() { # the exit status: the script's own, else 1 when a row failed
  local status=$? merged=0
  [ -n "$FINISHED" ] && return
  FINISHED=1
  say "the table (every part that ran; parts: $PARTS)"
  "$PYTHON" -m gpudiag.cli.gpu_check --merge "$ROWS" --json "$OUT_DIR/rows.json" \
    >"$OUT_DIR/table.txt" 2>&1 || merged=$?
  if [ "$merged" -gt 1 ] && [ ! -s "$OUT_DIR/rows.json" ]; then
    cat "$ROWS"/*.json >"$OUT_DIR/rows.json" 2>/dev/null
  fi
  [ "$status" -eq 0 ] && status=$merged
  cat "$OUT_DIR/table.txt"
  for folder in "$REC_ROOT"/*/; do
    [ -d "$folder" ] || continue
    name=$(basename "$folder")
    tarball="$OUT_DIR/recording-$name.tar.gz"
    # No manifest: `gpudiag record` did not finish (its time box): not a recording to commit.
    [ -f "$folder/manifest.json" ] || tarball="$OUT_DIR/recording-$name-incomplete.tar.gz"
    tar -czf "$tarball" -C "$REC_ROOT" "$name"
    if [ "$(stat -c %s "$tarball")" -gt $((15 * 1024 * 1024)) ]; then
      split -b 15M -d "$tarball" "$tarball.part" && rm -f "$tarball"
      say "recording $name split in parts: cat $(basename "$tarball").part* >$(basename "$tarball")"
    fi
    say "recording: $(cd "$OUT_DIR" && echo "recording-$name"*)"
  done
  if [ -n "${TORCH_BEFORE:-}" ]; then
    after=$("$PYTHON" scripts/gpu/offline_env.py torch-id 2>&1)
    if [ "$after" = "$TORCH_BEFORE" ]; then say "torch unchanged: $after"; else say "TORCH CHANGED: $after"; fi
  fi
  say "done in $((SECONDS - START)) s; files in $OUT_DIR: $(cd "$OUT_DIR" && echo *)"
  exec 1>&- 2>&- # tee ends once the log has everything
  wait "$TEE_PID" 2>/dev/null
  log="$OUT_DIR/log.txt"
  if [ -f "$log" ] && [ "$(stat -c %s "$log")" -gt $((15 * 1024 * 1024)) ]; then
    tail -c $((15 * 1024 * 1024)) "$log" >"$log.tail" && mv "$log.tail" "$log"
  fi
  exit "$status"
}
trap finish EXIT
trap 'say "stopped by a signal"; exit 143' TERM INT

# --- 1. the machine ---------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "uname: $(uname -srm)"
  echo "cpus: $(nproc)"
  echo "checkout: $(git rev-parse --short HEAD 2>/dev/null || echo "no git")"
  echo "python: $(command -v "$PYTHON") $("$PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>&1)"
  if command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi -L: $(nvidia-smi -L 2>&1 | tr '\n' ';')"
  else
    echo "nvidia-smi: not on PATH"
  fi
} >"$OUT_DIR/env.txt"
cat "$OUT_DIR/env.txt"

# --- 2. the wheels the machine lacks, into a folder of their own, torch compared around it ----
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
spare_wheels=("$WHEELS"/spare/*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -eq 0 ]; then
  say "no wheels in $WHEELS: make gpu-wheels (on a machine with network), and let it travel"
  exit 3
fi
for wheel in "${wheels[@]}" "${spare_wheels[@]}"; do
  case $(basename "$wheel") in
    torch-* | torchvision-* | torchaudio-* | triton-* | nvidia_* | nvidia-* | cuda_* | cuda-*)
      say "refusing $wheel: the machine's own torch stack is never replaced"
      exit 3
      ;;
  esac
done
if ! TORCH_BEFORE=$("$PYTHON" scripts/gpu/offline_env.py torch-id 2>&1); then
  say "no torch for $PYTHON: $TORCH_BEFORE"
  TORCH_BEFORE=
  exit 3
fi
say "before: $TORCH_BEFORE"
echo "before: $TORCH_BEFORE" >>"$OUT_DIR/env.txt"

say "installing ${#wheels[@]} wheels from $WHEELS into $SITE (--no-index, --no-deps)"
if ! offline_pip --target "$SITE" "${wheels[@]}"; then
  say "pip could not install them: unpacking the wheels instead"
  rm -rf "$SITE"
  "$PYTHON" scripts/gpu/offline_env.py unpack --target "$SITE" "${wheels[@]}" || exit 3
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
mapfile -t spares < <("$PYTHON" scripts/gpu/offline_env.py spares --site "$SITE" --spare "$WHEELS/spare")
if [ ${#spares[@]} -gt 0 ]; then
  say "the machine's versions do not fit; spare wheels: ${spares[*]}"
  offline_pip --target "$SPARE_SITE" "${spares[@]}" ||
    "$PYTHON" scripts/gpu/offline_env.py unpack --target "$SPARE_SITE" "${spares[@]}"
  export PYTHONPATH="$SITE:$SPARE_SITE${PYTHONPATH#"$SITE"}"
fi
"$PYTHON" scripts/gpu/offline_env.py requirements --site "$SITE" --spare "$WHEELS/spare" |
  tee -a "$OUT_DIR/env.txt"
{
  echo "PYTHONPATH: $PYTHONPATH"
  dists=("$SITE"/*.dist-info)
  echo "installed: ${#dists[@]} distributions;" \
    "spare: ${spares[*]:-none}"
} >>"$OUT_DIR/env.txt"
TORCH_AFTER=$("$PYTHON" scripts/gpu/offline_env.py torch-id 2>&1)
if [ "$TORCH_AFTER" != "$TORCH_BEFORE" ]; then
  say "torch changed ($TORCH_AFTER): stopping before anything runs on it"
  exit 3
fi
say "after:  $TORCH_AFTER (unchanged)"

# --- 3. the parts, each time-boxed, the slow ones last ---------------------------------------
export PYTHONUNBUFFERED=1
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 # only pytest itself: the machine's plugins stay out
CHECK=("$PYTHON" -m gpudiag.cli.gpu_check)
number=0
part() { # part NAME BOX_S GPU_CHECK_ARGUMENTS... (pytest's after --)
  local name=$1 box=$2
  shift 2
  number=$((number + 1))
  local stem
  stem=$(printf '%02d-%s' "$number" "$name")
  case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
  local remaining=$(($(left) - 15))
  [ "$box" -gt "$remaining" ] && box=$remaining
  if [ "$box" -lt 20 ]; then
    say "part $name: not run (only $(left) s left before the deadline)"
    printf '{"part": "%s", "exit": "not run", "reason": "only %s s were left before the %s s deadline: run this part alone"}\n' \
      "$name" "$(left)" "$DEADLINE_S" >"$ROWS/$stem.status.json"
    return 0
  fi
  say "part $name: up to $box s"
  local began=$SECONDS code
  timeout -k 10 "$box" "${CHECK[@]}" --json "$ROWS/$stem.json" "$@"
  code=$?
  say "part $name: exit $code after $((SECONDS - began)) s"
  printf '{"part": "%s", "exit": %d, "seconds": %d, "box_s": %d}\n' \
    "$name" "$code" "$((SECONDS - began))" "$box" >"$ROWS/$stem.status.json"
}

part deps 60 --dependencies --no-tests --no-end-to-end
part gpu-paths 180 --no-end-to-end -- -k "not allreduce and not compare_fix and not diagnose_planted"
part record 150 --no-tests --record-root "$REC_ROOT"
part doctor 120 --no-end-to-end -- -k diagnose_planted
part nccl 60 --no-end-to-end -- -k allreduce
# gd.compare's own budget for its measuring rounds: what the box leaves after compilation.
compare_box=$(($(left) - 15))
[ "$compare_box" -gt 240 ] && compare_box=240
budget=$((compare_box - 90))
[ "$budget" -gt 150 ] && budget=150
[ "$budget" -lt 20 ] && budget=20
export GPUDIAG_GPU_CHECK_COMPARE_BUDGET_S=$budget # read by tests/gpu/test_gpu_workflows.py
part compare 240 --no-end-to-end -- -k compare_fix
exit 0
