SHELL := /bin/bash
# GCD — typed RAII wrappers over libdispatch for Linux Swift.
# Only the Swift toolchain is needed (libdispatch ships inside it).

SWIFT ?= swift
EXAMPLES := $(sort $(notdir $(patsubst %/,%,$(wildcard Examples/*/))))

.PHONY: all build test differential examples lint format docs docs-twice docs-links docs-selftest docs-check api-check api-baseline static-examples bench io-stall-probe reader-probe fence-probe bench-http sanitize sanitize-thread sanitize-address clean

SYMBOL_GRAPHS := .build/docs/symbol-graphs
DOCS_OUT := .build/documentation

# The benchmark's C variant (Benchmarks/c/bench_c.c) is built with the
# toolchain's own clang, dispatch headers and libraries, found from `swift`
# itself: <toolchain>/usr/bin/swift -> <toolchain>/usr.
TOOLCHAIN_USR = $(shell dirname "$$(dirname "$$(readlink -f "$$(command -v $(SWIFT))")")")
BENCH_C_LIB ?= .build/bench/libbench_c.so
BENCH_ALLOC_LIB ?= .build/bench/libbench_allocations.so
# How the toolchain's tools (swift-symbolgraph-extract, swift-api-digester) load the debug build's
# GCD.swiftmodule: its module folder, the CGCD module map SwiftPM generates, the toolchain's resources.
DEBUG_BIN = $(shell $(SWIFT) build --show-bin-path)
MODULE_SEARCH = -I "$(DEBUG_BIN)/Modules" -Xcc -fmodule-map-file="$(DEBUG_BIN)/CGCD.build/module.modulemap" \
  -resource-dir "$(TOOLCHAIN_USR)/lib/swift" -target "$$($(SWIFT) -print-target-info | sed -n 's/.*"triple": "\(.*\)".*/\1/p' | head -1)"
BENCH_ARGS ?=
# Extra `swift run` options for bench, e.g. SWIFTPM_FLAGS="--scratch-path /tmp/build"
SWIFTPM_FLAGS ?=

all: build

## build: debug build of the library, the tests and every example; warnings fail it
build:
	@$(SWIFT) build --build-tests 2>&1 | tee .build-log.txt; status=$${PIPESTATUS[0]}; \
	  if [ $$status -ne 0 ]; then rm -f .build-log.txt; exit $$status; fi; \
	  if grep -q "warning:" .build-log.txt; then echo "make build: warnings are errors here"; rm -f .build-log.txt; exit 1; fi; \
	  rm -f .build-log.txt

## test: docs/listings.md, the DocC articles, the README and docs/ pages checked against the
## examples' code (docs/listings.sh, docs/docc-listings.sh), the DocC tutorial's code files
## compiled (docs/tutorial-check.sh), the whole test
## suite (Swift Testing), examples included, once: a run that dies fails (no retry), then one
## --quick run of the benchmark (debug build) so that it cannot rot. The differential suites
## (docs/reliability.md, "Differential tests") run their fixed budget from seed 38 here.
test: build $(BENCH_C_LIB)
	docs/listings.sh --check
	docs/docc-listings.sh --check
	docs/tutorial-check.sh
	$(SWIFT) test --skip-build
	GCD_BENCH_C_LIB="$(abspath $(BENCH_C_LIB))" "$$($(SWIFT) build --show-bin-path)/GCDBenchmarks" --quick >/dev/null
	@echo "GCDBenchmarks --quick: ok"

## differential: the differential suites alone (Tests/GCDDifferentialTests: seeded sequences of
## source and stream-channel operations run through `import Dispatch` and through GCD, what a user
## observes compared; docs/reliability.md, "Differential tests"): COUNT sequences of each profile
## from SEED (default: each test's make-test budget from seed 38). A failure prints its sequence's
## seed and a shrunk reproduction; `make differential SEED=<that seed> COUNT=1` replays it. ALL=1
## goes on after a difference and reports each kind once.
differential:
	@$(SWIFT) build --build-tests
	GCD_DIFF_SEED="$(SEED)" GCD_DIFF_COUNT="$(COUNT)" GCD_DIFF_ALL="$(ALL)" GCD_DIFF_SCENARIOS=1 \
	  $(SWIFT) test --skip-build --filter GCDDifferentialTests

## bench: GCD vs C vs `import Dispatch` in release mode (docs/performance.md);
## BENCH_ARGS passes options, e.g. make bench BENCH_ARGS="--filter sync --svg docs/performance.svg"
## Each operation's heap allocations are counted by $(BENCH_ALLOC_LIB), preloaded (bench_allocations.c).
## The table goes into $(BENCH_DOC)'s <!-- bench:begin --> … <!-- bench:end --> block (--doc; a run of
## some operations rewrites their rows alone); BENCH_DOC= skips it, as do --variant, --quick, --count.
BENCH_DOC ?= docs/performance.md
bench: $(BENCH_C_LIB) $(BENCH_ALLOC_LIB)
	$(SWIFT) build -c release $(SWIFTPM_FLAGS) --product GCDBenchmarks
	GCD_BENCH_C_LIB="$(abspath $(BENCH_C_LIB))" LD_PRELOAD="$(abspath $(BENCH_ALLOC_LIB))" \
	  "$$($(SWIFT) build -c release $(SWIFTPM_FLAGS) --show-bin-path)/GCDBenchmarks" $(BENCH_ARGS) \
	  $(if $(and $(BENCH_DOC),$(if $(filter --variant --quick --count --list,$(BENCH_ARGS)),,yes)),--doc "$(BENCH_DOC)")

## bench-scale: the scale curves (docs/performance.md, "Scale") in release mode: C, GCD and
## `import Dispatch` at N up to 100,000; writes the tables into docs/performance.md's Scale section
## and one log-log SVG chart per curve into docs/performance-scale/ (root raises the descriptor and
## inotify limits for the run and restores them). BENCH_ARGS="--only timers,proc_sources" measures
## those curves and rewrites their blocks alone; an unknown name, or a selection of none, is an error
bench-scale: $(BENCH_C_LIB)
	GCD_BENCH_C_LIB="$(abspath $(BENCH_C_LIB))" $(SWIFT) run -c release $(SWIFTPM_FLAGS) GCDBenchmarks --scale \
	  --charts docs/performance-scale --scale-doc docs/performance.md $(BENCH_ARGS)

## bench-scale-quick: each scale curve at two small N with the debug build `make build` made (the
## targets compare each variant's growth with its own, so the build mode does not matter); fails
## when a target breaks (a broken one is measured again, twice at most); CI runs it after make test
bench-scale-quick: $(BENCH_C_LIB)
	@$(SWIFT) build --product GCDBenchmarks >/dev/null
	GCD_BENCH_C_LIB="$(abspath $(BENCH_C_LIB))" "$$($(SWIFT) build --show-bin-path)/GCDBenchmarks" --scale --quick $(BENCH_ARGS)

.PHONY: bench-scale bench-scale-quick

$(BENCH_ALLOC_LIB): Benchmarks/c/bench_allocations.c
	@mkdir -p $(dir $@)
	"$(TOOLCHAIN_USR)/bin/clang" -O2 -shared -fPIC -Wall -Wextra -Werror $< -o $@

$(BENCH_C_LIB): Benchmarks/c/bench_c.c
	@mkdir -p $(dir $@)
	"$(TOOLCHAIN_USR)/bin/clang" -O2 -fblocks -shared -fPIC -Wall -Wextra -Werror \
	  -I"$(TOOLCHAIN_USR)/lib/swift" $< -o $@ \
	  -L"$(TOOLCHAIN_USR)/lib/swift/linux" -ldispatch -lBlocksRuntime -Wl,-rpath,"$(TOOLCHAIN_USR)/lib/swift/linux"

## io-stall-probe: the libdispatch stall that makes IOChannel give a socket's writes their own
## C channel, in C (Benchmarks/probes/io_socket_stall.c): 12 loopback rounds with the reads and a
## 64 MiB write on one dispatch_io channel (some stall), then 12 with the write on a second
## channel over dup() (none may); about a minute. Not part of CI: the first half fails on purpose.
io-stall-probe:
	@mkdir -p .build/bench
	"$(TOOLCHAIN_USR)/bin/clang" -O2 -fblocks -Wall -Wextra -Werror -I"$(TOOLCHAIN_USR)/lib/swift" \
	  Benchmarks/probes/io_socket_stall.c -o .build/bench/io_socket_stall \
	  -L"$(TOOLCHAIN_USR)/lib/swift/linux" -ldispatch -lBlocksRuntime -Wl,-rpath,"$(TOOLCHAIN_USR)/lib/swift/linux"
	-.build/bench/io_socket_stall 12
	.build/bench/io_socket_stall 12 split

## reader-probe: libdispatch alone, in C (Benchmarks/probes/reader_after_full_writer.c): a read
## source started after a write source on its socket filled it stays silent with bytes queued
## (docs/reliability.md, `readerAfterFullWriter`); exits 1 while libdispatch does so. Not part of CI.
reader-probe:
	@mkdir -p .build/bench
	"$(TOOLCHAIN_USR)/bin/clang" -O2 -fblocks -Wall -Wextra -Werror -I"$(TOOLCHAIN_USR)/lib/swift" \
	  Benchmarks/probes/reader_after_full_writer.c -o .build/bench/reader_after_full_writer \
	  -L"$(TOOLCHAIN_USR)/lib/swift/linux" -ldispatch -lBlocksRuntime -Wl,-rpath,"$(TOOLCHAIN_USR)/lib/swift/linux"
	.build/bench/reader_after_full_writer

## sanitize: the whole test suite but the differential suites (their 5 s deadlines) under ThreadSanitizer,
## then under AddressSanitizer (with LeakSanitizer), each in its own build folder; see docs/reliability.md
## fence-probe: the descriptor fence's candidate designs, in C (Benchmarks/probes/fence_candidates.c):
## one-shot re-arm per event, edge-triggered with a drained rule, the same with a batch per wait,
## level-triggered, io_uring multishot poll (the reader waits; workers reap; a batched wait);
## system calls, wake-ups and lost requests per request (docs/sources-linux.md).
## Not part of CI.
fence-probe:
	@mkdir -p .build/bench
	gcc -O2 -Wall -Wextra -Werror -pthread Benchmarks/probes/fence_candidates.c -o .build/bench/fence_candidates
	.build/bench/fence_candidates

## bench-http: the HTTP probe server on the package and on `import Dispatch` under wrk, keep-alive
## and Connection: close, in interleaved rounds: req/s, CPU and system calls per request
## (Benchmarks/http.sh; needs wrk and strace: apt-get install wrk strace). Not part of CI.
bench-http:
	swift build -c release --product GCDBenchmarks
	Benchmarks/http.sh $(or $(ROUNDS),2)

sanitize: sanitize-thread sanitize-address

# Synchronization.Mutex's contended path is invisible to TSan; this preload
# tells TSan about it (Tests/Sanitizers/tsan-mutex.c). The test run uses two
# TSan suppressions, for one report inside the Swift runtime's continuations
# (Tests/Sanitizers/tsan.supp says which and why).
TSAN_MUTEX_LIB := .build/sanitizers/libtsan-mutex.so

# --no-parallel: the suites one at a time (TSan's shadow memory and the churn tests' 4 threads on
# 2 cores). Every suite runs once; a run that dies fails.
sanitize-thread: $(TSAN_MUTEX_LIB)
	$(SWIFT) build --build-tests --sanitize=thread --scratch-path .build/sanitize-thread
	LD_PRELOAD="$(abspath $(TSAN_MUTEX_LIB))" TSAN_OPTIONS="suppressions=$(abspath Tests/Sanitizers/tsan.supp)" \
	  $(SWIFT) test --skip-build --disable-xctest --no-parallel --sanitize=thread --scratch-path .build/sanitize-thread \
	  --skip GCDDifferentialTests

# (ld.gold warns once per ASan helper symbol, "Cannot export local symbol
# '__asan_check_...'", about 3,000 lines of noise: filtered out.)
sanitize-address:
	@$(SWIFT) build --build-tests --sanitize=address --scratch-path .build/sanitize-address 2>&1 \
	  | grep -v "Cannot export local symbol '__asan_"; exit $${PIPESTATUS[0]}
	LSAN_OPTIONS="suppressions=$(abspath Tests/Sanitizers/lsan.supp):print_suppressions=0" \
	  $(SWIFT) test --skip-build --disable-xctest --sanitize=address --scratch-path .build/sanitize-address \
	  --skip GCDDifferentialTests

$(TSAN_MUTEX_LIB): Tests/Sanitizers/tsan-mutex.c
	@mkdir -p $(dir $@)
	"$(TOOLCHAIN_USR)/bin/clang" -O2 -shared -fPIC -Wall -Wextra -Werror $< -o $@

## examples: build and run every example, printing its name and its output
examples:
	@$(SWIFT) build
	@bin=$$($(SWIFT) build --show-bin-path); status=0; \
	for name in $(EXAMPLES); do \
	  echo "=== Example$$name"; \
	  "$$bin/Example$$name" || { echo "!!! Example$$name exited with status $$?"; status=1; }; \
	  echo; \
	done; exit $$status

## lint: swift-format in lint mode over every Swift file
lint:
	$(SWIFT) format lint --strict --recursive Package.swift Sources Tests Examples Benchmarks

## format: rewrite every Swift file with swift-format
format:
	$(SWIFT) format format --in-place --recursive Package.swift Sources Tests Examples Benchmarks

## docs: the DocC site (with the toolchain's docc) in .build/documentation; warnings fail it, and so
## does a public symbol or an article that no Topics group curates (scripts/docs-coverage.swift).
## The symbol graphs are extracted from the debug build's GCD.swiftmodule every time, so a warm tree
## builds the same site as a cold one (see docs/site.md).
docs:
	$(SWIFT) build --target GCD
	rm -rf $(SYMBOL_GRAPHS) $(DOCS_OUT) && mkdir -p $(SYMBOL_GRAPHS)
	"$(TOOLCHAIN_USR)/bin/swift-symbolgraph-extract" -module-name GCD $(MODULE_SEARCH) \
	  -minimum-access-level public -emit-extension-block-symbols -skip-inherited-docs -output-dir $(SYMBOL_GRAPHS)
	"$(TOOLCHAIN_USR)/bin/docc" convert Sources/GCD/GCD.docc --additional-symbol-graph-dir $(SYMBOL_GRAPHS) \
	  --fallback-display-name GCD --fallback-bundle-identifier org.gcd.GCD \
	  --transform-for-static-hosting --warnings-as-errors --output-path $(DOCS_OUT)
	$(SWIFT) scripts/docs-coverage.swift $(SYMBOL_GRAPHS) Sources/GCD/GCD.docc $(DOCS_OUT)
	@echo "documentation: $(DOCS_OUT)/documentation/gcd/index.html"

## docs-twice: `make docs` on the tree as it is, then again on the now warm tree; both sites must
## be the same, page for page (CI runs this)
docs-twice:
	$(MAKE) docs
	rm -rf .build/documentation-first && cp -R $(DOCS_OUT) .build/documentation-first
	$(MAKE) docs
	$(SWIFT) scripts/docs-same.swift .build/documentation-first $(DOCS_OUT)

## docs-links: the built site's render JSON: every page a Topics group or a link names exists, as
## JSON and as HTML, and every example a page names exists (no browser; CI runs this)
docs-links:
	$(SWIFT) scripts/docs-links.swift $(DOCS_OUT) Examples

## docs-selftest: proves the documentation checks can fail: each rejects a copy with one defect
## made on purpose (scripts/docs-selftest.sh; CI runs this)
docs-selftest:
	scripts/docs-selftest.sh

## docs-check: docs-twice, docs-links, docs-selftest, then the site opened as a reader would, in
## headless Chromium (scripts/docs-check.sh installs Debian's chromium if it can, and says so when
## it skips)
docs-check: docs-twice docs-links docs-selftest
	scripts/docs-check.sh $(DOCS_OUT)

## static-examples: every example built in release mode with --static-swift-stdlib, checked to load
## no toolchain library, and two of them run from outside the build (scripts/static-check.sh)
static-examples:
	scripts/static-check.sh

## api-check: the public API against the checked-in baseline api/GCD.json (swift-api-digester):
## fails when a public name disappears or a declaration changes type; then proves that it can fail
## (scripts/api-check.sh self-test). See docs/api.md.
api-check:
	$(SWIFT) build --target GCD
	scripts/api-check.sh check
	scripts/api-check.sh self-test

## api-baseline: records the public API as it is now in api/GCD.json (review the diff, commit it)
api-baseline:
	$(SWIFT) build --target GCD
	scripts/api-check.sh baseline

clean:
	rm -rf .build
