#!/usr/bin/env bash
# Runs a test command again (once by default; ATTEMPTS below) when it died of the one known crash that is not
# this package's: the SEGV of libdispatch's manager thread in `_dispatch_event_loop_drain`
# (swiftlang/swift-corelibs-libdispatch#949, a dispatch_muxnote used after it is freed when a watched
# descriptor hangs up; docs/reliability.md, "Connection churn"). The package's own descriptor sources never
# let libdispatch see a hang-up (the epoll nest); dispatch_io's stream channels, under IOChannel, still do.
# The crash counts as known only when the crashed thread's first frame is `_dispatch_event_loop_drain`:
# in the Swift runtime's backtrace ("Thread N ... crashed:", then frame 0) or in a sanitizer's report
# ("SEGV on unknown address", then #0). Any other failure — a test that fails, a sanitizer report,
# another crash — fails at once, and so does the known crash in the last attempt.
#   [ATTEMPTS=N] Tests/retry-known-crash.sh COMMAND [ARG...]
# ATTEMPTS (default 2) is how many runs the known crash may take in all; the Makefile gives the I/O
# suites, where it is most frequent (docs/reliability.md), a run of their own with more.
set -uo pipefail
attempts=${ATTEMPTS:-2}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# Whether the log holds the known crash as its crashed thread's first frame.
known_crash() {
  LC_ALL=C awk '
    /Thread [0-9]+ .*crashed:/ { backtrace = 1; next }
    backtrace && /^ *0 / { if ($0 ~ /_dispatch_event_loop_drain/) found = 1; backtrace = 0 }
    /SEGV on unknown address/ { report = 1; next }
    report && /#0 / { if ($0 ~ /_dispatch_event_loop_drain/) found = 1; report = 0 }
    END { exit found ? 0 : 1 }' "$1"
}

for ((attempt = 1; attempt <= attempts; attempt++)); do
  "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  ((status == 0)) && exit 0
  if ((attempt < attempts)) && known_crash "$log" \
    && ! grep -aqE "WARNING: ThreadSanitizer|ERROR: AddressSanitizer: [a-z-]+ on|ERROR: LeakSanitizer|✘ Test" "$log"; then
    echo
    echo "retry-known-crash: attempt $attempt of $attempts died of libdispatch's known manager-thread" \
      "crash (_dispatch_event_loop_drain, swift-corelibs-libdispatch#949), with no test failure or" \
      "sanitizer report before it; running it again"
    continue
  fi
  exit "$status"
done
