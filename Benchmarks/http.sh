#!/usr/bin/env bash
# The HTTP probe's kernel cost per request (docs/performance.md, "HTTP server"): the probe server
# of `GCDBenchmarks --http-server[-dispatch] PORT SECONDS [short-reads]` under `wrk` on loopback,
# keep-alive and `Connection: close`, each variant in interleaved rounds. Per run: requests per
# second and CPU microseconds per request (user / system, from /proc/PID/stat) without strace, then
# system calls per request by kind from `strace -f -c` in a second run.
#
#   Benchmarks/http.sh [ROUNDS]          (make bench-http; needs wrk and strace: apt-get install)
#
# BIN (default .build/release/GCDBenchmarks), VARIANTS (default "gcd gcd-short dispatch"),
# SECONDS_PER_RUN (default 6), CONNECTIONS (default 64). The variant `nio`, not in the default, runs
# the SwiftNIO twin of the probe server, `NIO_BIN PORT SECONDS` (default
# Benchmarks/NIOTwin/.build/release/NIOTwin; a separate package, built by Benchmarks/NIOTwin/mirror.sh):
#
#   VARIANTS="gcd-short dispatch nio" Benchmarks/http.sh 2
set -euo pipefail
ROUNDS=${1:-2}
BIN=${BIN:-.build/release/GCDBenchmarks}
VARIANTS=${VARIANTS:-"gcd gcd-short dispatch"}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-6}
CONNECTIONS=${CONNECTIONS:-64}
NIO_BIN=${NIO_BIN:-Benchmarks/NIOTwin/.build/release/NIOTwin}
for tool in wrk strace; do
  command -v "$tool" > /dev/null || { echo "http.sh: $tool is missing (apt-get install $tool)" >&2; exit 2; }
done
PORT=$((20000 + RANDOM % 8000))
TICKS=$(getconf CLK_TCK)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command_of() { # variant -> the server's command line, in the array `command`
  case $1 in
    nio) command=("$NIO_BIN" "$PORT" "$((SECONDS_PER_RUN + 2))") ;;
    *)
      read -r -a command < <(arguments "$1")
      command=("$BIN" "${command[@]}")
      ;;
  esac
}

arguments() { # variant -> GCDBenchmarks' arguments
  case $1 in
    gcd) echo "--http-server $PORT $((SECONDS_PER_RUN + 2))" ;;
    gcd-short) echo "--http-server $PORT $((SECONDS_PER_RUN + 2)) short-reads" ;;
    dispatch) echo "--http-server-dispatch $PORT $((SECONDS_PER_RUN + 2))" ;;
    dispatch-short) echo "--http-server-dispatch $PORT $((SECONDS_PER_RUN + 2)) short-reads" ;;
    *) echo "http.sh: unknown variant $1" >&2; exit 2 ;;
  esac
}

load() { # mode -> wrk's output
  local header=()
  [ "$1" = close ] && header=(-H "Connection: close")
  wrk -t2 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" "${header[@]}" "http://127.0.0.1:$PORT/" 2> /dev/null
}

wait_listening() {
  for _ in $(seq 100); do
    (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && return 0
    sleep 0.05
  done
  echo "http.sh: the server did not listen on $PORT" >&2
  exit 1
}

for variant in $VARIANTS; do
  if [ "$variant" = nio ]; then
    [ -x "$NIO_BIN" ] || { echo "http.sh: no $NIO_BIN (build it with Benchmarks/NIOTwin/mirror.sh)" >&2; exit 2; }
  else
    arguments "$variant" > /dev/null # exits at an unknown variant
    [ -x "$BIN" ] || { echo "http.sh: no $BIN (swift build -c release --product GCDBenchmarks)" >&2; exit 2; }
  fi
done

printf '%-10s %-10s %5s %9s %8s %8s %8s %s\n' variant mode round req/s user_us sys_us cpu_us 'calls (by kind)'
for round in $(seq "$ROUNDS"); do
  for mode in keep-alive close; do
    for variant in $VARIANTS; do
      # Without strace: requests per second and CPU per request.
      PORT=$((PORT + 1))
      command_of "$variant"
      "${command[@]}" > "$work/server.out" &
      server=$!
      wait_listening
      read -r -a before < <(cut -d' ' -f14,15 "/proc/$server/stat")
      rate=$(load "$mode" | awk '/Requests\/sec/ {print $2}')
      read -r -a after < <(cut -d' ' -f14,15 "/proc/$server/stat")
      wait "$server"
      requests=$(awk '/requests/ {print $(NF-1)}' "$work/server.out")
      user=$(((after[0] - before[0]) * 1000000 / TICKS))
      system=$(((after[1] - before[1]) * 1000000 / TICKS))
      # With strace: the system calls of the whole run, per request served.
      PORT=$((PORT + 1))
      command_of "$variant"
      strace -f -c -o "$work/strace" "${command[@]}" > "$work/server.out" &
      server=$!
      wait_listening
      load "$mode" > /dev/null
      wait "$server"
      traced=$(awk '/requests/ {print $(NF-1)}' "$work/server.out")
      summary=$(awk -v n="$traced" '
        $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { name = $NF; calls = $4; total += calls; kinds[name] = calls }
        END {
          line = ""
          for (k in kinds) if (kinds[k] / n >= 0.05) line = line sprintf("%s=%.2f ", k, kinds[k] / n)
          printf "%.2f %s", total / n, line
        }' "$work/strace")
      awk -v v="$variant" -v m="$mode" -v r="$round" -v rate="$rate" -v u="$user" -v s="$system" \
        -v n="$requests" -v calls="$summary" \
        'BEGIN { printf "%-10s %-10s %5s %9.0f %8.1f %8.1f %8.1f %s\n", v, m, r, rate, u / n, s / n, (u + s) / n, calls }'
    done
  done
done
