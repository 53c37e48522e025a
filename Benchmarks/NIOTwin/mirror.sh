#!/usr/bin/env bash
# Builds the SwiftNIO twin without a git host: points SwiftPM's URLs for swift-nio and the packages
# its manifest names at local git repositories, then builds in release mode.
#
#   Benchmarks/NIOTwin/mirror.sh [MIRRORS]     (MIRRORS default /work/.mirror)
#
# MIRRORS/<owner>+<name>/repo is a bare copy of github.com/<owner>/<name> with its tags (as the
# session tool `fetch` lays them out). Such snapshots can lack an object or two on side branches
# (large files are left out), and SwiftPM clones every ref, so the clone would fail ("unable to read
# <sha>"); hence each one is first narrowed to a bare repository of its tags and main branch, in
# Benchmarks/NIOTwin/.mirrors/, and SwiftPM is pointed there. With MIRRORS=none no mirror is set and
# SwiftPM fetches from GitHub as for any user.
#
# The mirrors are written by `swift package config set-mirror` to
# Benchmarks/NIOTwin/.swiftpm/configuration/mirrors.json (SwiftPM's default place for them). Both
# .mirrors/ and .swiftpm/ name this machine's paths, so git ignores them: run this script once per
# checkout. Then: VARIANTS="gcd-short dispatch nio" Benchmarks/http.sh
set -euo pipefail
MIRRORS=${1:-/work/.mirror}
PACKAGE=$(cd "$(dirname "$0")" && pwd)
# swift-nio and the dependencies of its manifest (swift-nio 2.101: atomics, collections, system).
REPOSITORIES="apple/swift-nio apple/swift-atomics apple/swift-collections apple/swift-system"

if [ "$MIRRORS" != none ]; then
  for repository in $REPOSITORIES; do
    source="$MIRRORS/${repository/\//+}/repo"
    [ -d "$source/.git" ] && source="$source/.git"
    git --git-dir="$source" rev-parse --verify -q HEAD > /dev/null || {
      echo "mirror.sh: no git repository at $source (a copy of https://github.com/$repository.git)" >&2
      exit 2
    }
    narrowed="$PACKAGE/.mirrors/${repository#*/}.git"
    [ -d "$narrowed" ] || git init -q --bare "$narrowed"
    branch=$(git --git-dir="$source" symbolic-ref --short HEAD 2> /dev/null || echo main)
    git --git-dir="$narrowed" fetch -q --prune --no-tags "$source" \
      "+refs/tags/*:refs/tags/*" "+refs/heads/$branch:refs/heads/$branch"
    git --git-dir="$narrowed" symbolic-ref HEAD "refs/heads/$branch"
    swift package --package-path "$PACKAGE" config set-mirror \
      --original "https://github.com/$repository.git" --mirror "file://$narrowed"
  done
fi
swift build -c release --package-path "$PACKAGE"
echo "mirror.sh: built $PACKAGE/.build/release/NIOTwin"
