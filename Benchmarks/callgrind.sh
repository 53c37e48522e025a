#!/usr/bin/env bash
# Instructions and heap allocations per operation, per variant, counted by
# valgrind instead of timed: unlike nanoseconds on a shared 2-core machine,
# these repeat exactly (single-threaded operations) or nearly (operations
# whose work runs on libdispatch's threads).
#
# Each figure is a marginal cost over the whole process, every thread
# included: (count(N2) - count(N1)) / (N2 - N1), so start-up, set-up and
# the drain at the end cancel out.
#   instructions: valgrind --tool=callgrind, "Collected" (Ir)
#   allocations:  valgrind --tool=memcheck, "total heap usage: X allocs"
#
# usage: Benchmarks/callgrind.sh [OP...]   (run `make bench` once first)
#   BIN=path/to/GCDBenchmarks   (default: .build/release/GCDBenchmarks)
#   GCD_BENCH_C_LIB=path        (default: .build/bench/libbench_c.so)
#   N1=2000 N2=6000             (operation counts of the two runs)
#   PROFILE=dir                 also keep the callgrind files of the N2 runs in dir
#   VARIANTS="GCD"              only these variants (default: C GCD Dispatch)
set -euo pipefail

BIN=${BIN:-.build/release/GCDBenchmarks}
LIB=${GCD_BENCH_C_LIB:-.build/bench/libbench_c.so}
N1=${N1:-2000}
N2=${N2:-6000}
OPS=("$@")
if [ ${#OPS[@]} -eq 0 ]; then
  OPS=(async async_f sync sync_f semaphore group_enter_leave group_async merge queue_create
    apply_trivial source_timer source_timer_handlers source_events_cycle source_read source_write source_signal source_data_add source_data_or source_data_replace)
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Valgrind 3.19 gives up on the DWARF 5 debug information of a release build ("Possibly corrupted
# debuginfo file"): it runs a copy without it (the symbol table stays, so profiles keep their
# function names), made by the toolchain's llvm-objcopy.
OBJCOPY=$(dirname "$(readlink -f "$(command -v swift)")")/llvm-objcopy
[ -x "$OBJCOPY" ] || OBJCOPY=objcopy
"$OBJCOPY" --strip-debug "$BIN" "$scratch/GCDBenchmarks" || { echo "callgrind.sh: $OBJCOPY --strip-debug $BIN failed" >&2; exit 1; }
BIN="$scratch/GCDBenchmarks"

# Runs wait for libdispatch's threads to finish their teardown (Harness.swift,
# settle) with polls this far apart: threads crawl under valgrind.
export GCD_BENCH_SETTLE_MS=${GCD_BENCH_SETTLE_MS:-50}

run() { # tool op variant count -> the tool's count
  local tool=$1 op=$2 variant=$3 count=$4 out="$scratch/$1.$2.$3.$4"
  local args=(--c-lib "$LIB" --quick --no-memory --only "$op" --variant "$variant" --count "$count")
  if [ "$tool" = callgrind ]; then
    valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" "${args[@]}" >/dev/null 2>"$out.log" ||
      { echo "callgrind.sh: $op $variant --count $count failed (see below); its figure is -" >&2; tail -5 "$out.log" >&2; return 0; }
    if [ -n "${PROFILE:-}" ] && [ "$count" = "$N2" ]; then
      mkdir -p "$PROFILE" && cp "$out" "$PROFILE/callgrind.$op.$variant"
    fi
    sed -n 's/^summary: //p' "$out"
  else
    valgrind --tool=memcheck --leak-check=no "$BIN" "${args[@]}" >/dev/null 2>"$out.log" ||
      { echo "callgrind.sh: $op $variant --count $count failed under memcheck; its figure is -" >&2; return 0; }
    sed -n 's/.*total heap usage: \([0-9,]*\) allocs.*/\1/p' "$out.log" | tr -d ,
  fi
}

marginal() { # tool op variant -> per-operation figure
  local a b
  a=$(run "$1" "$2" "$3" "$N1")
  b=$(run "$1" "$2" "$3" "$N2")
  if [ -z "$a" ] || [ -z "$b" ]; then echo "-"; return; fi
  awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" 'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }'
}

printf '%-20s %-9s %14s %14s\n' operation variant "instr/op" "allocs/op"
for op in "${OPS[@]}"; do
  for variant in ${VARIANTS:-C GCD Dispatch}; do
    if ! "$BIN" --c-lib "$LIB" --quick --no-memory --only "$op" --variant "$variant" --count 1 2>/dev/null |
      grep -q "^op=$op variant=$variant ns_per_op="; then
      printf '%-20s %-9s %14s %14s\n' "$op" "$variant" n/a n/a
      continue
    fi
    printf '%-20s %-9s %14s %14s\n' "$op" "$variant" "$(marginal callgrind "$op" "$variant")" \
      "$(marginal memcheck "$op" "$variant")"
  done
done
