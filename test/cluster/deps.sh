#!/bin/sh
# Installs, once, the Debian packages the cluster test's guest runs from the
# host's root filesystem (the VM sees it read-only over 9p): containerd,
# runc, the CNI plugins, iptables and ipset. Nothing of it runs on the host:
# a policy-rc.d keeps the packages from starting containerd here while they
# install. Idempotent: when everything is present it only checks and exits.
set -eu

wanted="
containerd:/usr/bin/containerd
runc:/usr/sbin/runc
containernetworking-plugins:/usr/lib/cni/bridge
iptables:/usr/sbin/iptables-nft-save
ipset:/usr/sbin/ipset
"

missing=""
for pair in $wanted; do
	pkg=${pair%%:*}
	file=${pair#*:}
	if [ ! -e "$file" ]; then
		missing="$missing $pkg"
	fi
done
if [ -z "$missing" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "cluster deps: missing packages:$missing; run this script as root or install them" >&2
	exit 1
fi

echo "cluster deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
own_policy=""
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' > "$policy"
	chmod 755 "$policy"
	own_policy=1
fi
trap '[ -z "$own_policy" ] || rm -f "$policy"' EXIT
# shellcheck disable=SC2086
if ! apt-get install -y -q --no-install-recommends $missing >/dev/null; then
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
