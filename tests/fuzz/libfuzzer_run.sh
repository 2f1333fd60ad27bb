#!/usr/bin/env bash
# libfuzzer_run.sh SOURCE_DIR WORK_DIR SECONDS: builds pool_fuzz with clang's
# libFuzzer (+ASan/UBSan) beside a gcc build, and fuzzes the pool against the
# driver model for SECONDS, keeping the corpus in WORK_DIR. A crash leaves
# crash-* in WORK_DIR (replay it: pool_fuzz_replay FILE).
set -euo pipefail
src=$1 work=$2 seconds=$3
mkdir -p "$work/corpus"
# shellcheck disable=SC2046
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -DFMT_HEADER_ONLY -I"$src/tests/unit" -I"$src/shim/base" -I"$src/shim/core" \
  -I"$src/shim/cuda" -isystem /usr/local/cuda/include \
  "$src/tests/fuzz/pool_fuzz.cc" "$src/shim/core/pool.cc" "$src/shim/core/pool_park.cc" \
  "$src/shim/core/pool_autopin.cc" "$src/shim/base/types.cc" \
  "$src/shim/base/config.cc" "$src/shim/base/json.cc" "$src/shim/core/memory_budget.cc" \
  $(pkg-config --libs absl_str_format absl_strings) -o "$work/pool_fuzz"
cd "$work"
rc=0
./pool_fuzz -max_total_time="$seconds" -max_len=4096 -seed=1 -print_final_stats=1 corpus \
  >fuzz.log 2>&1 || rc=$?
grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|artifact_prefix)" fuzz.log || true
[[ $rc -eq 0 ]] || tail -40 fuzz.log
exit "$rc"
