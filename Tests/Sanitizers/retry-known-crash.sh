#!/usr/bin/env bash
# Runs a test command again (once by default; ATTEMPTS below) when it died of the one known crash that is not
# this package's: the SEGV of libdispatch's manager thread in `_dispatch_event_loop_drain`
# (swiftlang/swift-corelibs-libdispatch#949, a dispatch_muxnote used after it is freed under
# source register/cancel churn; docs/reliability.md). Any other failure — a test that fails, a
# sanitizer report, another crash — fails at once, and so does the known crash in the last attempt.
#   [ATTEMPTS=N] Tests/Sanitizers/retry-known-crash.sh COMMAND [ARG...]
# ATTEMPTS (default 2) is how many runs the known crash may take in all; the Makefile gives the I/O
# suites under ThreadSanitizer, where it is frequent (docs/reliability.md), a run of their own with more.
set -uo pipefail
attempts=${ATTEMPTS:-2}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((attempt = 1; attempt <= attempts; attempt++)); do
  "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  ((status == 0)) && exit 0
  if ((attempt < attempts)) && grep -q "SEGV" "$log" && grep -q "_dispatch_event_loop_drain" "$log" \
    && ! grep -qE "WARNING: ThreadSanitizer|ERROR: AddressSanitizer: [a-z-]+ on|ERROR: LeakSanitizer|✘ Test" "$log"; then
    echo
    echo "retry-known-crash: attempt $attempt of $attempts died of libdispatch's known manager-thread" \
      "crash (_dispatch_event_loop_drain, swift-corelibs-libdispatch#949), with no test failure or" \
      "sanitizer report before it; running it again"
    continue
  fi
  exit "$status"
done
