#!/usr/bin/env bash
# One-go GPU run: set up FlashInfer from the carried bundle, make graphtop importable without network, run
# the `cuda` tests, then the benchmarks (docs/development.md, the GPU workflow). Logs and figures go to the
# folder given as $1 (default: $OUT, else ./gpu-out).
#   on the GPU machine:  source .carry/flashinfer/install.sh /tmp/site || exit 1; bash scripts/gpu_check.sh $OUT
# The dashboard benchmark needs textual, pyzmq and msgspec: wheels in .whl/ (docs/development.md) are
# installed here without network.
# Env: GPU_TESTS=0 skips tests, GPU_BENCH=0 skips the benchmarks, GPU_BENCHES picks some of
#      graph,events,dashboard (default) and gemv,skinny,profile,attn,ab,parity,tp,cold,eager; each has its flags
#      variable: graph BENCH_ARGS, events EVENTS_ARGS, dashboard DASH_ARGS, gemv GEMV_ARGS, skinny SKINNY_ARGS,
#      profile PROFILE_ARGS, attn ATTN_ARGS, ab AB_ARGS, parity PARITY_ARGS, tp TP_ARGS (tp needs 2 GPUs),
#      cold COLD_ARGS, eager EAGER_ARGS; the scripts are bench/graph_bench.py (events: --events-only), dashboard_bench.py,
#      skinny_bench.py (gemv: --gemv), profile_decode.py, decode_attn_bench.py, ab_decode.py, parity_bench.py, tp_bench.py,
#      cold_start_bench.py, eager_launch_bench.py (docs/benchmarks.md has the figures). PYTEST_ARGS adds pytest flags; GPU_TEST_FILES replaces the list
#      of test files (default: every tests/cuda/test_*.py); GPU_TEST_PART=1 / 2 runs
#      tests/cuda/test_cuda_kernels.py / the other files of the list; GPU_TEST_SPREAD=N (default 8; 0 or 1:
#      off) runs the decode attention's reference test in N processes first when pytest-xdist is importable
#      and PYTEST_ARGS is empty, then the rest in one.
#   tensor parallel on 2 GPUs only:
#      GPU_TEST_FILES=tests/cuda/test_cuda_tp.py GPU_BENCHES=tp bash scripts/gpu_check.sh $OUT
set -uo pipefail
out="${1:-${OUT:-gpu-out}}"
mkdir -p "$out"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shim and carried wheels
source "$here/scripts/device_env.sh"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
  python3 -c "import textual, zmq, msgspec; print('textual', textual.__version__, 'pyzmq', zmq.__version__, 'msgspec', msgspec.__version__)" 2>&1 | tail -1
} | tee "$out/env.txt"

rc=0
if [ "${GPU_TESTS:-1}" = 1 ]; then
  files=${GPU_TEST_FILES:-$(cd "$here" && ls tests/cuda/test_*.py 2>/dev/null)}
  # the whole suite is long: GPU_TEST_PART=1 runs tests/cuda/test_cuda_kernels.py, GPU_TEST_PART=2 every
  # other file of the list, so two shorter runs cover it
  case "${GPU_TEST_PART:-}" in
    1) files=$(printf '%s\n' $files | grep -x 'tests/cuda/test_cuda_kernels.py') ;;
    2) files=$(printf '%s\n' $files | grep -vx 'tests/cuda/test_cuda_kernels.py') ;;
  esac
  # a test still running after GPU_TEST_STACKS_S seconds gets every thread's stack printed (a hang shows
  # where it waits, even when a time limit ends the run)
  run_tests() {
    (cd "$here" && python3 -m pytest -m cuda -q -p no:cacheprovider -rs --durations=10 \
        -o faulthandler_timeout="${GPU_TEST_STACKS_S:-240}" ${PYTEST_ARGS:-} "$@" 2>&1) \
      | tee -a "$out/cuda-tests.log"
    local trc=${PIPESTATUS[0]}
    [ "$trc" = 0 ] || rc=$trc
  }
  : > "$out/cuda-tests.log"
  # The decode attention's reference test is mostly Triton compiling its launches, one at a time: with
  # pytest-xdist (a carried wheel) GPU_TEST_SPREAD processes share it and the GPU, so the whole suite fits
  # one run of about ten minutes. Every other test runs in one process (some read the GPU's free memory).
  ref=tests/cuda/test_cuda_kernels.py::test_triton_paged_decode_matches_reference
  spread=${GPU_TEST_SPREAD:-8}
  if [ "$spread" -gt 1 ] && [ -z "${PYTEST_ARGS:-}" ] && printf '%s\n' $files | grep -qx tests/cuda/test_cuda_kernels.py \
      && python3 -c "import xdist" 2>/dev/null; then
    run_tests -n "$spread" "$ref"
    run_tests $files --deselect "$ref"
  else
    run_tests $files
  fi
fi
benches=",${GPU_BENCHES:-graph,events,dashboard},"
run_bench() {  # log file name, then the command
  local log=$1; shift
  (cd "$here" && "$@" 2>&1) | tee "$out/$log"
  local brc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && rc=$brc
}
if [ "${GPU_BENCH:-1}" = 1 ]; then
  [[ $benches == *,graph,* ]] && run_bench bench.log python3 bench/graph_bench.py --out "$out" ${BENCH_ARGS:-}
  [[ $benches == *,events,* ]] && run_bench events.log python3 bench/graph_bench.py --events-only --device cuda --shapes qwen3-0.6b --bs 1 \
      --steps 200 --rounds 7 ${EVENTS_ARGS:-}
  [[ $benches == *,dashboard,* ]] && run_bench dashboard.log python3 bench/dashboard_bench.py --out "$out" ${DASH_ARGS:-}
  [[ $benches == *,gemv,* ]] && run_bench gemv.log python3 bench/skinny_bench.py --gemv ${GEMV_ARGS:-}
  [[ $benches == *,skinny,* ]] && run_bench skinny.log python3 bench/skinny_bench.py ${SKINNY_ARGS:-}
  [[ $benches == *,attn,* ]] && run_bench attn.log python3 bench/decode_attn_bench.py --out "$out" ${ATTN_ARGS:-}
  [[ $benches == *,ab,* ]] && run_bench ab.log python3 bench/ab_decode.py ${AB_ARGS:-}
  [[ $benches == *,profile,* ]] && run_bench profile.log python3 bench/profile_decode.py --out "$out" ${PROFILE_ARGS:-}
  [[ $benches == *,parity,* ]] && run_bench parity.log python3 bench/parity_bench.py --device cuda ${PARITY_ARGS:-}
  [[ $benches == *,tp,* ]] && run_bench tp.log python3 bench/tp_bench.py --out "$out" ${TP_ARGS:-}
  [[ $benches == *,cold,* ]] && run_bench cold.log python3 bench/cold_start_bench.py --out "$out" ${COLD_ARGS:-}
  [[ $benches == *,eager,* ]] && run_bench eager.log python3 bench/eager_launch_bench.py ${EAGER_ARGS:-}
fi
exit "$rc"
