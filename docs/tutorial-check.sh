#!/usr/bin/env bash
# Keeps the DocC tutorial from rotting: every code file it shows (Sources/GCD/GCD.docc/Resources/
# *.swift.txt, one whole program per step of "Build a Linux service with GCD") is type-checked in
# Swift 6 mode against the debug build's GCD module and linted with swift-format, and every file a
# `@Code(… file: "…")` of a tutorial names must exist. The steps are documentation resources, not
# sources of the package: `.txt`, so that they are not taken for module code (each step repeats the
# one before it, as a tutorial's steps do, and imports Glibc as a user's program does).
#   docs/tutorial-check.sh      (make test runs it after the build; needs only the toolchain)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
swift=${SWIFT:-swift}
catalog=Sources/GCD/GCD.docc
bin=$("$swift" build --show-bin-path)
[[ -f $bin/Modules/GCD.swiftmodule ]] || {
  echo "tutorial-check: no $bin/Modules/GCD.swiftmodule: run swift build first" >&2
  exit 2
}
toolchain=$(dirname "$(dirname "$(readlink -f "$(command -v "$swift")")")")

status=0
count=0
while read -r name; do
  if [[ ! -f $catalog/Resources/$name ]]; then
    echo "tutorial-check: a tutorial shows $name, but there is no $catalog/Resources/$name" >&2
    status=1
  fi
done < <(grep -ohE '@Code\([^)]*file: *"[^"]+"' "$catalog"/Tutorials/*.tutorial | sed -E 's/.*file: *"([^"]+)".*/\1/' | sort -u)

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for file in "$catalog"/Resources/*.swift.txt; do
  [[ -e $file ]] || continue
  count=$((count + 1))
  mkdir -p "$scratch/$count"
  copy="$scratch/$count/main.swift"
  cp "$file" "$copy"
  if ! output=$("$toolchain/bin/swiftc" -typecheck -swift-version 6 -warnings-as-errors -I "$bin/Modules" \
    -Xcc -fmodule-map-file="$bin/CGCD.build/module.modulemap" "$copy" 2>&1); then
    echo "tutorial-check: $file does not compile:" >&2
    echo "${output//$copy/$file}" >&2
    status=1
  fi
  if ! output=$("$swift" format lint --strict --configuration .swift-format "$copy" 2>&1) || [[ -n $output ]]; then
    echo "tutorial-check: $file is not formatted (swift format):" >&2
    echo "${output//$copy/$file}" >&2
    status=1
  fi
done
((count > 0)) || {
  echo "tutorial-check: no code files in $catalog/Resources" >&2
  exit 1
}
((status == 0)) && echo "tutorial-check: the tutorial's $count code files compile against GCD"
exit "$status"
