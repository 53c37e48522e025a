#!/usr/bin/env bash
# The deployment shape of a service: every example built in release mode with
# `--static-swift-stdlib` (the Swift runtime and standard library, libdispatch and BlocksRuntime
# linked into the executable), checked to need no shared library of the toolchain, then two of them
# run from a folder outside the build with an empty environment.
#   scripts/static-check.sh          (make static-examples)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
swift=${SWIFT:-swift}
scratch=.build/static

"$swift" build -c release --static-swift-stdlib --scratch-path "$scratch"
bin=$("$swift" build -c release --static-swift-stdlib --scratch-path "$scratch" --show-bin-path)

status=0
count=0
for executable in "$bin"/Example*; do
  [[ -f $executable && -x $executable ]] || continue
  count=$((count + 1))
  shared=$(ldd "$executable" | grep -E 'libswift|libdispatch|libBlocksRuntime|libFoundation|/opt/swift' || true)
  if [[ -n $shared ]]; then
    echo "static-check: $(basename "$executable") still loads toolchain libraries:" >&2
    echo "$shared" >&2
    status=1
  fi
done
((count > 0)) || {
  echo "static-check: no Example executables in $bin" >&2
  exit 1
}

# Run two from elsewhere, with no PATH or LD_LIBRARY_PATH pointing at the toolchain.
away=$(mktemp -d)
trap 'rm -rf "$away"' EXIT
cp "$bin/ExampleTour" "$bin/ExampleTimer" "$away/"
for run in "ExampleTour" "ExampleTimer 0.05 3"; do
  set -- $run
  if output=$(cd "$away" && env -i "./$1" "${@:2}" 2>&1); then
    echo "static-check: $run ran statically linked: $(echo "$output" | tail -1)"
  else
    echo "static-check: $run failed statically linked:" >&2
    echo "$output" >&2
    status=1
  fi
done
((status == 0)) && echo "static-check: $count examples link the Swift runtime and libdispatch statically"
exit "$status"
