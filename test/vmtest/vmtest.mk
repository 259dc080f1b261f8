# Kernel matrix: every privileged test package on Debian's 6.1 and 6.12
# kernels in QEMU (one VM per kernel, the kernels in parallel) and on the
# host's kernel. Included by the top-level Makefile; also usable alone:
#
#	make -f test/vmtest/vmtest.mk vmtest
#
# Variables:
#	PRIVILEGED_PKGS   packages to run (go list patterns)
#	VMTEST_KERNELS    kernel series or exact releases
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
PRIVILEGED_PKGS ?= ./test/vmtest/...
VMTEST_KERNELS ?= 6.1 6.12
VMTEST_FLAGS ?=
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
	$(GO) run ./$(VMTEST_DIR) matrix --kernels "$(VMTEST_KERNELS)" $(VMTEST_FLAGS) -- $(PRIVILEGED_PKGS)

# The runner's own end-to-end tests: it reports exit codes, panics, boot
# failures and timeouts as such (boots several VMs).
vmtest-selftest: vmtest-deps
	$(GO) test -tags vmtest_e2e -count=1 -v ./$(VMTEST_DIR)/vm/
