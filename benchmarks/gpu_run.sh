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
# Logs and an archive land in OUT (default ./gpu-out).
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
if [ "$what" = tests ] || [ "$what" = all ]; then
  dump=$(mktemp -d)
  NB_CUDAGUARD_GPU_DUMP=$dump/cases timeout 400 python3 -m pytest -m gpu -n 8 -p no:cacheprovider \
    -rA -q tests 2>&1 | tee "$out/gpu-tests.log" || status=1
  timeout 200 python3 demo_notebooks/run.py 2>&1 | tee "$out/demos.log" || status=1
  cp -r demo_notebooks/executed "$dump/demos" 2>/dev/null
  tar czf "$out/gpu-cases.tgz" -C "$dump" .
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  {
    timeout 120 python3 benchmarks/bench_extension.py --cuda --cells 2000 --imports 5
    timeout 120 python3 benchmarks/bench_sync.py --gpu --rounds 100
    timeout 400 python3 benchmarks/bench_guard.py --cuda --scale 0.7
    timeout 300 python3 benchmarks/bench_snapshot.py --cuda
    timeout 400 python3 benchmarks/bench_keep.py --repeat 3
  } 2>&1 | tee "$out/gpu-bench.log" || status=1
fi
exit $status
