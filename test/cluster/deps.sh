#!/bin/sh
# Installs, once, the Debian packages the cluster test's guest runs from the
# host's root filesystem (the VM sees it read-only over 9p): containerd,
# runc, the CNI plugins, iptables and ipset. Nothing of it runs on the host:
# a policy-rc.d keeps the packages from starting containerd here while they
# install. Idempotent: when everything is present it only checks and exits.
set -eu

exec sh "$(dirname "$0")/../../hack/debpkgs.sh" --no-services "cluster deps" \
	containerd:/usr/bin/containerd \
	runc:/usr/sbin/runc \
	containernetworking-plugins:/usr/lib/cni/bridge \
	iptables:/usr/sbin/iptables-nft-save \
	ipset:/usr/sbin/ipset
