#!/usr/bin/env bash
# The GPU check: what needs a lent GPU machine (one GPU, 16 cores), in at most 8 minutes.
#
#   bench/gpu_check.sh            on the GPU machine, from the source tree, with its own python
#   bench/gpu_check.sh --dry-run  here, on CPU: every step that needs CUDA says "skipped: no GPU"
#
# It runs the GPU-marked tests (tests/gpu), the GPU figures (bench/overhead.py fp32, bf16 and
# compiled on the MLP; examples/mnist1d_cnn.yaml and the char GPT through the trainer;
# bench/transformer.py; submit -> first step of a job on a GPU node) and the figures that need
# its cores (bench/time_to_accuracy.py --scale 1,2,4,8: allreduce and downpour, each process
# on a core of its own; bench/ps_throughput.py --pin with 2 shards and 2 Redis servers on cores
# of their own), and writes a dated Markdown section (GPU model, driver, torch, the command,
# each step's figures) to paste into docs/performance.md: $OUT/gpu-check.md where $OUT is set
# (the device run's folder that comes back), else .gpu-check/gpu-check.md.
#
# The machine has no package registry: what its image lacks comes from .wheelhouse
# (`make wheelhouse` here; the run carries it), installed into a folder on PYTHONPATH.
# Each step has a time limit, cut to what is left of the 8 minutes; a step that no longer fits
# says so. The script exits 0 when every step that ran passed.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DRY=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
        *) echo "bench/gpu_check.sh: unknown argument $arg (--dry-run, --help)" >&2; exit 2 ;;
    esac
done

BUDGET=${GPU_CHECK_SECONDS:-480}
STARTED=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
WHERE=${OUT:-$ROOT/.gpu-check}
mkdir -p "$WHERE/logs"
REPORT=$WHERE/gpu-check.md
export PYTHONPATH=$ROOT

if [[ $DRY == 1 ]]; then
    PY=${PYTHON:-$ROOT/.venv/bin/python}
else
    PY=${PYTHON:-python3}
    if [[ -d $ROOT/.wheelhouse ]]; then
        DEPS=${TMPDIR:-/tmp}/trainyard-gpu-deps
        "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
            --find-links "$ROOT/.wheelhouse" --target "$DEPS" -r bench/gpu_wheels.txt \
            > "$WHERE/logs/wheelhouse.log" 2>&1 || {
            echo "bench/gpu_check.sh: the wheelhouse did not install; see $WHERE/logs/wheelhouse.log" >&2
            exit 1
        }
        export PYTHONPATH=$ROOT:$DEPS
    fi
fi

GPU=0
if [[ $DRY == 0 ]] && "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    GPU=1
fi
CORES=$("$PY" -c "import os; print(len(os.sched_getaffinity(0)))")
FAILED=0
ROWS=()
DETAILS=()

# step NAME NEEDS SECONDS COMMAND...: NEEDS is "gpu" or a number of cores.
step() {
    local name=$1 needs=$2 limit=$3
    shift 3
    local shown="\`${*}\`"
    shown=${shown//$PY/python}
    if [[ $needs == gpu && $GPU == 0 ]]; then
        ROWS+=("| $name | skipped: no GPU | | $shown |")
        echo "$name: skipped: no GPU"
        return
    fi
    if [[ $needs != gpu && $CORES -lt $needs ]]; then
        ROWS+=("| $name | skipped: needs $needs cores, this machine has $CORES | | $shown |")
        echo "$name: skipped: needs $needs cores ($CORES here)"
        return
    fi
    local left=$((BUDGET - ($(date +%s) - STARTED)))
    if ((left < 15)); then
        ROWS+=("| $name | skipped: out of the $((BUDGET / 60)) minutes | | $shown |")
        echo "$name: skipped: out of time"
        return
    fi
    ((limit > left)) && limit=$left
    local log=$WHERE/logs/$name.log began rc result
    began=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
    rc=$?
    local seconds=$(($(date +%s) - began))
    case $rc in
        0) result=passed ;;
        124 | 137) result="timed out after ${limit} s"; FAILED=1 ;;
        *) result="failed (exit $rc)"; FAILED=1 ;;
    esac
    ROWS+=("| $name | $result | $seconds s | $shown |")
    DETAILS+=("#### $name ($result)" "" '```' "$(grep -v -e '^W[0-9]\{4\} ' -e 'Warning' "$log" | tail -n 25)" '```' "")
    echo "$name: $result in $seconds s"
}

B=bench
step gpu-tests gpu 120 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider -o addopts=""
step overhead-fp32 gpu 30 "$PY" $B/overhead.py --device cuda --steps 1000
step overhead-bf16 gpu 30 "$PY" $B/overhead.py --device cuda --steps 1000 --precision bf16
step overhead-compiled gpu 60 "$PY" $B/overhead.py --device cuda --steps 1000 --compile
step submit-to-first-step-gpu gpu 45 "$PY" $B/submit_latency.py --gpus 1 --runs 5 --gap 1
step mnist1d-cnn gpu 25 "$PY" $B/example_throughput.py examples/mnist1d_cnn.yaml --device cuda
step char-gpt gpu 30 "$PY" $B/example_throughput.py examples/char_gpt.yaml --device cuda --steps 200
step transformer gpu 40 "$PY" $B/transformer.py --device cuda --steps 200
step time-to-accuracy-scale 9 150 "$PY" $B/time_to_accuracy.py --scale 1,2,4,8 --plot "$WHERE/tta_scale.png"
step ps-throughput-pinned 5 30 "$PY" $B/ps_throughput.py --shards 2 --redis-servers 2 --pin --cpu

{
    echo "### GPU check, $(date -u +%Y-%m-%d) (bench/gpu_check.sh$([[ $DRY == 1 ]] && echo ' --dry-run'))"
    echo
    if [[ $GPU == 1 ]]; then
        echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1) (model, memory, driver)"
    else
        echo "- GPU: none$([[ $DRY == 1 ]] && echo ' (a dry run on CPU)')"
    fi
    echo "- torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)'), Python $("$PY" -c 'import platform; print(platform.python_version())'), $CORES cores; load average before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- source: $(git rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'); command: \`bash bench/gpu_check.sh$([[ $DRY == 1 ]] && echo ' --dry-run')\`; $(($(date +%s) - STARTED)) s in all"
    echo
    echo "| step | result | time | command |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
    echo
    ((${#DETAILS[@]})) && printf '%s\n' "${DETAILS[@]}"
} > "$REPORT"
echo "report: $REPORT"
exit $FAILED
