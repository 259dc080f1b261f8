# Make fragment for container image archives, made on this machine without a
# container engine or a registry; the top-level Makefile includes it.
#
#   make image            the agent: $(IMAGES_DIR)/ebpf-proxy-$(IMAGE_TAG).tar
#   make cluster-images   everything the cluster test (test/cluster) imports
#                         into containerd, and $(IMAGES_DIR)/images.json
#                         naming each archive's image
#
# Each archive is a docker-archive (`docker save`'s form): `ctr -n k8s.io
# images import FILE`, `docker load -i FILE`. The agent and upstream
# kube-proxy run on one Debian root filesystem (hack/rootfs.sh, made by
# debootstrap once and cached under $(EBPF_PROXY_CACHE)/images); the test
# server and the pause image hold one static binary. hack/mkimage leaves an
# archive whose inputs did not change alone, so a second run takes seconds.

IMAGES_DIR ?= bin/images
# The agent's tag: $(VERSION) if given, else what git says of the tree.
IMAGE_TAG ?= $(or $(VERSION),$(shell git describe --always --dirty 2>/dev/null),dev)
# The agent's second reference for upgrade tests: the cluster test names the
# agent's image so in its guest (no second archive), and a rollout from one
# reference to the other replaces the pods.
IMAGE_TAG_NEXT ?= $(IMAGE_TAG)-next
TESTSERVER_TAG ?= $(IMAGE_TAG)
# The sandbox image the cluster test's containerd is configured with.
PAUSE_IMAGE ?= registry.k8s.io/pause:3.10
# Upstream kube-proxy, of the version the end-to-end tests pin
# (K8S_VERSION, from test/e2e/e2e.mk).
KUBE_PROXY_IMAGE ?= registry.k8s.io/kube-proxy:$(K8S_VERSION)
# Image creation time and the mtime of the files added: the commit's, so
# that the same commit gives the same images.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_REVISION = $(shell git rev-parse HEAD 2>/dev/null)

# The agent the cluster test's upgrade starts from: an earlier commit's,
# built from that commit's tree (git archive), so that the upgrade meets
# the maps an agent of that version pinned: 6c22c13 is the last of the
# preallocated maps of fixed sizes. Empty: the upgrade goes to the same
# binary under another reference.
CLUSTER_UPGRADE_FROM ?= 6c22c13
UPGRADE_FROM_TAG = $(if $(CLUSTER_UPGRADE_FROM),base-$(CLUSTER_UPGRADE_FROM))

CLUSTER_IMAGE_FILES = ebpf-proxy-$(IMAGE_TAG).tar \
	kube-proxy-$(K8S_VERSION).tar testserver-$(TESTSERVER_TAG).tar pause.tar \
	$(if $(UPGRADE_FROM_TAG),ebpf-proxy-$(UPGRADE_FROM_TAG).tar)

IMAGE_BUILD := $(IMAGES_DIR)/.build
MKIMAGE := $(IMAGE_BUILD)/mkimage
AGENT_REQUIRES := /ebpf-proxy /usr/sbin/iptables /usr/sbin/ip6tables \
	/usr/sbin/iptables-legacy-restore /usr/sbin/iptables-legacy-save \
	/usr/sbin/iptables-nft-restore /usr/sbin/iptables-nft-save \
	/usr/sbin/ip6tables-legacy-restore /usr/sbin/ip6tables-nft-restore \
	/usr/sbin/ipset /usr/sbin/nft /usr/sbin/modprobe
KUBE_PROXY_REQUIRES := /usr/local/bin/kube-proxy /usr/sbin/iptables /usr/sbin/ip6tables \
	/usr/sbin/iptables-restore /usr/sbin/iptables-save /usr/sbin/ip6tables-restore \
	/usr/sbin/ip6tables-save /usr/sbin/ipset /usr/sbin/nft /usr/sbin/modprobe

# mkimage's flags for an image of version $(1); ours_labels also names the
# commit, for the images made of this repository's code.
mkimage_labels = --created $(SOURCE_DATE_EPOCH) --label org.opencontainers.image.version=$(1)
ours_labels = $(call mkimage_labels,$(1)) --label org.opencontainers.image.revision=$(IMAGE_REVISION)

.PHONY: image cluster-images image-tools image-rootfs upgrade-from-image

# The builder and the binaries the images hold (go build is incremental).
image-tools:
	@mkdir -p $(IMAGE_BUILD)
	CGO_ENABLED=0 $(GO) build -o $(MKIMAGE) ./hack/mkimage
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(AGENT_LDFLAGS)" -o $(IMAGE_BUILD)/ebpf-proxy ./cmd/ebpf-proxy
	CGO_ENABLED=0 $(GO) build -trimpath -o $(IMAGE_BUILD)/testserver ./test/cluster/testserver

# The Debian root filesystem: debootstrap once (a minute or two), then the
# cached tarball. Its path goes to a file for the recipes below.
image-rootfs:
	@hack/deps.sh debootstrap
	@mkdir -p $(IMAGE_BUILD)
	@hack/rootfs.sh > $(IMAGE_BUILD)/rootfs.path

# agent_image writes the agent's archive with tag $(1).
define agent_image
	$(MKIMAGE) -o $(IMAGES_DIR)/ebpf-proxy-$(1).tar -t ebpf-proxy:$(1) \
		--base $$(cat $(IMAGE_BUILD)/rootfs.path) \
		--file $(IMAGE_BUILD)/ebpf-proxy:/ebpf-proxy:0755 \
		--entrypoint /ebpf-proxy $(call ours_labels,$(1)) \
		$(addprefix --require ,$(AGENT_REQUIRES))
endef

image: image-tools image-rootfs
	$(call agent_image,$(IMAGE_TAG))

# The agent of $(CLUSTER_UPGRADE_FROM), tagged $(UPGRADE_FROM_TAG). A clone
# without that commit fails here, naming it.
upgrade-from-image: image-tools image-rootfs
ifneq ($(CLUSTER_UPGRADE_FROM),)
	@git cat-file -e $(CLUSTER_UPGRADE_FROM)^{commit} || { echo "CLUSTER_UPGRADE_FROM=$(CLUSTER_UPGRADE_FROM): no such commit in this clone (fetch its history, or set CLUSTER_UPGRADE_FROM= for an upgrade to the same binary)" >&2; exit 1; }
	rm -rf $(IMAGE_BUILD)/upgrade-from && mkdir -p $(IMAGE_BUILD)/upgrade-from
	git archive $(CLUSTER_UPGRADE_FROM) | tar -x -C $(IMAGE_BUILD)/upgrade-from
	cd $(IMAGE_BUILD)/upgrade-from && CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags "-X main.version=$(UPGRADE_FROM_TAG) -X main.commit=$$(git -C $(CURDIR) rev-parse $(CLUSTER_UPGRADE_FROM))" \
		-o $(abspath $(IMAGE_BUILD))/ebpf-proxy-$(UPGRADE_FROM_TAG) ./cmd/ebpf-proxy
	$(MKIMAGE) -o $(IMAGES_DIR)/ebpf-proxy-$(UPGRADE_FROM_TAG).tar -t ebpf-proxy:$(UPGRADE_FROM_TAG) \
		--base $$(cat $(IMAGE_BUILD)/rootfs.path) \
		--file $(IMAGE_BUILD)/ebpf-proxy-$(UPGRADE_FROM_TAG):/ebpf-proxy:0755 \
		--entrypoint /ebpf-proxy $(call mkimage_labels,$(UPGRADE_FROM_TAG)) \
		$(addprefix --require ,$(AGENT_REQUIRES))
	rm -rf $(IMAGE_BUILD)/upgrade-from
endif

# kube-proxy at the path kubeadm's DaemonSet runs it from.
cluster-images: image upgrade-from-image k8s-binaries
	$(MKIMAGE) -o $(IMAGES_DIR)/kube-proxy-$(K8S_VERSION).tar -t $(KUBE_PROXY_IMAGE) \
		--base $$(cat $(IMAGE_BUILD)/rootfs.path) \
		--file $(EBPF_PROXY_CACHE)/k8s/$(K8S_VERSION)/kube-proxy:/usr/local/bin/kube-proxy:0755 \
		--entrypoint /usr/local/bin/kube-proxy $(call mkimage_labels,$(K8S_VERSION)) \
		$(addprefix --require ,$(KUBE_PROXY_REQUIRES))
	$(MKIMAGE) -o $(IMAGES_DIR)/testserver-$(TESTSERVER_TAG).tar -t ebpf-proxy-testserver:$(TESTSERVER_TAG) \
		--file $(IMAGE_BUILD)/testserver:/testserver:0755 \
		--entrypoint /testserver $(call ours_labels,$(TESTSERVER_TAG)) --require /testserver
	$(MKIMAGE) -o $(IMAGES_DIR)/pause.tar -t $(PAUSE_IMAGE) \
		--file $(IMAGE_BUILD)/testserver:/testserver:0755 \
		--entrypoint /testserver --entrypoint pause $(call ours_labels,$(TESTSERVER_TAG)) --require /testserver
	@printf '{\n  "agent": {"image": "%s", "file": "%s"},\n  "kube_proxy": {"image": "%s", "file": "%s"},\n  "testserver": {"image": "%s", "file": "%s"},\n  "pause": {"image": "%s", "file": "%s"}\n}\n' \
		ebpf-proxy:$(IMAGE_TAG) ebpf-proxy-$(IMAGE_TAG).tar \
		$(KUBE_PROXY_IMAGE) kube-proxy-$(K8S_VERSION).tar \
		ebpf-proxy-testserver:$(TESTSERVER_TAG) testserver-$(TESTSERVER_TAG).tar \
		$(PAUSE_IMAGE) pause.tar > $(IMAGES_DIR)/images.json
	@# Archives of earlier tags go, so that the directory holds one set.
	@for f in $(IMAGES_DIR)/*.tar; do \
		case " $(CLUSTER_IMAGE_FILES) " in *" $${f##*/} "*) ;; *) echo "removing $$f (an earlier tag)"; rm -f "$$f" "$$f.key" ;; esac; \
	done
	@ls -l $(IMAGES_DIR)/*.tar
