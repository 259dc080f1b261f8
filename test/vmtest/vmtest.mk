# Kernel matrix: the privileged test packages on Debian's 6.1 and 6.12
# kernels in QEMU (one VM per kernel, the kernels in parallel; VMTEST_ONLY
# gives some packages to one of them) and every one on the host's kernel.
# Included by the top-level Makefile; also usable alone:
#
#	make -f test/vmtest/vmtest.mk vmtest
#
# Variables:
#	PRIVILEGED_PKGS   packages to run (go list patterns)
#	VMTEST_KERNELS    kernel series or exact releases
#	VMTEST_ONLY       PATTERN=KERNEL[,KERNEL] rules: packages that run in
#	                  the VMs of some of the kernels only (empty: all on all)
#	VMTEST_RUN        PATTERN=REGEXP rules: in the VMs, only the tests of
#	                  those packages that go test -run REGEXP selects (quote
#	                  each rule for the shell)
#	VMTEST_FLAGS      extra flags for `vmtest matrix` (--host=false,
#	                  --job-timeout=, --timeout=, --accel=, --cpus=, --memory=,
#	                  --out=, --build-flags=, --modules=, -v)
#	EBPF_PROXY_CACHE  cache root; kernels live in $(EBPF_PROXY_CACHE)/vmtest
#
# VMTEST_RUNNER runs one command or test binary in a VM; go test -exec starts
# it in the package's directory, hence the absolute path:
#
#	go test -exec "$(VMTEST_RUNNER) --kernel 6.12 --" ./internal/loader

VMTEST_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

GO ?= go
PRIVILEGED_PKGS ?= ./test/vmtest/ipvs ./test/vmtest/kernel ./test/vmtest/smoke
VMTEST_KERNELS ?= 6.1 6.12
VMTEST_FLAGS ?=
# Every package runs on the host's kernel (6.18). The BPF packages run in
# both guests: the verifier, the helpers and the attach points (clsact on
# 6.1, tcx from 6.6) differ between kernels. The guests are CPU-bound and
# run the same work 5 to 50 times as slowly as the host (an agent start
# with its iptables-restore and nft runs takes about 10 s there), so what
# does not depend on the kernel's version runs on the host alone (rule
# kernel "host"): the iptables fallback, kube-proxy's leftovers and the
# xtables runner, whose netfilter has not changed between these kernels,
# and the sandbox's own tests: every package of the guests builds its
# namespaces, veths and cgroups with it, on each kernel.
# The nftables fallback runs on the host alone too: what it uses of
# nf_tables (sets, maps, verdict maps, numgen) is the same in 6.12 and 6.18,
# and kube-proxy's nftables mode needs 5.13, which 6.1 has.
# IPVS, absent on the host, runs in the 6.12 guest; SCTP, absent on the
# host too, in both guests (the host skips it, saying why). The mode switches run
# on 6.1, whose clsact attachments a non-BPF mode must remove, and there
# only those with IPVS (every switch to and from it, ebpf among them), the
# XDP fallback to TC and the cleanup of the ebpf and ipvs modes
# (VMTEST_RUN): the switches between ebpf, iptables and nftables, the
# dual-stack modes and the auto mode's choices do not depend on the
# kernel's version and run on the host, where they took 924 s of the 6.1
# guest's 2,360. The two guests then take about as long as each other.
VMTEST_ONLY ?= ./internal/fallback/ipvs=6.12 ./internal/fallback/nftables=host \
	./internal/fallback/iptables=host ./internal/proxymode/kubeproxy=host \
	./internal/fallback/xtables=host ./internal/testing/sandbox=host ./test/modes/...=6.1
VMTEST_RUN ?= './test/modes=IPVS|TestXDPRefusedByADeviceFallsBackToTC|TestCleanupRemovesWhatEveryModeCreated/^(ebpf|ipvs)$$'
EBPF_PROXY_CACHE ?= /var/cache/ebpf-proxy
export EBPF_PROXY_CACHE
VMTEST_RUNNER = $(GO) run $(abspath $(VMTEST_DIR))

.PHONY: vmtest vmtest-deps vmtest-kernels vmtest-selftest

# Debian packages the runner needs (QEMU, busybox-static, cpio, zstd, xz, kmod).
vmtest-deps:
	sh $(VMTEST_DIR)/deps.sh

# Fetch and prepare the kernels only; a second run downloads nothing.
vmtest-kernels: vmtest-deps
	$(GO) run ./$(VMTEST_DIR) fetch $(VMTEST_KERNELS)

# The matrix; exits non-zero if any package fails on any kernel.
vmtest: vmtest-deps
	$(GO) run ./$(VMTEST_DIR) matrix --kernels "$(VMTEST_KERNELS)" $(addprefix --only ,$(VMTEST_ONLY)) $(addprefix --run ,$(VMTEST_RUN)) $(VMTEST_FLAGS) -- $(PRIVILEGED_PKGS)

# The runner's own end-to-end tests: it reports exit codes, panics, boot
# failures and timeouts as such (boots several VMs).
vmtest-selftest: vmtest-deps
	$(GO) test -tags vmtest_e2e -count=1 -v ./$(VMTEST_DIR)/vm/

# What each BPF program costs the verifier and the kernel (test/bpfstats):
# its instructions, those the verifier processed, its translated and JITed
# sizes, on this machine's kernel and on each of VMTEST_KERNELS. For
# changes to bpf/: compare the tables before and after.
.PHONY: bpf-stats
bpf-stats: vmtest-deps
	$(GO) build -o $(abspath bin/bpfstats) ./test/bpfstats
	@echo "== host: $$(uname -r)"; $(abspath bin/bpfstats)
	@for k in $(VMTEST_KERNELS); do echo "== $$k"; $(VMTEST_RUNNER) --kernel $$k --cpus 1 -- $(abspath bin/bpfstats) || exit 1; done
