#!/bin/sh
# Installs the Debian packages that building, testing and the demo need,
# when they are missing, or with arguments only those packages (`make image`
# installs debootstrap so). Idempotent; runs as root (as CI does).
set -eu

PKGS="clang-14 llvm-14 clang-format-14 iproute2 iptables nftables kmod"
if [ $# -gt 0 ]; then
	PKGS="$*"
fi
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	fail() { echo "deps.sh: cannot install$missing: $1 (is the Debian mirror reachable?)" >&2; exit 1; }
	apt-get update -qq || fail "apt-get update failed"
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null || fail "apt-get install failed"
fi
