# The two commands of the README: `make test` and `make demo`. Each first
# builds the test images it needs where no container registry serves the
# official ones (testdata/build-images.sh --if-needed: silent when they exist
# or a registry answers). `make images` builds or updates all of them.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

GO ?= go
# Packages to test; e.g. `make test PKGS=./tenantdb/tenantdbtest/...`. The
# default is every package of every module of go.work: `./...` stops at a
# nested go.mod, so each module's directory is named.
PKGS ?= $(addsuffix /...,$(shell $(GO) list -m -f '{{.Dir}}'))
# Ryuk, testcontainers' reaper, needs an image from a registry: off unless
# the caller says otherwise. The tests terminate their containers themselves
# (and tenantdbtest turns Ryuk off itself where its image cannot be had).
TESTCONTAINERS_RYUK_DISABLED ?= true
export TESTCONTAINERS_RYUK_DISABLED

.PHONY: test images demo test-images demo-images

# -p 1: one package at a time. Several tests compare latency ratios measured
# in one run (slow-query and CPU-bound isolation on a one-CPU PostgreSQL);
# another package's race-instrumented stress test or container start on the
# same two cores disturbs them. The suite takes a few minutes either way.
test: test-images
	$(GO) test -race -count=1 -p 1 -timeout 45m $(PKGS)

images:
	testdata/build-images.sh

test-images:
	@testdata/build-images.sh --if-needed

# The demo needs PostgreSQL only.
demo-images:
	@testdata/build-images.sh --if-needed postgres

# The guide's experiment and the fair-share row, about a minute; exits 1
# when a target of its table is missed. `go run ./bench/noisy -scenarios all`
# runs every scenario.
demo: demo-images
	$(GO) run ./bench/noisy
