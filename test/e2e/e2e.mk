# Make fragment for the end-to-end tests; the top-level Makefile includes it.

E2E_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

# Where build-binaries.sh keeps etcd, kube-apiserver, kube-proxy and kubectl,
# keyed by version; the Go harness (test/e2e/cluster) reads the same variable.
EBPF_PROXY_CACHE ?= /var/cache/ebpf-proxy

# Builds the pinned control-plane binaries once (about 8 minutes on 2 cores);
# does nothing when the cache already holds them. Targets that run the
# end-to-end tests depend on it.
.PHONY: k8s-binaries
k8s-binaries:
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) $(E2E_DIR)/build-binaries.sh
