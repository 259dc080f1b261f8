# The cluster test: two real worker nodes (containerd, the kubelet, the
# pods), each in a Debian 6.12 guest of the VM runner, where upstream
# kube-proxy is replaced by deploy/ node by node under load, then upgraded,
# taken over by the Helm chart (deploy/helm) and restarted. Included by the
# top-level Makefile:
#
#	make cluster-test
#	make cluster-test CLUSTER_NODES=1     (the first node alone)
#
# The control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) runs on this machine, as a control-plane node does, in a
# network namespace of its own (test/cluster/controlplane) with a bridge
# of the guests' network cards, through which it routes pod traffic
# between the nodes. The kubelet writes global sysctls: it and everything
# of a node run in a guest, whose are its own. The test binary runs in the
# first node's guest and brings that node up; the second node's guest runs
# test/cluster/worker; a client outside the cluster (testserver outside)
# runs in the control plane's namespace, at the test's request. The guests
# read the binaries, the image archives, the kubeconfig and the test
# binary through their read-only view of this machine's root, and write
# logs to $(CLUSTER_OUT)/logs (the second node's in logs/node2), where the
# control plane's are too.

CLUSTER_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
CLUSTER_OUT ?= $(abspath bin/cluster)
CLUSTER_NODES ?= 2
# The client outside the cluster, on the control plane's address.
CLUSTER_OUTSIDE := 192.168.50.1:7070
# One vCPU: two under TCG panic now and then (../shared notes, vmtest.md).
CLUSTER_VM_FLAGS ?= --kernel 6.12 --cpus 1 --memory 4096 --accel tcg --timeout 46m
# What the node loads besides what modprobe pulls in on demand.
CLUSTER_MODULES := virtio_net,veth,bridge,br_netfilter,overlay,sch_ingress,cls_bpf,nf_conntrack,nf_nat,nf_tables,nft_compat,nft_chain_nat,nft_ct,nft_masq,nft_nat,nft_reject_inet,ip_tables,iptable_filter,iptable_nat,iptable_mangle,xt_conntrack,xt_comment,xt_mark,xt_MASQUERADE,xt_addrtype,xt_multiport,xt_statistic,xt_nat,ipt_REJECT,ip_set,xt_set

# The agent's images, first (the migration from kube-proxy) and upgrade:
# the agent of $(CLUSTER_UPGRADE_FROM) (hack/images.mk) upgraded to this
# tree's; without one, this tree's under a second reference (an alias,
# which costs no second import).
CLUSTER_AGENT_IMAGES = $(if $(UPGRADE_FROM_TAG),ebpf-proxy:$(UPGRADE_FROM_TAG) ebpf-proxy:$(IMAGE_TAG),ebpf-proxy:$(IMAGE_TAG) ebpf-proxy:$(IMAGE_TAG_NEXT))
CLUSTER_AGENT_ALIASES = $(if $(UPGRADE_FROM_TAG),,ebpf-proxy:$(IMAGE_TAG_NEXT)=ebpf-proxy:$(IMAGE_TAG))

.PHONY: cluster-deps cluster-test

# containerd, runc and the CNI plugins for the guest (never started here).
cluster-deps:
	sh $(CLUSTER_DIR)/deps.sh

# The test binary runs in the guest as root; the guest reads the archives of
# `make cluster-images` and the binaries of `make k8s-binaries node-binaries`
# through its view of this machine. Its last line is the summary:
#   cluster: ready=2 checks=N passed=N migration_failed=F upgrade_failed=U restart_failed=R
# (ready= counts the nodes that were ready, 0 for a failed run).
cluster-test: cluster-deps vmtest-deps k8s-binaries node-binaries cluster-images helm
	rm -rf $(CLUSTER_OUT) && mkdir -p $(CLUSTER_OUT)/logs
	$(GO) test -c -o $(CLUSTER_OUT)/cluster.test ./$(CLUSTER_DIR)
	$(GO) build -o $(CLUSTER_OUT)/controlplane ./$(CLUSTER_DIR)/controlplane
	$(GO) build -o $(CLUSTER_OUT)/worker ./$(CLUSTER_DIR)/worker
	$(GO) build -o $(CLUSTER_OUT)/testserver ./$(CLUSTER_DIR)/testserver
	$(GO) build -o $(CLUSTER_OUT)/vmtest ./test/vmtest
	EBPF_PROXY_CLUSTER_IMAGES=$(abspath $(IMAGES_DIR)) \
	EBPF_PROXY_CLUSTER_LOGS=$(CLUSTER_OUT)/logs \
	EBPF_PROXY_CLUSTER_DEPLOY=$(abspath deploy) \
	EBPF_PROXY_CLUSTER_HELM=$(HELM) \
	EBPF_PROXY_CLUSTER_AGENT_IMAGES="$(CLUSTER_AGENT_IMAGES)" \
	EBPF_PROXY_CLUSTER_AGENT_ALIASES="$(CLUSTER_AGENT_ALIASES)" \
	EBPF_PROXY_CLUSTER_TEST_IMAGE=ebpf-proxy-testserver:$(TESTSERVER_TAG) \
	EBPF_PROXY_CLUSTER_NODES=$(CLUSTER_NODES) \
	EBPF_PROXY_CLUSTER_WORKERS=$(CLUSTER_OUT) \
	EBPF_PROXY_CLUSTER_OUTSIDE=http://$(CLUSTER_OUTSIDE) \
	$(CLUSTER_OUT)/controlplane --dir $(CLUSTER_OUT)/controlplane.d --logs $(CLUSTER_OUT)/logs --nodes $(CLUSTER_NODES) \
		--beside "outside: $(CLUSTER_OUT)/testserver outside --listen $(CLUSTER_OUTSIDE)" \
		$(foreach i,$(wordlist 2,$(CLUSTER_NODES),1 2 3 4 5 6 7 8),--beside "node$(i): $(CLUSTER_OUT)/vmtest $(CLUSTER_VM_FLAGS) \
			--tap node$(i)-tap --modules $(CLUSTER_MODULES) --rw $(CLUSTER_OUT) -- $(CLUSTER_OUT)/worker --index $(i) \
			--logs $(CLUSTER_OUT)/logs/node$(i) --state $(CLUSTER_OUT)/node$(i).state --stop $(CLUSTER_OUT)/node$(i).stop \
			$(foreach f,$(CLUSTER_IMAGE_FILES),--image $(abspath $(IMAGES_DIR))/$(f)) \
			$(addprefix --alias ,$(CLUSTER_AGENT_ALIASES))") \
		-- \
	$(CLUSTER_OUT)/vmtest $(CLUSTER_VM_FLAGS) --tap node1-tap --modules "$(CLUSTER_MODULES)" --rw $(CLUSTER_OUT) -- \
		$(CLUSTER_OUT)/cluster.test -test.v -test.timeout 44m
