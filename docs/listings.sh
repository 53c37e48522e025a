#!/usr/bin/env bash
# Keeps docs/listings.md showing the examples' own code.
#
# Between a line `<!-- example: Name -->` and a line `<!-- end example -->`, docs/listings.md holds
# the exact content of Examples/Name/main.swift in a ```swift fence.
#   docs/listings.sh --write   regenerates those blocks from the files
#   docs/listings.sh --check   exits 1, naming the example, when a block differs from its file, when a
#                              listing example (top comment "// Reproduces …") has no block, or when a
#                              block names no example
# Only bash, awk and coreutils are needed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
doc=docs/listings.md
mode=${1:-}
if [[ $mode != --write && $mode != --check ]] || (($# != 1)); then
  echo "usage: docs/listings.sh --write | --check" >&2
  exit 2
fi

generated=$(mktemp)
report=$(mktemp)
trap 'rm -f "$generated" "$report"' EXIT

# Prints the document with every example block regenerated, and writes to $report one line per
# problem: `differs Name`, `missing Name` (no Examples/Name/main.swift) or `unterminated Name`.
awk -v report="$report" '
  function expected_block(name,    path, line, text, count) {
    path = "Examples/" name "/main.swift"
    text = "```swift\n"
    count = 0
    while ((getline line < path) > 0) { text = text line "\n"; count++ }
    close(path)
    missing = count == 0
    if (missing) print "missing " name > report
    return text "```\n"
  }
  inside && /^<!-- end example -->$/ {
    if (!missing && block != expected) print "differs " name > report
    printf "%s", expected
    print
    inside = 0
    next
  }
  inside { block = block $0 "\n"; next }
  /^<!-- example: [A-Za-z0-9_]+ -->$/ {
    name = $0
    sub(/^<!-- example: /, "", name)
    sub(/ -->$/, "", name)
    expected = expected_block(name)
    block = ""
    inside = 1
    print
    next
  }
  { print }
  END { if (inside) print "unterminated " name > report }
' "$doc" >"$generated"

status=0
while read -r problem name; do
  case $problem in
  missing) echo "$doc: <!-- example: $name --> names no example (no Examples/$name/main.swift)" >&2 ;;
  unterminated) echo "$doc: <!-- example: $name --> has no <!-- end example --> line after it" >&2 ;;
  differs)
    if [[ $mode == --write ]]; then continue; fi
    echo "$doc: the code shown for example $name differs from Examples/$name/main.swift" >&2
    ;;
  esac
  status=1
done <"$report"

# Every listing example (its top comment starts "// Reproduces", as shared/LISTINGS.md asks) has a
# block; the feature examples are shown by their DocC articles instead.
for file in Examples/*/main.swift; do
  name=${file#Examples/}
  name=${name%/main.swift}
  head -n 1 "$file" | grep -q '^// Reproduces' || continue
  if ! grep -qx "<!-- example: $name -->" "$doc"; then
    echo "$doc: example $name has no <!-- example: $name --> block" >&2
    status=1
  fi
done

if ((status != 0)); then
  [[ $mode == --check ]] && echo "(docs/listings.sh --write copies the examples' code into $doc)" >&2
  exit "$status"
fi
if [[ $mode == --write ]]; then
  cmp -s "$generated" "$doc" || cp "$generated" "$doc"
  echo "$doc: the example blocks are written from Examples/*/main.swift"
else
  echo "$doc: every example block matches Examples/<Name>/main.swift"
fi
