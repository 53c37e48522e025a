#!/usr/bin/env bash
# Proves that the documentation checks can fail: each is run on a copy with one defect made on
# purpose, and must reject it; then on the real thing, and must pass.
#   scripts/docs-selftest.sh      (make docs-selftest; needs a built site: make docs)
#   - docs/docc-listings.sh: a copy of the docs whose Queues article shows changed example code,
#     and one whose guide names an example that does not exist;
#   - scripts/docs-coverage.swift: a copy of the catalog with an article no Topics group lists;
#   - scripts/docs-links.swift: a copy of the site without the page of a type the landing page lists;
#     one whose table of contents no longer lists the chapter its tutorial page names (the chapter's
#     reference, a path under the table of contents with no page of its own, then leads nowhere);
#     one whose tutorial page lacks the section anchor a link names; one without the tutorial page
#     its table of contents links;
#   - scripts/docs-same.swift: a copy of the site with one page's text changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
swift=${SWIFT:-swift}
site=.build/documentation
graphs=.build/docs/symbol-graphs
[[ -f $site/index.html && -d $graphs ]] || {
  echo "docs-selftest: no site in $site: run make docs" >&2
  exit 2
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

# Runs "$@" (a check on a defective copy); it must fail.
must_fail() {
  local what=$1
  shift
  if "$@" >"$work/log" 2>&1; then
    echo "docs-selftest: the check passed $what" >&2
    status=1
  else
    echo "docs-selftest: rejected $what: $(grep -m1 -E 'docs-|differs|names|not curated|links to' "$work/log" | cut -c1-150)"
  fi
}

# docs/docc-listings.sh on a copy of the files it reads.
copy() {
  rm -rf "$work/tree" && mkdir -p "$work/tree/Sources/GCD"
  cp -R docs Examples README.md "$work/tree/"
  cp -R Sources/GCD/GCD.docc "$work/tree/Sources/GCD/"
}
copy
sed -i '0,/^let myCustomQueue = /s//let myCustomQueue2 = /' "$work/tree/Sources/GCD/GCD.docc/Queues.md"
must_fail "an article whose example code differs from the example" "$work/tree/docs/docc-listings.sh" --check
copy
echo 'Run `swift run ExampleNoSuchExample`.' >>"$work/tree/docs/guide.md"
must_fail "a page naming an example that does not exist" "$work/tree/docs/docc-listings.sh" --check

# docs-coverage with an article that no Topics group lists.
cp -R Sources/GCD/GCD.docc "$work/catalog.docc"
printf '# An orphan\n\nNo Topics group lists this article.\n' >"$work/catalog.docc/Orphan.md"
must_fail "an article no Topics group lists" "$swift" scripts/docs-coverage.swift "$graphs" "$work/catalog.docc" "$site"

# docs-links without the page of a type the landing page lists.
cp -R "$site" "$work/site"
rm -rf "$work/site/data/documentation/gcd/semaphore.json" "$work/site/documentation/gcd/semaphore"
must_fail "a site missing a page the landing page links" "$swift" scripts/docs-links.swift "$work/site" Examples

# docs-links on the tutorial pages: a chapter the table of contents does not list, a section anchor
# the tutorial does not have, a tutorial page the table of contents links but the site lacks.
toc=$(cd "$site/data" && ls tutorials/*.json | head -1)
tutorial=$(cd "$site/data" && ls tutorials/*/*.json | head -1)
rm -rf "$work/site" && cp -R "$site" "$work/site"
sed -i -E 's/("name" *: *")A Linux service"/\1A Linux daemon"/' "$work/site/data/$toc"
must_fail "a tutorial page naming a chapter its table of contents does not list" "$swift" scripts/docs-links.swift "$work/site" Examples
rm -rf "$work/site" && cp -R "$site" "$work/site"
sed -i -E 's/("anchor" *: *")Do-the-work-on-a-timer"/\1Do-the-work-on-a-clock"/' "$work/site/data/$tutorial"
must_fail "a link to a tutorial section anchor the tutorial does not have" "$swift" scripts/docs-links.swift "$work/site" Examples
rm -rf "$work/site" && cp -R "$site" "$work/site"
rm -rf "$work/site/data/$tutorial" "$work/site/${tutorial%.json}"
must_fail "a site missing the tutorial page its table of contents links" "$swift" scripts/docs-links.swift "$work/site" Examples

# docs-same with one page's text changed.
rm -rf "$work/site" && cp -R "$site" "$work/site"
sed -i 's/Grand Central Dispatch/Grand Central  Dispatch/' "$work/site/data/documentation/gcd.json"
must_fail "two sites that differ in one page" "$swift" scripts/docs-same.swift "$site" "$work/site"

# And the real thing passes.
docs/docc-listings.sh --check >/dev/null || { echo "docs-selftest: docs/docc-listings.sh --check fails on the tree" >&2; status=1; }
"$swift" scripts/docs-links.swift "$site" Examples >/dev/null || { echo "docs-selftest: docs-links fails on the site" >&2; status=1; }
((status == 0)) && echo "docs-selftest: every documentation check rejects its defect and passes the real tree"
exit "$status"
