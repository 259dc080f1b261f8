# Kubernetes' own end-to-end specs of [sig-network] against a real node,
# with upstream kube-proxy and then with ebpf-proxy. Included by the
# top-level Makefile:
#
#	make conformance
#	make conformance CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]' CONFORMANCE_PROXIES=ebpf-proxy
#	make conformance-multinode        (the specs that want a second node)
#
# The nodes are the cluster test's (test/cluster.mk): two of them, each
# containerd and the kubelet in a Debian 6.12 guest of the VM runner
# (test/cluster/worker), the control plane on this machine in a network
# namespace of its own, whose bridge holds the guests' network cards and
# routes between their pods. The suite (e2e.test cut down to sig-network,
# test/e2e/tools/network) runs in that namespace, once per proxy: kube-proxy
# as kubeadm 1.37 installs it (test/cluster/testdata/kubeadm-kube-proxy.yaml,
# made by kubeadm's own code: make kubeadm-proxy-config), then
# deploy/ with the agent's image and kube-proxy's DaemonSet deleted (the
# agent's pods labelled k8s-app=kube-proxy, the label by which the suite
# finds the proxy to restart in "should work after restarting
# kube-proxy"). CoreDNS serves the cluster's DNS. Which specs run and
# which are left out, and why: skips.txt. A spec kube-proxy passed that
# skipped itself with ebpf-proxy because it asks for kube-proxy's iptables
# mode (it reads /proxyMode: the localhost NodePorts metric's) runs again
# last, with the agent in --proxy-mode=iptables. The output ends with the
# failed specs, the specs that kube-proxy passed and that skipped
# themselves with ebpf-proxy, with why and how they fared in the mode they
# ask for, and one line per run of the selection:
#
#	conformance: proxy=kube-proxy ran=N passed=P failed=F skipped=S
#	conformance: proxy=ebpf-proxy ran=N passed=P failed=F skipped=S
#
# ran counts the specs that ran to a verdict, skipped those the suite
# skipped at run time (most want a second node). It fails when ebpf-proxy
# fails a spec that kube-proxy passed (a spec both fail is an environment
# limit, named so), in its default mode or in the mode the spec asks for,
# or when a run could not be made. Reports and logs stay
# in $(CONFORMANCE_OUT).

CONFORMANCE_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
CONFORMANCE_OUT ?= $(abspath bin/conformance)
# The specs: every [sig-network] spec of Services (their endpoints'
# latency, Service CIDRs, traffic distribution and topology hints
# included), Endpoints and EndpointSlices (and their controllers and
# mirroring), Networking (the Granular Checks of pods and Services among
# them), Conntrack and KubeProxy, Conformance or not; skips.txt leaves out
# what one node cannot run. The whole selection with ebpf-proxy only:
#   make conformance CONFORMANCE_PROXIES=ebpf-proxy
# The 15 Services conformance specs alone (about 10 minutes a proxy):
#   make conformance CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]'
CONFORMANCE_FOCUS ?= \[sig-network\] (Services|Service endpoints latency|Service CIDRs|ServiceCIDR and IPAddress API|Traffic Distribution|Topology Hints|Endpoints|EndpointsController|EndpointSlice|EndpointSliceMirroring|Networking|Conntrack|KubeProxy)
CONFORMANCE_SKIP_FILE ?= $(CONFORMANCE_DIR)/skips.txt
# One more expression to leave out, besides the file's.
CONFORMANCE_SKIP ?=
# The proxies, in order: kube-proxy as the reference, then ebpf-proxy.
CONFORMANCE_PROXIES ?= kube-proxy,ebpf-proxy
# One vCPU: two under TCG panic now and then (../shared notes, vmtest.md).
# The VM's deadline bounds the whole run, both suites included; one suite
# may take CONFORMANCE_E2E_TIMEOUT. A spec that starts pods takes 30 s to
# 4.5 minutes on the emulated node (pods start in 30 to 90 s, each kubectl
# exec takes 5 to 40 s), the slow end with another VM on the other core.
CONFORMANCE_VM_FLAGS ?= --kernel 6.12 --cpus 1 --memory 6144 --accel tcg --timeout 6h
CONFORMANCE_E2E_TIMEOUT ?= 150m
# The nodes, each a guest (test/cluster/worker) on its own vCPU.
CONFORMANCE_NODES ?= 2
# The specs that skip themselves on one node (they want a second node):
# make conformance-multinode runs them alone, on two nodes.
CONFORMANCE_MULTINODE_FOCUS := \[sig-network\] (Conntrack|KubeProxy should set TCP CLOSE_WAIT timeout|Networking Granular Checks: Services|Networking Granular Checks: Pods should function for intra-pod communication: sctp|Networking should check kube-proxy urls|Service CIDRs should create Services and serve on different Service CIDRs|Services should (be able to connect to terminating and unready endpoints|fail health check node port if there are only terminating endpoints|fallback to|not be able to connect to terminating and unready endpoints|preserve source pod IP|respect internalTrafficPolicy|support externalTrafficPolicy=Local for type=NodePort|implement NodePort and HealthCheckNodePort correctly))
# Flags added to the agent's command line, e.g. --socket-lb-scope=node to
# run the selection with pods translated per packet.
CONFORMANCE_AGENT_ARGS ?=
# Further flags for e2e.test, e.g. --ginkgo.seed=N to run the specs in the
# order of an earlier run (its report.json's SuiteConfig.RandomSeed).
CONFORMANCE_E2E_ARGS ?=

CONFORMANCE_IMAGES := $(abspath bin/images-conformance)
CONFORMANCE_BIN := $(EBPF_PROXY_CACHE)/k8s-conformance/$(K8S_VERSION)
COREDNS_VERSION := $(shell awk '$$1 == "github.com/coredns/coredns" && $$2 ~ /^v/ { print $$2; exit }' $(CONFORMANCE_DIR)/coredns/go.mod)
COREDNS_IMAGE := registry.k8s.io/coredns/coredns:$(COREDNS_VERSION)
# The test images under the names k8s.io/kubernetes/test/utils/image's
# manifest.go gives them at $(K8S_VERSION): agnhost; nginx, which the
# EndpointSlice specs only need running (agnhost's pause serves); busybox,
# whose sh, sleep and nc the Conntrack specs run (the same tools are in
# agnhost's image: the specs' nc flags are netcat-openbsd's); and
# distroless-iptables, where "KubeProxy should set TCP CLOSE_WAIT timeout"
# runs sleep and conntrack -L on the node.
AGNHOST_TAGS := registry.k8s.io/e2e-test-images/agnhost:2.66.1 registry.k8s.io/e2e-test-images/agnhost:2.55 \
	registry.k8s.io/e2e-test-images/nginx:1.27.0-2 registry.k8s.io/e2e-test-images/nginx:1.28.0-2 \
	registry.k8s.io/e2e-test-images/busybox:1.37.0-2 registry.k8s.io/build-image/distroless-iptables:v0.9.9
# The server of the Conntrack spec of invalid packets, on its own (its
# entrypoint is the image's).
REGRESSION_TAG := registry.k8s.io/e2e-test-images/regression-issue-74839:1.5
# What the specs run in agnhost's containers besides agnhost: sh -c, nc,
# curl, wget, and sometimes ss, ip and dig (the upstream image is busybox),
# and conntrack.
AGNHOST_PACKAGES := curl wget netcat-openbsd iproute2 dnsutils procps conntrack
AGNHOST_REQUIRES := /agnhost /bin/sh /usr/bin/curl /usr/bin/wget /bin/nc /usr/bin/dig /usr/bin/ss /usr/bin/ps /usr/sbin/ip \
	/usr/sbin/conntrack /usr/bin/sleep /usr/bin/seq
# The pause image of the suite (manifest.go) and of kubeadm at 1.37;
# containerd's sandbox image stays node.PauseImage, the same archive.
CONFORMANCE_PAUSE_IMAGE := registry.k8s.io/pause:3.10.2

# What the node imports: the pause image and the proxies' images of
# make cluster-images, and the archives made here.
CONFORMANCE_GUEST_IMAGES = $(abspath $(IMAGES_DIR))/pause.tar \
	$(if $(findstring kube-proxy,$(CONFORMANCE_PROXIES)),$(abspath $(IMAGES_DIR))/kube-proxy-$(K8S_VERSION).tar) \
	$(if $(findstring ebpf-proxy,$(CONFORMANCE_PROXIES)),$(abspath $(IMAGES_DIR))/ebpf-proxy-$(IMAGE_TAG).tar) \
	$(CONFORMANCE_IMAGES)/agnhost.tar $(CONFORMANCE_IMAGES)/coredns.tar $(CONFORMANCE_IMAGES)/regression.tar

.PHONY: conformance conformance-binaries conformance-images

# The suite, agnhost and CoreDNS, into the cache (built once per version).
conformance-binaries:
	$(CONFORMANCE_DIR)/build.sh

# agnhost on a Debian root filesystem with the tools the specs run in its
# containers, and CoreDNS alone; mkimage leaves archives whose inputs did
# not change alone.
conformance-images: image-tools conformance-binaries
	@hack/deps.sh debootstrap
	@mkdir -p $(CONFORMANCE_IMAGES)
	hack/rootfs.sh $(AGNHOST_PACKAGES) > $(CONFORMANCE_IMAGES)/rootfs.path
	$(MKIMAGE) -o $(CONFORMANCE_IMAGES)/agnhost.tar $(addprefix -t ,$(AGNHOST_TAGS)) \
		--base $$(cat $(CONFORMANCE_IMAGES)/rootfs.path) \
		--file $(CONFORMANCE_BIN)/agnhost:/agnhost:0755 \
		--entrypoint /agnhost --cmd pause $(call mkimage_labels,$(K8S_VERSION)) \
		$(addprefix --require ,$(AGNHOST_REQUIRES))
	$(MKIMAGE) -o $(CONFORMANCE_IMAGES)/regression.tar -t $(REGRESSION_TAG) \
		--file $(CONFORMANCE_BIN)/regression-issue-74839:/regression-issue-74839:0755 \
		--entrypoint /regression-issue-74839 $(call mkimage_labels,$(K8S_VERSION)) --require /regression-issue-74839
	$(MKIMAGE) -o $(CONFORMANCE_IMAGES)/coredns.tar -t $(COREDNS_IMAGE) \
		--file $(EBPF_PROXY_CACHE)/coredns/$(COREDNS_VERSION)/coredns:/coredns:0755 \
		--entrypoint /coredns $(call mkimage_labels,$(COREDNS_VERSION)) --require /coredns

conformance: cluster-deps vmtest-deps k8s-binaries node-binaries cluster-images conformance-images
	rm -rf $(CONFORMANCE_OUT) && mkdir -p $(CONFORMANCE_OUT)/logs
	$(GO) build -o $(CONFORMANCE_OUT)/conformance ./$(CONFORMANCE_DIR)
	$(GO) build -o $(CONFORMANCE_OUT)/controlplane ./test/cluster/controlplane
	$(GO) build -o $(CONFORMANCE_OUT)/worker ./test/cluster/worker
	$(GO) build -o $(CONFORMANCE_OUT)/vmtest ./test/vmtest
	$(CONFORMANCE_OUT)/controlplane --dir $(CONFORMANCE_OUT)/controlplane.d --logs $(CONFORMANCE_OUT)/logs \
		--nodes $(CONFORMANCE_NODES) --controllers '*,-nodeipam' -- \
	$(CONFORMANCE_OUT)/conformance run --out $(CONFORMANCE_OUT) \
		--vmtest $(CONFORMANCE_OUT)/vmtest --worker $(CONFORMANCE_OUT)/worker --nodes $(CONFORMANCE_NODES) \
		--vm-args "$(CONFORMANCE_VM_FLAGS) --modules $(CLUSTER_MODULES),sctp" \
		$(addprefix --image ,$(CONFORMANCE_GUEST_IMAGES)) \
		--alias $(CONFORMANCE_PAUSE_IMAGE)=$(PAUSE_IMAGE) \
		--e2e $(CONFORMANCE_BIN)/e2e-network.test \
		--kubectl $(EBPF_PROXY_CACHE)/k8s/$(K8S_VERSION)/kubectl \
		--proxies $(CONFORMANCE_PROXIES) \
		--kube-proxy-manifest $(abspath test/cluster/testdata/kubeadm-kube-proxy.yaml) --kube-proxy-image $(KUBE_PROXY_IMAGE) \
		--deploy $(abspath deploy) --agent-image ebpf-proxy:$(IMAGE_TAG) --agent-args '$(CONFORMANCE_AGENT_ARGS)' \
		--coredns-image $(COREDNS_IMAGE) \
		--focus '$(CONFORMANCE_FOCUS)' --skip-file $(CONFORMANCE_SKIP_FILE) --skip '$(CONFORMANCE_SKIP)' \
		--e2e-timeout $(CONFORMANCE_E2E_TIMEOUT) $(addprefix --e2e-arg ,$(CONFORMANCE_E2E_ARGS))

# The specs that want a second node, with both proxies on two nodes.
.PHONY: conformance-multinode
conformance-multinode:
	$(MAKE) --no-print-directory conformance CONFORMANCE_NODES=2 CONFORMANCE_FOCUS='$(CONFORMANCE_MULTINODE_FOCUS)'

# What make test runs: the Services conformance specs, with ebpf-proxy alone
# on one node (about 4 minutes to a ready node, then 10 for the 15 specs on
# a quiet machine), bounded well inside CI's time.
.PHONY: conformance-services
conformance-services:
	$(MAKE) --no-print-directory conformance CONFORMANCE_PROXIES=ebpf-proxy CONFORMANCE_NODES=1 \
		CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]' \
		CONFORMANCE_VM_FLAGS='--kernel 6.12 --cpus 1 --memory 6144 --accel tcg --timeout 40m' CONFORMANCE_E2E_TIMEOUT=30m
