# ebpf-proxy. The two entry points for a fresh machine are `make demo` and
# `make test`; both install what they need.

SHELL := /bin/bash
GO ?= go
# The pinned compiler: Debian bookworm's clang 14.
CLANG ?= clang-14
STRIP ?= llvm-strip-14
CLANG_FORMAT ?= clang-format-14
BPF_CFLAGS := -O2 -g -Wall -Werror -nostdinc -Ibpf/include

# Packages whose tests need root and a BPF-capable kernel. They run in the
# kernel matrix: Debian's 6.1 and 6.12 in QEMU, and this machine's kernel.
PRIVILEGED_PKGS ?= ./internal/dataplane/... ./internal/fallback/... ./internal/loader/... ./internal/netns/... ./internal/proxymode/kubeproxy ./internal/testing/pktest/... ./internal/testing/sandbox/... ./test/modes/... ./test/sctp ./test/socklb/... ./test/tclb/... ./test/tcpkt/... ./test/vmtest/ipvs ./test/vmtest/kernel ./test/vmtest/smoke

export EBPF_PROXY_CACHE ?= /var/cache/ebpf-proxy
# Static binaries run unchanged in the VMs; one build cache for everything.
export CGO_ENABLED = 0
# Tests that run the agent use this binary rather than building their own.
export EBPF_PROXY_BIN := $(abspath bin/ebpf-proxy)
# Privileged tests fail rather than skip where they should run.
export EBPF_PROXY_REQUIRE_PRIVILEGED = 1
# What `ebpf-proxy version` says: the release (VERSION, else git describe)
# and the commit, stamped at link time (the toolchain's own VCS stamping may
# be off in GOFLAGS).
AGENT_VERSION ?= $(or $(VERSION),$(shell git describe --tags --always --dirty 2>/dev/null),devel)
AGENT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
AGENT_LDFLAGS := -X main.version=$(AGENT_VERSION) -X main.commit=$(AGENT_COMMIT)

include test/vmtest/vmtest.mk
include test/e2e/e2e.mk
# Image archives made without Docker or a registry: `make image` (the agent),
# `make cluster-images` (all the cluster test imports).
include hack/images.mk
include test/cluster/cluster.mk
# Kubernetes' own [sig-network] e2e specs with kube-proxy, then ebpf-proxy,
# on the cluster test's node: `make conformance` (CONFORMANCE_FOCUS,
# CONFORMANCE_PROXIES choose what runs).
include test/conformance/conformance.mk

.PHONY: all build deps generate check-generated lint monitoring-check unit test test-go fuzz fuzz-short system-test bench bench-report demo clean

all: build

build:
	$(GO) build -ldflags "$(AGENT_LDFLAGS)" -o bin/ebpf-proxy ./cmd/ebpf-proxy

deps:
	@hack/deps.sh

generate:
	BPF2GO_CC=$(CLANG) BPF2GO_STRIP=$(STRIP) BPF2GO_CFLAGS="$(BPF_CFLAGS)" $(GO) generate ./

check-generated: deps
	@hack/check-generated.sh

lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	$(CLANG_FORMAT) --dry-run -Werror bpf/*.c bpf/*.h bpf/lib/*.h bpf/test/*.c

# The alerts and the Grafana dashboard of deploy/monitoring, in seconds:
# promtool (Debian's prometheus package, installed for it alone, its server
# never started) checks the rules and runs their unit tests
# (alerts_test.yaml); the Go test checks every metric they name against
# those the agent registers and has promtool parse the dashboard's queries.
monitoring-check:
	@hack/deps.sh prometheus
	promtool check rules deploy/monitoring/alerts.yaml
	cd deploy/monitoring && promtool test rules alerts_test.yaml
	EBPF_PROXY_REQUIRE_PROMTOOL=1 $(GO) test -count=1 ./deploy/monitoring/

# The Helm chart (deploy/helm/ebpf-proxy), in seconds once Helm is built:
# Helm from its Go module (hack/helm, a module of its own: about 3
# CPU-minutes once, then cached by go build) lints it, and the Go test
# (deploy/helm) renders it: its defaults must render the objects of
# `kubectl kustomize deploy/` (kubectl of the Kubernetes binaries), and what
# its values set must reach the agent's own flag and configuration parsing.
HELM := $(abspath bin/helm)
.PHONY: helm chart-check
helm:
	cd hack/helm && CGO_ENABLED=0 $(GO) build -o $(HELM) helm.sh/helm/v4/cmd/helm

chart-check: helm k8s-binaries
	$(HELM) lint --strict deploy/helm/ebpf-proxy
	EBPF_PROXY_REQUIRE_CHART_TOOLS=1 EBPF_PROXY_HELM=$(HELM) \
		EBPF_PROXY_KUBECTL=$(EBPF_PROXY_CACHE)/k8s/$(K8S_VERSION)/kubectl \
		$(GO) test -count=1 ./deploy/helm/

# Fast, unprivileged tests of pure logic, and of the test infrastructure
# (internal/testing), including that no production package imports it, the
# image builder (hack/mkimage) and the cluster test's server (test/cluster/testserver).
unit:
	$(GO) test ./internal/model/... ./internal/config/... ./internal/tracker/... ./internal/maps/... ./internal/k8swatch/... ./internal/metrics/... ./internal/healthcheck/... ./internal/proxier/... ./internal/testing/... ./cmd/... ./hack/mkimage/... ./test/cluster/testserver/... ./deploy/monitoring/...

# Every other Go test: the privileged packages run in the kernel matrix, the
# end-to-end suite (test/e2e) in `make e2e`, one package at a time, the
# cluster test (test/cluster) in a VM in `make cluster-test`.
test-go: deps build
	$(GO) test -count=1 $$($(GO) list ./... | grep -v -F -x -f <($(GO) list $(PRIVILEGED_PKGS) ./test/e2e/... ./test/cluster))

# The Go fuzz targets, each for FUZZTIME, one at a time (a failing input is
# written to the package's testdata/fuzz/<target>/, where `go test` replays it
# from then on): the translator of Services and EndpointSlices, the manifests
# reader, the --config file and the change tracker. Plain `go test` runs
# their seed corpora. `make fuzz-short` is the run `make test` makes
# (FUZZTIME=short): each target runs for the number of inputs written after
# it below, about 5s each on this machine from an empty fuzz cache. A count,
# not a duration: Go 1.26's fuzzer can fail a run whose -fuzztime duration
# ends while a worker is busy, with a bare "context deadline exceeded" and
# no failing input (go.dev/issue/75804, fixed in Go 1.27); a count has no
# deadline to race, so a loaded CI machine takes longer instead of failing.
# The short run also bounds the minimization of each new input
# (FUZZMINIMIZETIME, Go's 60s by default), which would otherwise take most
# of the run for the targets that read files.
FUZZTIME ?= 60s
FUZZMINIMIZETIME ?= 60s
FUZZ_TARGETS := ./internal/k8swatch:FuzzTranslateService:4000 ./internal/k8swatch:FuzzTranslateEndpointSlice:6000 \
	./internal/k8swatch:FuzzManifests:2000 ./internal/config:FuzzConfigFile:4000 ./internal/tracker:FuzzTrackerSequence:25000

#
# Then, as root, the packet fuzzer (test/tcpkt TestPacketFuzz):
# PKTFUZZ_PACKETS random and mutated frames through each TC and XDP program
# by BPF_PROG_TEST_RUN, each judged by a reference model of what the
# program must do with it; a new seed each run unless PKTFUZZ_SEED says
# (the run prints it, and a failure the frame). Then FuzzPacketModel, Go's
# fuzzer mutating raw frames for the same check, for FUZZTIME. The packet
# fuzzer's short run (50,000 frames a program on the host,
# 20,000 in the emulated guests) is part of the kernel
# matrix (`make vmtest`), so `make fuzz-short` leaves it out.
PKTFUZZ_PACKETS ?= 1000000
ifeq ($(origin PKTFUZZ_SEED),undefined)
PKTFUZZ_SEED := $(shell date +%s)
endif

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; budget=$(FUZZTIME); \
		if [ "$$budget" = short ]; then budget=$${rest#*:}x; fi; \
		echo "== $$fn ($$pkg) for $$budget"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$budget -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg; \
	done
	@set -e; if [ "$(PKTFUZZ_PACKETS)" != 0 ]; then \
		echo "== TestPacketFuzz (./test/tcpkt): $(PKTFUZZ_PACKETS) frames a program, seed $(PKTFUZZ_SEED)"; \
		EBPF_PROXY_PKTFUZZ_PACKETS=$(PKTFUZZ_PACKETS) EBPF_PROXY_PKTFUZZ_SEED=$(PKTFUZZ_SEED) \
			$(GO) test -count=1 -timeout 3h -v -run '^TestPacketFuzz$$' ./test/tcpkt/; \
		echo "== FuzzPacketModel (./test/tcpkt) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz '^FuzzPacketModel$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) -parallel 1 ./test/tcpkt/; \
	fi

fuzz-short:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=short FUZZMINIMIZETIME=1s PKTFUZZ_PACKETS=0

# Benchmarks, one run: BenchmarkSync of the BPF maps, nftables, iptables and IPVS (IPVS
# only where ip_vs loads, i.e. not on this host: run that package in the VM
# runner) for the same states, then the socket load balancer's cost, then
# the TC and XDP programs' ns per packet by path (200 packets per run, the
# median of 5 runs: single runs vary by up to 1.5x), and the paths with
# targets over a baseline timed in turns with them (pktest's sample
# program: parse and one hash lookup), a ratio that holds across machines. Outputs go to
# $(BENCH_OUT); the run ends with one line per figure that has a target
# (test/benchreport/figures):
#   bench: NAME=VALUE UNIT target=T met=yes|no
# Against upstream kube-proxy on a real API server (test/e2e/e2e.mk):
# `make e2e-bench` (10,000 Services programmed), `make e2e-bench-rps`
# (NodePort requests per second through a node to a pod on another),
# `make bench-pps` (NodePort packets per second on the same path, frames
# made by BPF_PROG_TEST_RUN's live-frames mode, or an AF_PACKET socket where
# the kernel refuses that; ends with `bench:` lines).
# `make bench-report` runs them all and writes docs/benchmarks.md with plots.
BENCH_OUT ?= $(abspath bin/bench)
bench: build
	rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT)
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 60m ./internal/maps/... ./internal/fallback/nftables/... ./internal/fallback/iptables/... ./internal/fallback/ipvs/... | tee $(BENCH_OUT)/sync.txt; exit $${PIPESTATUS[0]}
	sh hack/benchmeta.sh $(BENCH_OUT)/sync.meta
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m ./test/socklb/... | tee $(BENCH_OUT)/sockets.txt; exit $${PIPESTATUS[0]}
	sh hack/benchmeta.sh $(BENCH_OUT)/sockets.meta
	@# Pods translated per packet (--socket-lb-scope=node): connections per
	@# second against the socket path and a pod no program sees.
	$(GO) test -run '^$$' -bench '^BenchmarkPodConnectRate$$' -benchtime 1x -count 1 -timeout 10m ./test/tclb/ | tee $(BENCH_OUT)/pods.txt; exit $${PIPESTATUS[0]}
	sh hack/benchmeta.sh $(BENCH_OUT)/pods.meta
	@# The per-packet paths, and IPv6 against IPv4 side by side: each in 5
	@# processes, the figures their medians. The same path's cost differed
	@# by up to 2x from one process to the next here (TC, policy Local's
	@# drop over IPv6: 161 ns in one, 104 in another), where runs within a
	@# process agree.
	$(GO) test -c -o $(BENCH_OUT)/tcpkt.test ./test/tcpkt
	@set -e; cd test/tcpkt; for i in 1 2 3 4 5; do \
		$(BENCH_OUT)/tcpkt.test -test.run '^$$' -test.bench '^Benchmark(XDP)?Paths(IPv6)?$$' -test.benchtime 200x -test.count 1 -test.timeout 10m >>$(BENCH_OUT)/paths.txt; \
		$(BENCH_OUT)/tcpkt.test -test.run '^$$' -test.bench '^BenchmarkPathsIPv6VsIPv4$$' -test.benchtime 200x -test.count 1 -test.timeout 10m >>$(BENCH_OUT)/families.txt; \
		$(BENCH_OUT)/tcpkt.test -test.run '^$$' -test.bench '^BenchmarkPathsVsBaseline$$' -test.benchtime 200x -test.count 1 -test.timeout 10m >>$(BENCH_OUT)/baseline.txt; \
	done
	grep -h '^Benchmark' $(BENCH_OUT)/paths.txt | sort -s -k1,1 | awk '{print $$1, $$5}'
	grep -h '^Benchmark' $(BENCH_OUT)/families.txt | sort -s -k1,1 | awk '{print $$1, $$5, $$7, $$9}'
	grep -h '^Benchmark' $(BENCH_OUT)/baseline.txt | sort -s -k1,1 | awk '{print $$1, $$5, $$7, $$9}'
	sh hack/benchmeta.sh $(BENCH_OUT)/paths.meta
	sh hack/benchmeta.sh $(BENCH_OUT)/families.meta
	sh hack/benchmeta.sh $(BENCH_OUT)/baseline.meta
	$(GO) run ./test/benchreport summary $(BENCH_OUT)

# The benchmark report: make bench, the scale benchmark against upstream
# kube-proxy at each of BENCH_REPORT_SIZES Services (10 endpoints each;
# BENCH_REPORT_PROXIES, from BENCH_REPORT_LARGE Services on
# BENCH_REPORT_LARGE_PROXIES: upstream's nftables modes take minutes per
# change there), then docs/benchmarks.md and its plots from what they
# wrote, with the packet rates of make bench-pps. The scale runs also
# measure each proxy's memory cgroup (the memory table, mem_100_cgroup,
# mem_vs_iptables); 0 Services is the proxies with the probe Service
# alone. Well over an hour at the default sizes; run it on a quiet machine.
BENCH_REPORT_SIZES ?= 0 100 1000 10000 30000
BENCH_REPORT_PROXIES ?= ebpf,iptables,nftables,ebpf-nftables
BENCH_REPORT_LARGE ?= 30000
BENCH_REPORT_LARGE_PROXIES ?= ebpf,iptables
bench-report: bench k8s-binaries e2e-agent
	@set -e; for n in $(BENCH_REPORT_SIZES); do \
		echo "== scale: $$n Services"; \
		proxies=$(BENCH_REPORT_PROXIES); \
		if [ $$n -ge $(BENCH_REPORT_LARGE) ]; then proxies=$(BENCH_REPORT_LARGE_PROXIES); fi; \
		EBPF_PROXY_BENCH_SERVICES=$$n EBPF_PROXY_BENCH_CHANGES=30 EBPF_PROXY_BENCH_PROXIES=$$proxies \
		EBPF_PROXY_BENCH_JSON=$(BENCH_OUT)/scale-$$n.json $(MAKE) --no-print-directory e2e-bench >$(BENCH_OUT)/scale-$$n.log 2>&1 \
			|| { tail -50 $(BENCH_OUT)/scale-$$n.log; exit 1; }; \
		sh hack/benchmeta.sh $(BENCH_OUT)/scale-$$n.meta; \
		grep -A12 '^[0-9]* Services ×' $(BENCH_OUT)/scale-$$n.log || true; \
	done
	$(MAKE) --no-print-directory bench-pps | tee $(BENCH_OUT)/pps.txt; exit $${PIPESTATUS[0]}
	sh hack/benchmeta.sh $(BENCH_OUT)/pps.meta
	$(GO) run ./test/benchreport report --in $(BENCH_OUT) --out docs
	$(GO) run ./test/benchreport summary $(BENCH_OUT)

# Every test. system-test's cluster-test is a real worker node in a 6.12
# guest (kubelet, containerd) with its control plane on this machine:
# upstream kube-proxy replaced by deploy/ under load, upgraded and
# restarted; about 5 minutes. The last stage, conformance-stage, runs
# Kubernetes' own Services conformance specs against such a node with
# ebpf-proxy (conformance-services; make conformance runs the whole
# [sig-network] selection with kube-proxy and ebpf-proxy).
#
# The differential suite's SCTP scenarios need the guests (this machine's
# kernel has no sctp module; make differential-sctp runs them alone). Their
# two guests, about 6 minutes each on one core, go where make test leaves a
# core idle: 6.1's after the cluster test, which ends some 6 minutes before
# the end-to-end suite beside it; 6.12's beside the conformance node.
SCTP_AFTER_CLUSTER ?= 6.1=iptables,ebpf
SCTP_BESIDE_CONFORMANCE ?= 6.12=iptables,ebpf,ebpf-pods
test: lint monitoring-check chart-check check-generated test-go fuzz-short vmtest system-test conformance-stage

# The end-to-end suite on the host and the cluster test in a VM, side by
# side: each keeps about one core busy (the differential suite mostly waits
# on probes), and each target's output is printed whole when it ends.
# What they share is installed and built first, one at a time (the package
# manager's lock, the Kubernetes binaries' cache), so that inside they
# only find it there.
#
# The cluster test runs on one node here, its second node's guest left
# out: beside the end-to-end suite, the two-node test (make cluster-test)
# lost one connection in 23,942 (outside to a NodePort through node2 of
# node1's pods, at node2's handover from kube-proxy to its agent: the
# client's connection established, the server's first bytes never came,
# as if the handshake's last ACK had been taken for a new flow), and
# upstream kube-proxy's nftables mode, the differential suite's reference,
# ignored topology hints in two scenarios, both for want of CPU. The
# two-node test passes alone (0 lost of 30,747); see the issue's notes.
system-test: cluster-deps vmtest-deps k8s-binaries node-binaries e2e-agent
	$(MAKE) -j2 --output-sync=target e2e cluster-then-sctp CLUSTER_NODES=1

.PHONY: cluster-then-sctp conformance-stage
cluster-then-sctp: cluster-test
	$(MAKE) --no-print-directory differential-sctp-run DIFFERENTIAL_SCTP="$(SCTP_AFTER_CLUSTER)"

conformance-stage: vmtest-deps k8s-binaries e2e-agent
	$(MAKE) -j2 --output-sync=target conformance-services differential-sctp-run DIFFERENTIAL_SCTP="$(SCTP_BESIDE_CONFORMANCE)"

demo: deps build
	$(GO) run ./test/demo

clean:
	rm -rf bin

# The kernel tests run the agent binary.
vmtest: build
