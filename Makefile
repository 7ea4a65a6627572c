# The two commands of the README: `make test` and `make demo`. `make images`
# builds the test images where no container registry is reachable (CI).

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

GO ?= go
# Packages to test; e.g. `make test PKGS=./tenantdb/tenantdbtest/...`. The
# default is every package of every module of go.work: `./...` stops at a
# nested go.mod, so each module's directory is named.
PKGS ?= $(addsuffix /...,$(shell $(GO) list -m -f '{{.Dir}}'))
# Ryuk, testcontainers' reaper, needs an image from a registry: off unless
# the caller says otherwise. The tests terminate their containers themselves.
TESTCONTAINERS_RYUK_DISABLED ?= true
export TESTCONTAINERS_RYUK_DISABLED

.PHONY: test images demo

# -p 1: one package at a time. Several tests compare latency ratios measured
# in one run (slow-query and CPU-bound isolation on a one-CPU PostgreSQL);
# another package's race-instrumented stress test or container start on the
# same two cores disturbs them. The suite takes a few minutes either way.
test:
	$(GO) test -race -count=1 -p 1 -timeout 45m $(PKGS)

images:
	testdata/build-images.sh

demo:
	$(GO) run ./bench/noisy
