SHELL := /bin/bash
# GCD — typed RAII wrappers over libdispatch for Linux Swift.
# Only the Swift toolchain is needed (libdispatch ships inside it).

SWIFT ?= swift
EXAMPLES := $(sort $(notdir $(patsubst %/,%,$(wildcard Examples/*/))))

.PHONY: all build test examples lint format docs clean

SYMBOL_GRAPHS := .build/symbol-graphs
DOCS_OUT := .build/documentation

all: build

## build: debug build of the library, the tests and every example; warnings fail it
build:
	@$(SWIFT) build --build-tests 2>&1 | tee .build-log.txt; status=$${PIPESTATUS[0]}; \
	  if [ $$status -ne 0 ]; then rm -f .build-log.txt; exit $$status; fi; \
	  if grep -q "warning:" .build-log.txt; then echo "make build: warnings are errors here"; rm -f .build-log.txt; exit 1; fi; \
	  rm -f .build-log.txt

## test: the whole test suite (Swift Testing), examples included
test: build
	$(SWIFT) test --skip-build

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
	$(SWIFT) format lint --strict --recursive Package.swift Sources Tests Examples

## format: rewrite every Swift file with swift-format
format:
	$(SWIFT) format format --in-place --recursive Package.swift Sources Tests Examples

## docs: the DocC reference (with the toolchain's docc) in .build/documentation; warnings fail it
docs:
	rm -rf $(SYMBOL_GRAPHS) && mkdir -p $(SYMBOL_GRAPHS)
	$(SWIFT) build --target GCD -Xswiftc -emit-symbol-graph -Xswiftc -emit-symbol-graph-dir -Xswiftc $(SYMBOL_GRAPHS)
	docc convert Sources/GCD/GCD.docc --additional-symbol-graph-dir $(SYMBOL_GRAPHS) \
	  --fallback-display-name GCD --fallback-bundle-identifier org.gcd.GCD \
	  --transform-for-static-hosting --warnings-as-errors --output-path $(DOCS_OUT)
	@echo "documentation: $(DOCS_OUT)/documentation/gcd/index.html"

clean:
	rm -rf .build
