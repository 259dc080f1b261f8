# Make fragment for the end-to-end tests; the top-level Makefile includes it.
# It also works on its own from the repository root:
#   make -f test/e2e/e2e.mk e2e

SHELL := /bin/bash
GO ?= go

E2E_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
# The repository root, whatever directory make runs in.
E2E_ROOT := $(abspath $(E2E_DIR)/../..)
# Where the suite writes its log, the differential report and summary.
E2E_OUT ?= $(E2E_ROOT)/bin/e2e
E2E_AGENT := $(E2E_ROOT)/bin/ebpf-proxy

# Where build-binaries.sh keeps etcd, kube-apiserver, kube-proxy and kubectl,
# keyed by version; the Go harness (test/e2e/cluster) reads the same variable.
EBPF_PROXY_CACHE ?= /var/cache/ebpf-proxy

# Builds the pinned control-plane binaries once (about 8 minutes on 2 cores);
# does nothing when the cache already holds them. Targets that run the
# end-to-end tests depend on it.
.PHONY: k8s-binaries
k8s-binaries:
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) $(E2E_DIR)/build-binaries.sh

# Also the kubelet, kube-controller-manager and kube-scheduler that the
# cluster test runs in a VM guest (test/cluster); once, several minutes.
.PHONY: node-binaries
node-binaries:
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) $(E2E_DIR)/build-binaries.sh node

# The agent binary every end-to-end test runs (go build is incremental).
.PHONY: e2e-agent
e2e-agent:
	cd $(E2E_ROOT) && $(GO) build -ldflags "$(AGENT_LDFLAGS)" -o $(E2E_AGENT) ./cmd/ebpf-proxy

# The end-to-end suite as root: the harness, the testbed, the agent against
# a real API server, and the differential run of every scenario against
# upstream kube-proxy (iptables, nftables) and ebpf-proxy (BPF mode and the
# iptables fallback), and the short chaos run (test/e2e/chaos: about a
# minute and a half). Packages run one at a time: each starts its own control
# plane, and the machine has two cores. The differential report goes to
# $(E2E_OUT)/report.txt; the last lines printed are the chaos summary, one
# line per scenario, then the differential summary, one line per fallback
# mode, then the BPF mode's line.
#   EBPF_PROXY_E2E_PENDING=1 also runs the scenarios of known differences.
.PHONY: e2e
e2e: k8s-binaries e2e-agent
	@mkdir -p $(E2E_OUT)
	@rm -f $(E2E_OUT)/summary.txt $(E2E_OUT)/report.txt $(E2E_OUT)/chaos.txt
	@cd $(E2E_ROOT) && \
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) EBPF_PROXY_BIN=$(E2E_AGENT) EBPF_PROXY_E2E_OUT=$(E2E_OUT) \
	EBPF_PROXY_REQUIRE_PRIVILEGED=1 \
	$(GO) test -count=1 -p 1 -timeout 30m ./test/e2e/... > $(E2E_OUT)/go-test.log 2>&1; \
	status=$$?; \
	grep -v '^[[:space:]]*{"level"' $(E2E_OUT)/go-test.log | grep -E -v '^[[:space:]]+[IWE][0-9]{4} ' ; \
	echo "full log: $(E2E_OUT)/go-test.log; differential report: $(E2E_OUT)/report.txt"; \
	if [ -s $(E2E_OUT)/chaos.txt ]; then cat $(E2E_OUT)/chaos.txt; \
	else echo "chaos: did not complete (see $(E2E_OUT)/go-test.log)"; status=1; fi; \
	if [ -s $(E2E_OUT)/summary.txt ]; then cat $(E2E_OUT)/summary.txt; \
	else echo "differential: did not complete (see $(E2E_OUT)/go-test.log)"; status=1; fi; \
	exit $$status

# The long chaos run (not part of make test; `make e2e` runs the short one):
# with TCP and UDP clients running and every failed connection counted, the
# agent SIGKILLed 20 times in about 2 minutes, the API server gone for 60 s
# with Services and endpoints changed meanwhile, endpoints replaced in a
# rolling fashion every second for 2 minutes, maps filled past their
# capacity, the bpffs pins removed behind the agent's back, and 10 minutes
# of Services made, moved and deleted while the agent's memory, descriptors
# and goroutines are watched (its line gives the figures the DaemonSet's
# requests and limits come from). Prints one line per scenario (chaos:
# scenario=... attempts=N failed=F ...), also written to
# $(E2E_OUT)/chaos.txt; the whole log goes to $(E2E_OUT)/chaos.log. About 19
# minutes.
.PHONY: chaos
chaos: k8s-binaries e2e-agent
	@mkdir -p $(E2E_OUT)
	@rm -f $(E2E_OUT)/chaos.txt
	@cd $(E2E_ROOT) && \
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) EBPF_PROXY_BIN=$(E2E_AGENT) EBPF_PROXY_E2E_OUT=$(E2E_OUT) \
	EBPF_PROXY_REQUIRE_PRIVILEGED=1 EBPF_PROXY_CHAOS=long \
	$(GO) test -count=1 -v -timeout 40m -run '^TestChaos$$' ./test/e2e/chaos/ > $(E2E_OUT)/chaos.log 2>&1; \
	status=$$?; \
	grep -v '^[[:space:]]*{"level"' $(E2E_OUT)/chaos.log | grep -E -v '^[[:space:]]+[IWE][0-9]{4} ' | grep -v '^chaos: scenario='; \
	echo "full log: $(E2E_OUT)/chaos.log"; \
	if [ -s $(E2E_OUT)/chaos.txt ]; then cat $(E2E_OUT)/chaos.txt; \
	else echo "chaos: did not complete"; status=1; fi; \
	exit $$status

# Scale benchmarks (not part of make test): 10,000 Services of 10 endpoints
# through the API, then for ebpf-proxy and upstream kube-proxy (iptables via
# iptables-legacy, nftables): time until all are programmed, peak RSS, p50
# and p99 latency of one endpoint change. Smaller runs:
#   EBPF_PROXY_BENCH_SERVICES=1000 EBPF_PROXY_BENCH_CHANGES=20 \
#   EBPF_PROXY_BENCH_PROXIES=ebpf,iptables make -f test/e2e/e2e.mk e2e-bench
# EBPF_PROXY_BENCH_HEAP_PROFILE=/tmp/heap.pprof saves ebpf-proxy's heap profile
# once all are programmed (go tool pprof bin/ebpf-proxy /tmp/heap.pprof).
.PHONY: e2e-bench
e2e-bench: k8s-binaries e2e-agent
	cd $(E2E_ROOT) && \
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) EBPF_PROXY_BIN=$(E2E_AGENT) EBPF_PROXY_REQUIRE_PRIVILEGED=1 \
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 180m ./test/e2e/bench/

# Requests per second from an external client through a NodePort on one node
# to a pod on another (DNAT and SNAT on the first node), for upstream
# kube-proxy's iptables mode (the baseline), ebpf-proxy at TC and its
# iptables fallback, each on a fresh two-node testbed in one run: new
# connections per request and persistent connections, printed as a table and
# as ratios against the baseline. Not part of make test. Settings:
#   EBPF_PROXY_BENCH_RPS_DURATION=5s  measured time per phase
#   EBPF_PROXY_BENCH_RPS_WORKERS=8    concurrent connections
#   EBPF_PROXY_BENCH_RPS_ROUNDS=1     rounds, interleaved; medians reported
#   EBPF_PROXY_BENCH_RPS_PROXIES=iptables,ebpf,ebpf-iptables
#     (also known: iptables-nft, nftables, ebpf-xdp-generic; see rpsRows in test/e2e/bench)
.PHONY: e2e-bench-rps
e2e-bench-rps: k8s-binaries e2e-agent
	cd $(E2E_ROOT) && \
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) EBPF_PROXY_BIN=$(E2E_AGENT) EBPF_PROXY_REQUIRE_PRIVILEGED=1 \
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkNodePortRPS$$' -benchtime 1x -timeout 30m ./test/e2e/bench/ \
	| grep -v '^[[:space:]]*{"level"' | grep -E -v '^[[:space:]]+[IWE][0-9]{4} '; exit $${PIPESTATUS[0]}

# Packets per second through the same NodePort path, without a NIC: 64-byte
# UDP frames of one flow made in the external client's namespace by
# BPF_PROG_TEST_RUN in live-frames mode (an XDP program returning XDP_TX),
# counted as the pod on node-b receives them, for upstream kube-proxy's
# iptables mode (the baseline) and nftables mode, ebpf-proxy at TC (XDP
# off) and with XDP native on the veth, each on a fresh two-node testbed, in
# interleaved rounds; printed as a table, as ratios against the baseline and
# as issue 16's `bench:` lines. Not part of make test. Settings:
#   EBPF_PROXY_BENCH_PPS_FRAMES=2000000  frames per row and round
#   EBPF_PROXY_BENCH_PPS_LIMIT=30s       time limit of each row's sending
#   EBPF_PROXY_BENCH_PPS_ROUNDS=3        rounds, interleaved; medians reported
#   EBPF_PROXY_BENCH_PPS_PROXIES=iptables,nftables,tc,xdp
#     (also known: iptables-nft, xdp-generic; see ppsRows in test/e2e/bench)
.PHONY: bench-pps
bench-pps: k8s-binaries e2e-agent
	cd $(E2E_ROOT) && \
	EBPF_PROXY_CACHE=$(EBPF_PROXY_CACHE) EBPF_PROXY_BIN=$(E2E_AGENT) EBPF_PROXY_REQUIRE_PRIVILEGED=1 \
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkNodePortPPS$$' -benchtime 1x -timeout 30m ./test/e2e/bench/ \
	| grep -v '^[[:space:]]*{"level"' | grep -E -v '^[[:space:]]+[IWE][0-9]{4} '; exit $${PIPESTATUS[0]}
