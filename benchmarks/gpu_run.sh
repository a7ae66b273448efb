#!/usr/bin/env bash
# Everything that needs a real GPU, in one command for a lent GPU machine (see docs/gpu.md).
# That machine has torch with CUDA but no Jupyter packages and no network: carry them as
# wheels in .whl/ (../shared/device/wheels.sh jupyter_server websocket-client wurlitzer
# cloudpickle), with a wheel of this project beside them (python3 -m pip wheel --no-deps -w .whl
# .): the checkout's code comes first on the path, the wheel only registers the pytest plugin's
# entry point.
#
#   benchmarks/gpu_run.sh tests|bench|all [OUT]
#
# tests: the whole `gpu` suite (each poisoning in its own kernel or process), what each real assert
#        showed (JSON, for docs/gpu.md and the recognition tests), every demo notebook on CUDA;
# bench: the extension's per-cell cost with CUDA initialised, `%cudaguard sync on`, the guard
#        against bare and against CUDA_LAUNCH_BLOCKING=1, the cost of `%cudaguard keep` snapshots,
#        restart + restore of 1 GB against a plain restart.
# Logs and an archive land in OUT (default ./gpu-out). GPU_TESTS: the test paths to collect
# (default tests; naming the files that hold `gpu` tests saves the collection of the rest).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${2:-${OUT:-gpu-out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYDEVD_DISABLE_FILE_VALIDATION=1

if [ -d .whl ] && ! python3 -c "import jupyter_client, ipywidgets" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site .whl/*.whl \
    || exit 1
  export PYTHONPATH=$PWD:$PWD/.site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$PWD/.site/bin:$PATH
fi

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  python3 -c "import IPython, ipykernel, jupyter_client, ipywidgets; print('IPython', IPython.__version__, 'ipykernel', ipykernel.__version__, 'jupyter_client', jupyter_client.__version__, 'ipywidgets', ipywidgets.__version__)"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

status=0
# Sized for a lent machine's short lease: the demos (correctness, not timing) run beside the
# tests, and each benchmark has its own limit, so a slow one leaves the others' figures.
if [ "$what" = tests ] || [ "$what" = all ]; then
  dump=$(mktemp -d)
  timeout 220 python3 demo_notebooks/run.py >"$out/demos.log" 2>&1 &
  demos=$!
  NB_CUDAGUARD_GPU_DUMP=$dump/cases timeout 240 python3 -m pytest -m gpu -n 12 -p no:cacheprovider \
    -rA -q --durations=15 ${GPU_TESTS:-tests} 2>&1 | tee "$out/gpu-tests.log" || status=1
  wait $demos || status=1
  cat "$out/demos.log"
  cp -r demo_notebooks/executed "$dump/demos" 2>/dev/null
  tar czf "$out/gpu-cases.tgz" -C "$dump" .
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  bench() {  # LIMIT SCRIPT ARGS...: one benchmark, its log kept even when the limit cuts it
    local limit=$1 name=$2
    shift 2
    echo "== $name $*" | tee -a "$out/gpu-bench.log"
    timeout "$limit" python3 "benchmarks/$name.py" "$@" 2>&1 | tee -a "$out/gpu-bench.log" || status=1
  }
  bench 60 bench_extension --cuda --cells 2000 --imports 5
  bench 90 bench_snapshot --cuda
  bench 200 bench_guard --cuda --scale 0.5
  bench 60 bench_sync --gpu --rounds 60
  bench 120 bench_keep --repeat 2
fi
exit $status
