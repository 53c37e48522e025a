#!/usr/bin/env bash
# Guards the public API that programs outside this repository compile against (docs/api.md).
#
#   scripts/api-check.sh check       fails when a public name of api/GCD.json is gone from the module,
#                                    or a declaration changed its type or its signature; new public
#                                    names pass (with a note: `make api-baseline` records them)
#   scripts/api-check.sh baseline    writes api/GCD.json from the module as it is (a deliberate act:
#                                    review the diff, then commit it)
#   scripts/api-check.sh self-test   proves `check` can fail: against a copy of the baseline in which
#                                    one contract name is renamed (the module then lacks it: a removed
#                                    name) and one in which Semaphore.signal() returns Int, not Bool
#                                    (a changed type), `check` must fail; against the baseline, pass
#
# Reads the debug build's GCD.swiftmodule with the toolchain's swift-api-digester (run `swift build`
# first; the Makefile targets do). Only the Swift toolchain is needed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

swift=${SWIFT:-swift}
baseline=api/GCD.json
toolchain=$(dirname "$(dirname "$(readlink -f "$(command -v "$swift")")")")
digester=$toolchain/bin/swift-api-digester
bin=$("$swift" build --show-bin-path)
triple=$("$swift" -print-target-info | sed -n 's/.*"triple": "\(.*\)".*/\1/p' | head -1)
search=(-I "$bin/Modules" -Xcc -fmodule-map-file="$bin/CGCD.build/module.modulemap"
  -resource-dir "$toolchain/lib/swift" -target "$triple")
[[ -f $bin/Modules/GCD.swiftmodule ]] || {
  echo "api-check: no $bin/Modules/GCD.swiftmodule: run swift build first" >&2
  exit 2
}

dump() { "$digester" -dump-sdk -module GCD "${search[@]}" -avoid-location -avoid-tool-args -o "$1"; }

# Diagnoses the module against baseline $1; prints the breakages; fails when there is one.
diagnose() {
  local log
  log=$(mktemp)
  if "$digester" -diagnose-sdk -module GCD "${search[@]}" -baseline-path "$1" -compiler-style-diags \
    >/dev/null 2>"$log"; then
    rm -f "$log"
    return 0
  fi
  grep -E "error:|API breakage" "$log" >&2 || cat "$log" >&2
  rm -f "$log"
  return 1
}

case ${1:-} in
check)
  [[ -f $baseline ]] || {
    echo "api-check: no $baseline: run make api-baseline" >&2
    exit 1
  }
  if ! diagnose "$baseline"; then
    echo "api-check: the public API lost or changed the declarations above (baseline: $baseline)." >&2
    echo "Keep the old names (add, rename none: docs/api.md); if the break is deliberate, run make api-baseline and say so in CHANGELOG.md." >&2
    exit 1
  fi
  current=$(mktemp)
  dump "$current"
  if cmp -s "$current" "$baseline"; then
    echo "api-check: the public API matches $baseline"
  else
    echo "api-check: nothing public was removed or changed; the module's API dump differs from $baseline (new declarations, or moved ones): run make api-baseline to guard them"
  fi
  rm -f "$current"
  ;;
baseline)
  mkdir -p "$(dirname "$baseline")"
  dump "$baseline"
  echo "api-check: wrote $baseline ($(grep -c '"usr":' "$baseline") declarations and types)"
  ;;
self-test)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # A contract name the module lacks: dispatchMain renamed in the baseline (name, USR, mangled name).
  sed 's/dispatchMain/dispatchMainGone/g' "$baseline" >"$work/removed.json"
  # A changed type: the Bool that Semaphore.signal() returns becomes an Int.
  awk '
    /"printedName": "signal\(\)",/ { in_signal = 1 }
    in_signal && /"name": "Bool",/ { sub(/"Bool"/, "\"Int\"") }
    in_signal && /"printedName": "Swift.Bool",/ { sub(/Swift.Bool/, "Swift.Int") }
    in_signal && /"usr": "s:Sb"/ { sub(/s:Sb/, "s:Si"); in_signal = 0 }
    { print }
  ' "$baseline" >"$work/retyped.json"
  status=0
  for mutant in removed retyped; do
    if cmp -s "$work/$mutant.json" "$baseline"; then
      echo "api-check self-test: the $mutant mutation did not change $baseline (its target is gone?)" >&2
      status=1
    elif diagnose "$work/$mutant.json" 2>"$work/$mutant.log"; then
      echo "api-check self-test: check passed against a baseline with a $mutant declaration" >&2
      status=1
    else
      echo "api-check self-test: a $mutant declaration fails the check: $(head -1 "$work/$mutant.log" | sed 's/.*error: //')"
    fi
  done
  if ! diagnose "$baseline"; then
    echo "api-check self-test: the module does not pass against $baseline itself" >&2
    status=1
  fi
  exit "$status"
  ;;
*)
  echo "usage: scripts/api-check.sh check | baseline | self-test" >&2
  exit 2
  ;;
esac
