#!/bin/sh
# Installs the Debian packages that building, testing and the demo need,
# when they are missing. Idempotent; runs as root (as CI does).
set -eu

PKGS="clang-14 llvm-14 clang-format-14 iproute2 iptables nftables kmod"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
