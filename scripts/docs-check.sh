#!/usr/bin/env bash
# Opens the built DocC site as a reader would, in headless Chromium (docs/site.md).
#
#   scripts/docs-check.sh [--all] [<site>]      (default site: .build/documentation; make docs first)
#
# DocC's static site is a JavaScript app that fetches each page's JSON, so the site is served over
# http on 127.0.0.1 (python3's http.server) and each page is loaded with `chromium --headless
# --dump-dom`. For the landing page, every article, every tutorial page and every symbol page a
# Topics group links from them (with --all: every page of the site), the rendered DOM must hold the
# page's title in the page's own heading and a body of text (not the empty app shell, not "page not
# found"), and every internal link the rendered page shows must resolve to a page or file of the
# site; a link with an anchor (a tutorial's chapter `/tutorials/gcd/#a-linux-service`, a step's
# section) must name an element id of its page's rendered DOM when that page is one of those opened. The list of pages comes from scripts/docs-links.swift, which also checks the render JSON's
# links and the examples the pages name. Last, a screenshot of the landing page is written to
# .build/docs/landing.png.
#
# Chromium comes from Debian's `chromium` package: the script installs it with apt-get when it is
# missing and it can (root, apt-get present); otherwise it says so and skips the browser part, with
# status 0, after the JSON checks have passed. CI runs only the JSON checks (make docs-twice
# docs-links).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

all=0
if [[ ${1:-} == --all ]]; then
  all=1
  shift
fi
site=${1:-.build/documentation}
swift=${SWIFT:-swift}
[[ -f $site/index.html ]] || {
  echo "docs-check: no site in $site: run make docs" >&2
  exit 2
}

work=$(mktemp -d)
server=
cleanup() {
  [[ -n $server ]] && kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$swift" scripts/docs-links.swift "$site" Examples "$work/reachable.txt"

skip() {
  echo "docs-check: SKIPPED the browser part: $1. The render JSON checks above passed; nothing was opened in a browser."
  exit 0
}

browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "docs-check: installing Debian's chromium (apt-get install -y chromium)"
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; } >"$work/apt.log" 2>&1 ||
      skip "apt-get could not install chromium (see the log: $(tail -1 "$work/apt.log"))"
    browser=$(command -v chromium || true)
  fi
  [[ -n $browser ]] || skip "no chromium, and no way to install it here (needs root and apt-get)"
fi
command -v python3 >/dev/null || skip "no python3 to serve the site over http"

port=$((20000 + RANDOM % 20000))
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$site" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 50); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  sleep 0.1
done
base=http://127.0.0.1:$port

chrome() {
  "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$work/profile-$BASHPID" --virtual-time-budget=15000 "$@" 2>/dev/null
}

# The pages to open: the landing page, articles and tutorials (site paths of depth 3 or less, and
# every tutorials/ page), and the symbol pages the landing page's and the articles' Topics link.
if ((all)); then
  cp "$work/reachable.txt" "$work/pages.txt"
else
  awk -F'\t' '{ n = split($1, part, "/") } n <= 3 || part[1] == "tutorials"' "$work/reachable.txt" >"$work/pages.txt"
fi

# Checks one page; prints nothing when it is fine, one line per problem otherwise.
check_page() {
  local page=${1%%$'\t'*} title=${1#*$'\t'} dom heading
  dom="$work/dom-${page//\//_}.html"
  chrome --dump-dom "$base/$page/" >"$dom" || true
  # The page's own heading, as DocC renders it: <h1 class="title"> (a tutorial's: <h1 class="heading">),
  # its text split by <wbr> and <span>s.
  heading=$(tr '\n' ' ' <"$dom" | grep -oE '<h1[^>]*class="(title|heading)"[^>]*>.*' |
    sed -e 's#</h1>.*##' -e 's/<[^>]*>//g' -e 's/&amp;/\&/g' -e 's/&lt;/</g' -e 's/&gt;/>/g' \
      -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | head -1 || true)
  if [[ $heading != "$title" ]]; then
    echo "$page: the rendered page's heading is \"$heading\", not \"$title\" (an empty app shell?)"
  fi
  if grep -q "The page you're looking for can't be found" "$dom"; then
    echo "$page: the app says the page cannot be found"
  fi
  local text
  text=$(sed -e 's/<script.*<\/script>//g' -e 's/<style.*<\/style>//g' -e 's/<[^>]*>/ /g' "$dom" | tr -s ' \n' ' ' | wc -c)
  ((text > 400)) || echo "$page: the rendered page holds only $text characters of text"
  # Every internal link the reader can click.
  grep -oE 'href="/[^"#]*' "$dom" | sed 's/^href="//' | sort -u | while read -r link; do
    local target=${link%/}
    target=${target#/}
    [[ -z $target ]] && target=index.html
    if [[ ! -e $site/$target && ! -e $site/$target/index.html ]]; then
      echo "$page: links to $link, which is not in the site"
    fi
  done
  # Links with an anchor, checked against the target's DOM once every page is open.
  grep -oE 'href="/[^"]*#[^"]+"' "$dom" | sed -e 's/^href="//' -e 's/"$//' | sort -u |
    sed "s#^#$page\t#" >"$work/anchors-${page//\//_}.txt" || true
}
export -f check_page chrome
export work site base browser

count=$(wc -l <"$work/pages.txt")
echo "docs-check: opening $count pages in $browser"
tr '\n' '\0' <"$work/pages.txt" | xargs -0 -P 2 -I{} bash -c 'check_page "$@"' _ {} >"$work/problems.txt"

# Every anchor a page links names an element id of its target's DOM (when the target was opened).
anchors=0
while IFS=$'\t' read -r page link; do
  target=${link%%#*}
  anchor=${link#*#}
  target=${target%/}
  target=${target#/}
  dom="$work/dom-${target//\//_}.html"
  [[ -f $dom ]] || continue
  anchors=$((anchors + 1))
  grep -qF "id=\"$anchor\"" "$dom" || echo "$page: links to $link, but the rendered /$target has no element with id $anchor" >>"$work/problems.txt"
done < <(cat "$work"/anchors-*.txt 2>/dev/null)

mkdir -p .build/docs
chrome --screenshot="$PWD/.build/docs/landing.png" --window-size=1280,1400 --hide-scrollbars \
  "$base/documentation/gcd/" >/dev/null || true
[[ -s .build/docs/landing.png ]] || echo "landing page: no screenshot was written" >>"$work/problems.txt"

if [[ -s $work/problems.txt ]]; then
  sed 's/^/docs-check: /' "$work/problems.txt" >&2
  exit 1
fi
echo "docs-check: $count pages render their heading and content in Chromium, and every link they show resolves ($anchors anchors among them)"
echo "docs-check: screenshot of the landing page: .build/docs/landing.png"
