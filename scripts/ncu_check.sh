#!/usr/bin/env bash
# Nsight Compute on the GPU machine (where ncu reads the hardware counters):
# per-kernel counters of whole decode steps, and the full report of single decode-attention launches.
# The launches come from bench/profile_decode.py --ncu and bench/decode_attn_bench.py --ncu, inside their NVTX
# range "ncu". Reports go to $1 (default $OUT).
#   on the GPU machine: source .carry/flashinfer/install.sh /tmp/site || exit 1; bash scripts/ncu_check.sh $OUT
# Env: NCU_STEPS  shape:rows pairs, space-separated (default "llama-3.1-8b:64"), each profiled over
#                 NCU_STEP_COUNT decode steps (default 2) with the SpeedOfLight, LaunchStats, Occupancy and
#                 MemoryWorkloadAnalysis sections, CSV, to ncu_step_<shape>_<rows>.csv
#      NCU_ATTN   bench/decode_attn_bench.py --ncu cases (default "64:220:engine,64:220:shuffled,8:220:engine"),
#                 NCU_ATTN_SHAPE (default llama-3.1-8b): `--set full`, text, to ncu_attn.txt; empty skips
set -uo pipefail
out="${1:-${OUT:-gpu-out}}"
mkdir -p "$out"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/device_env.sh"
ncu=$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$ncu" ] || { echo "ncu not found" | tee "$out/ncu.log"; exit 2; }
# leave the clocks alone (figures comparable with the benchmarks'); only kernels inside the range "ncu"
base=("$ncu" --clock-control none --nvtx --nvtx-include "ncu/")
rc=0
cd "$here"
for pair in ${NCU_STEPS-llama-3.1-8b:64}; do
  shape=${pair%%:*} rows=${pair##*:}
  "${base[@]}" --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    --csv --page details --log-file "$out/ncu_step_${shape}_${rows}.csv" \
    python3 bench/profile_decode.py --ncu --shapes "$shape" --bs "$rows" --ncu-steps "${NCU_STEP_COUNT:-2}" \
    2>&1 | tail -20 | tee -a "$out/ncu.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done
cases=${NCU_ATTN-64:220:engine,64:220:shuffled,8:220:engine}
if [ -n "$cases" ]; then
  "${base[@]}" --set full --log-file "$out/ncu_attn.txt" \
    python3 bench/decode_attn_bench.py --ncu "$cases" --shapes "${NCU_ATTN_SHAPE:-llama-3.1-8b}" \
    2>&1 | tail -20 | tee -a "$out/ncu.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit "$rc"
