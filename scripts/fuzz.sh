#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of untrusted input (tests/fuzz/targets.h): configures a
# clang build with libFuzzer, ASan and UBSan in --build-dir (-DFLASHSEEK_FUZZ=ON, no CUDA), builds
# the fuzz_<target> binaries, then runs each target for --seconds with --jobs processes. Each
# target's working corpus lives in BUILD/corpus/<target> (seeded by the harness when empty, and
# starting from tests/fuzz/corpus/<target>); crashes, leaks and timeouts go to
# BUILD/crashes/<target>/. Prints one line per target (executions, coverage, corpus, findings).
#
#   scripts/fuzz.sh [--seconds 300] [--jobs 1] [--build-dir build-fuzz] [--no-build]
#                   [--merge-into-tree] [TARGET ...]          (default: every target)
#
# --merge-into-tree minimises each working corpus (libFuzzer -merge=1) and packs it into
# tests/fuzz/corpus/<t>.pack, which ctest's test_fuzz replays in every build: commit it, with a fix
# for anything the campaign found. (The snapshot targets' inputs are 40-700 KB states: leave them
# out, their seeds are rebuilt in code.) A finding is reproduced with BUILD/tests/fuzz_<t> CRASH_FILE, or by copying the file into
# tests/fuzz/corpus/<t>/ and running test_fuzz.
set -euo pipefail

SECONDS_PER=300
JOBS=1
BUILD=build-fuzz
BUILD_IT=1
MERGE=0
TARGETS=()
ALL=(snapshot state_cache safetensors config request completion tokenizer api_keys redis_url)

while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_PER="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --no-build) BUILD_IT=0; shift ;;
    --merge-into-tree) MERGE=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target '$t' (targets: ${ALL[*]})" >&2; exit 2; }
done
[[ "$SECONDS_PER" =~ ^[0-9]+$ && "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds and --jobs take numbers" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [[ $BUILD_IT == 1 ]]; then
  command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER=clang -DFLASHSEEK_CUDA=OFF -DFLASHSEEK_FUZZ=ON >/dev/null
  ninja -C "$BUILD" "${TARGETS[@]/#/fuzz_}"
fi

# The harnesses find the tokenizer and write tiny checkpoints to the temp directory; ASan's leak
# check runs at exit, UBSan stops at the first report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
printf '| target | executions | coverage (edges) | features | corpus | findings |\n|---|---|---|---|---|---|\n'
status=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t" crashes="$BUILD/crashes/$t" log="$BUILD/fuzz-$t.log"
  mkdir -p "$corpus" "$crashes"
  maxlen=65536
  [[ $t == snapshot || $t == state_cache ]] && maxlen=1048576  # a tiny model's state is 40-700 KB
  extra=()
  [[ -d tests/fuzz/corpus/$t ]] && extra+=("tests/fuzz/corpus/$t")
  # libFuzzer reads every corpus directory given and adds new inputs to the first one.
  "$BUILD/tests/fuzz_$t" "$corpus" "${extra[@]}" -max_total_time="$SECONDS_PER" -jobs="$JOBS" \
    -workers="$JOBS" -artifact_prefix="$crashes/" -max_len="$maxlen" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 >"$log" 2>&1 || true
  # With -jobs > 1 each job writes fuzz-<n>.log in the working directory.
  [[ $JOBS -gt 1 ]] && cat fuzz-*.log >>"$log" 2>/dev/null && rm -f fuzz-*.log
  execs=$( (grep -ho 'stat::number_of_executed_units: *[0-9]*' "$log" || true) | awk '{s += $2} END {print s + 0}')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  found=$(find "$crashes" -type f | wc -l)
  [[ $found -gt 0 ]] && status=1
  printf '| %s | %s | %s | %s | %s | %s |\n' "$t" "$execs" "${cov:-?}" "${ft:-?}" \
    "$(find "$corpus" -type f | wc -l)" "$found"
  if [[ $MERGE == 1 ]]; then
    # The smallest set of inputs with the same coverage, packed into one file per target
    # (tests/fuzz/corpus/<t>.pack: "FSFUZZ1\n", then u32 little-endian length + bytes per input).
    merged="$BUILD/merged/$t"
    rm -rf "$merged" && mkdir -p "$merged"
    "$BUILD/tests/fuzz_$t" -merge=1 "$merged" "$corpus" >"$BUILD/merge-$t.log" 2>&1 || true
    python3 - "$merged" "tests/fuzz/corpus/$t.pack" <<'PY'
import os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
names = sorted(os.listdir(src))
with open(dst, "wb") as out:
    out.write(b"FSFUZZ1\n")
    for n in names:
        data = open(os.path.join(src, n), "rb").read()
        out.write(struct.pack("<I", len(data)) + data)
print(f"{dst}: {len(names)} inputs")
PY
  fi
done
[[ $status == 0 ]] || echo "findings under $BUILD/crashes/ (reproduce: $BUILD/tests/fuzz_<target> FILE)"
exit $status
