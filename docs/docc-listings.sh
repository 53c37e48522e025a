#!/usr/bin/env bash
# Keeps the DocC articles, the README and the docs/ pages showing compiled code, not copies that drift.
# (docs/listings.sh does the same for docs/listings.md, which shows every example whole.)
#
# In Sources/GCD/GCD.docc/**/*.md, README.md and docs/*.md (but docs/listings.md), three kinds of block:
#   <!-- example: Name -->           a ```swift fence holding Examples/Name/main.swift, whole
#   <!-- example: Name#region -->    a ```swift fence holding the lines of Examples/Name/main.swift
#                                    between `// docs: begin region` and `// docs: end region`
#   <!-- listing: Name -->           a ```c fence holding the C listing of the `### Name` section of
#                                    docs/listings.md (its first ```c fence)
#   <!-- page: name#region -->       the lines of docs/name.md between `<!-- docs: begin region -->`
#                                    and `<!-- docs: end region -->`, as they are (a DocC article
#                                    that shows a docs/ page's table without a second copy to edit)
# each closed by `<!-- end example -->`, `<!-- end listing -->` or `<!-- end page -->`. The same files may only name
# examples that exist: every `swift run Example<Name>` and every `Examples/<Name>/main.swift`.
#   docs/docc-listings.sh --write   regenerates the blocks
#   docs/docc-listings.sh --check   exits 1, naming file and block, when a block differs from its
#                                   source, names no example, region or listing, or is unterminated,
#                                   and when a file names an example that does not exist
# Only bash, awk, grep and coreutils are needed. New articles are found, not listed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-}
if [[ $mode != --write && $mode != --check ]] || (($# != 1)); then
  echo "usage: docs/docc-listings.sh --write | --check" >&2
  exit 2
fi

mapfile -t documents < <(
  {
    find Sources/GCD/GCD.docc -name '*.md'
    echo README.md
    find docs -maxdepth 1 -name '*.md' ! -name listings.md
  } | sort
)

generated=$(mktemp)
report=$(mktemp)
trap 'rm -f "$generated" "$report"' EXIT

status=0
blocks=0
for doc in "${documents[@]}"; do
  : >"$report"
  # Prints the document with every block regenerated; writes one line per problem to $report.
  awk -v report="$report" -v doc="$doc" '
    function example_text(spec,    name, region, path, line, text, count, on) {
      name = spec; region = ""
      if (index(spec, "#") > 0) { name = substr(spec, 1, index(spec, "#") - 1); region = substr(spec, index(spec, "#") + 1) }
      path = "Examples/" name "/main.swift"
      text = ""; count = 0; on = (region == "")
      while ((getline line < path) > 0) {
        if (region != "" && line ~ ("^[ \t]*// docs: end " region "$")) { on = 0; continue }
        if (on) { text = text line "\n"; count++ }
        if (region != "" && line ~ ("^[ \t]*// docs: begin " region "$")) on = 1
      }
      close(path)
      if (count == 0) { print "missing example " spec > report; failed = 1 }
      return "```swift\n" text "```\n"
    }
    function listing_text(name,    path, line, text, section, fence, found) {
      path = "docs/listings.md"
      text = ""; section = 0; fence = 0; found = 0
      while ((getline line < path) > 0) {
        if (found == 2) continue
        if (line ~ /^### /) section = (line == "### " name)
        if (!section) continue
        if (fence) { if (line == "```") { found = 2; fence = 0 } else text = text line "\n"; continue }
        if (line == "```c" && !found) { fence = 1; found = 1 }
      }
      close(path)
      if (found != 2) { print "missing listing " name > report; failed = 1 }
      return "```c\n" text "```\n"
    }
    function page_text(spec,    name, region, path, line, text, on, count) {
      name = substr(spec, 1, index(spec, "#") - 1); region = substr(spec, index(spec, "#") + 1)
      path = "docs/" name ".md"
      text = ""; on = 0; count = 0
      while ((getline line < path) > 0) {
        if (line == "<!-- docs: end " region " -->") on = 0
        if (on) { text = text line "\n"; count++ }
        if (line == "<!-- docs: begin " region " -->") on = 1
      }
      close(path)
      if (index(spec, "#") == 0 || count == 0) { print "missing page " spec > report; failed = 1 }
      return text
    }
    inside && $0 == closing {
      if (!failed && block != expected) print "differs " kind " " spec > report
      printf "%s", expected
      print
      inside = 0
      next
    }
    inside { block = block $0 "\n"; next }
    /^<!-- (example|listing|page): [A-Za-z0-9_#-]+ -->$/ {
      kind = $2; sub(/:$/, "", kind)
      spec = $3
      failed = 0
      expected = kind == "example" ? example_text(spec) : kind == "listing" ? listing_text(spec) : page_text(spec)
      closing = "<!-- end " kind " -->"
      block = ""; inside = 1
      print "block" > report
      print
      next
    }
    { print }
    END { if (inside) print "unterminated " kind " " spec > report }
  ' "$doc" >"$generated"

  while read -r problem kind spec; do
    case $problem in
    block) blocks=$((blocks + 1)); continue ;;
    missing)
      if [[ $kind == example ]]; then
        echo "$doc: <!-- example: $spec --> names no example or region (Examples/${spec%%#*}/main.swift, // docs: begin ${spec#*#})" >&2
      elif [[ $kind == page ]]; then
        echo "$doc: <!-- page: $spec --> names no region (<!-- docs: begin ${spec#*#} --> in docs/${spec%%#*}.md)" >&2
      else
        echo "$doc: <!-- listing: $spec --> names no listing (no \`### $spec\` section with a \`\`\`c fence in docs/listings.md)" >&2
      fi
      ;;
    unterminated) echo "$doc: <!-- $kind: $spec --> has no <!-- end $kind --> line after it" >&2 ;;
    differs)
      if [[ $mode == --write ]]; then continue; fi
      echo "$doc: the code shown for <!-- $kind: $spec --> differs from its source" >&2
      ;;
    esac
    status=1
  done <"$report"
  if [[ $mode == --write ]] && ((status == 0)); then
    cmp -s "$generated" "$doc" || cp "$generated" "$doc"
  fi

  # Every example a page tells the reader to run, or points at, exists.
  while read -r name; do
    if [[ ! -f Examples/$name/main.swift ]]; then
      echo "$doc: names Example$name, but there is no Examples/$name/main.swift" >&2
      status=1
    fi
  done < <(grep -oE '(swift run Example[A-Za-z0-9_]+|Examples/[A-Za-z0-9_]+/main\.swift)' "$doc" |
    sed -E 's#^swift run Example##; s#^Examples/##; s#/main\.swift$##' | sort -u)
done

if ((status != 0)); then
  [[ $mode == --check ]] && echo "(docs/docc-listings.sh --write copies the code into the blocks)" >&2
  exit "$status"
fi
if [[ $mode == --write ]]; then
  echo "docc-listings: $blocks blocks in ${#documents[@]} files written from the examples and docs/listings.md"
else
  echo "docc-listings: $blocks blocks in ${#documents[@]} files match the examples and docs/listings.md"
fi
