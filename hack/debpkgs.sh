#!/bin/sh
# Installs, once, the Debian packages named by package:file pairs, where the
# file proves the package's tool is usable; the test runners' deps.sh call
# it (test/vmtest, test/cluster). Idempotent: when every file is present it
# only checks and exits.
#
#   debpkgs.sh [--no-services] LABEL PACKAGE:FILE...
#
# LABEL starts its messages ("vmtest deps"). --no-services keeps the
# packages from starting services on this machine while they install: a
# policy-rc.d that refuses every start is in place unless one exists.
set -eu

no_services=""
if [ "${1-}" = --no-services ]; then
	no_services=1
	shift
fi
label=$1
shift

missing=""
for pair; do
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
	echo "$label: missing packages:$missing; run this script as root or install them" >&2
	exit 1
fi

echo "$label: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
if [ -n "$no_services" ]; then
	policy=/usr/sbin/policy-rc.d
	own_policy=""
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' > "$policy"
		chmod 755 "$policy"
		own_policy=1
	fi
	trap '[ -z "$own_policy" ] || rm -f "$policy"' EXIT
fi
# The package lists may be absent or stale on a fresh machine: update once and
# retry when the first attempt cannot find the packages.
# shellcheck disable=SC2086
if ! apt-get install -y -q --no-install-recommends $missing >/dev/null; then
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
