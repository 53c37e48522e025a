#!/usr/bin/env bash
# Runs a test command once more, and only once, when it died of the one known crash that is not
# this package's: the SEGV of libdispatch's manager thread in `_dispatch_event_loop_drain`
# (swiftlang/swift-corelibs-libdispatch#949, a dispatch_muxnote used after it is freed under
# source register/cancel churn; docs/reliability.md). Any other failure — a test that fails, a
# sanitizer report, another crash — fails at once, and so does the known crash a second time.
#   Tests/Sanitizers/retry-known-crash.sh COMMAND [ARG...]
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for attempt in 1 2; do
  "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  ((status == 0)) && exit 0
  if ((attempt == 1)) && grep -q "SEGV" "$log" && grep -q "_dispatch_event_loop_drain" "$log" \
    && ! grep -qE "WARNING: ThreadSanitizer|ERROR: AddressSanitizer: [a-z-]+ on|ERROR: LeakSanitizer|✘ Test" "$log"; then
    echo
    echo "retry-known-crash: the run died of libdispatch's known manager-thread crash" \
      "(_dispatch_event_loop_drain, swift-corelibs-libdispatch#949), with no test failure or" \
      "sanitizer report before it; running it once more"
    continue
  fi
  exit "$status"
done
