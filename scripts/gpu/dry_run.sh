#!/usr/bin/env bash
# A dry run of scripts/gpu/check_offline.sh on a machine without a GPU, as on the GPU machine:
# a Python 3.12 venv that holds only what the GPU machine's image holds for gpudiag (torch
# 2.11.0, numpy, pandas, psutil, pyyaml, tqdm, nvidia-ml-py, pytest, ...), made from wheels in
# a cache with pip limited to --no-index; then the same command, which installs .gpu-wheels/
# with --no-index and runs every part to the end (each GPU row "not applicable").
#
#   bash scripts/gpu/dry_run.sh OUT_DIR            (make gpu-dry-run)
#   bash scripts/gpu/dry_run.sh --fill-cache       (once, with network: about 2.7 GB)
#
# The cache (GPU_DRYRUN_CACHE, default ~/.cache/gpudiag-gpu-dryrun) is outside the repository
# and never travels. PyPI's torch 2.11.0 for Linux x86_64 is a CUDA 13.0 build, like the GPU
# machine's; here it has no GPU, so it runs on the CPU. The venv is kept between runs (the
# check never writes into it); GPU_DRYRUN_FRESH=1 makes it anew.
set -euo pipefail

CACHE=${GPU_DRYRUN_CACHE:-$HOME/.cache/gpudiag-gpu-dryrun}
TORCH=torch==2.11.0
# The image's own packages that gpudiag and the carried wheels use. typing-extensions is held
# at an older release than pydantic asks for, so the dry run takes the spare-wheel path too.
IMAGE=(numpy pandas psutil pyyaml tqdm nvidia-ml-py pytest packaging narwhals pygments
  typing-extensions==4.12.2)

find_python() { # the first that runs: a pyenv shim may exist without its version active
  local candidate
  for candidate in ${GPU_DRYRUN_PYTHON:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
  return 1
}
PY312=$(find_python) || { echo "dry_run: no python3.12 here (set GPU_DRYRUN_PYTHON)" >&2; exit 4; }

if [ "${1:-}" = "--fill-cache" ]; then
  mkdir -p "$CACHE/wheels"
  "$PY312" -m pip download --only-binary=:all: -d "$CACHE/wheels" "$TORCH" "${IMAGE[@]}"
  exit 0
fi

OUT_DIR=${1:?usage: dry_run.sh OUT_DIR | --fill-cache}
if ! compgen -G "$CACHE/wheels/torch-2.11.0-cp312-*.whl" >/dev/null; then
  echo "dry_run: no torch 2.11.0 wheel for Python 3.12 in $CACHE/wheels:" \
    "run 'bash scripts/gpu/dry_run.sh --fill-cache' once (about 2.7 GB)" >&2
  exit 4
fi

VENV=$CACHE/image-venv
STAMP="$PY312 $TORCH ${IMAGE[*]}"
if [ "${GPU_DRYRUN_FRESH:-}" = 1 ] || [ "$(cat "$VENV/.image" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$VENV"
  "$PY312" -m venv "$VENV"
  (
    for var in $(compgen -e); do case $var in PIP_*) unset "$var" ;; esac; done
    PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --quiet --no-index \
      --disable-pip-version-check --find-links "$CACHE/wheels" "$TORCH" "${IMAGE[@]}"
  )
  echo "$STAMP" >"$VENV/.image"
fi
# The venv must hold nothing of gpudiag's that the image lacks (the check never installs there).
holds='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in sys.argv[1:]))'
if ! "$VENV/bin/python" -I -c "$holds" gpudiag msgspec pydantic plotly ipywidgets anywidget IPython; then
  echo "dry_run: $VENV holds more than the image: GPU_DRYRUN_FRESH=1 makes it anew" >&2
  exit 4
fi

# As on the GPU machine: its python3 first on PATH, no PYTHONPATH, no pip settings of ours.
cd "$(dirname "$0")/../.."
for var in $(compgen -e); do case $var in PIP_* | PYTHONPATH | VIRTUAL_ENV) unset "$var" ;; esac; done
export PATH="$VENV/bin:$PATH"
exec bash scripts/gpu/check_offline.sh "$OUT_DIR"
