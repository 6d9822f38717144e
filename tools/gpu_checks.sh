#!/usr/bin/env bash
# Everything only a GPU machine can check, in one go (issue 14): the GPU tests (every strategy on
# CUDA, the README's and docs/gpus.md's GPU command lines among them), a bf16 ADNI run at the docs'
# settings, and benchmarks/adni_throughput.py. Logs go to $OUT (default ./gpu-logs).
#
#   bash tools/gpu_checks.sh                   # from the repository root, on a machine with CUDA
#   MNIST=/path/to/mnist bash tools/gpu_checks.sh
#
# tests/gpu reads MNIST from ../shared/data/mnist (the CLI tests skip, saying so, without it); MNIST
# names another folder to link there. Each step has its own time limit, so one hang cannot eat the rest.
set -u
OUT=${OUT:-gpu-logs}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ -n "${MNIST:-}" ] && [ ! -e ../shared/data/mnist ]; then
  mkdir -p ../shared/data && ln -s "$(cd "$MNIST" && pwd)" ../shared/data/mnist
fi

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch, pytorch_lightning as pl; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', pl.__version__)"
  nproc; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.txt, print its tail and status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  PYTHONUNBUFFERED=1 timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  tail -n "${TAIL:-25}" "$OUT/$name.txt"
}

step tests_gpu "${TESTS_LIMIT:-300}" "$PY" -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rs ${PYTEST_ARGS:-}
# The throughput benchmark with nothing else running: its timings are reported.
step adni_throughput "${THROUGHPUT_LIMIT:-150}" "$PY" benchmarks/adni_throughput.py ${THROUGHPUT_ARGS:-}
step adni_throughput_96 60 "$PY" benchmarks/adni_throughput.py --shape 96 112 96 --contender device
[ -n "${SKIP_ADNI_RUN:-}" ] || step adni_bf16 "${ADNI_LIMIT:-60}" "$PY" -m lightning_hybrid.cli experiment=akintoye2022_adni data=adni_phantoms trainer=gpu \
  trainer.precision=bf16-mixed data.subjects=24 trainer.max_epochs=2 hydra.run.dir=/tmp/adni_bf16_run
