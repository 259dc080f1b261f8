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
	# Debian's prometheus package is installed for its promtool alone
	# (make monitoring-check): its server must not start. The maintainer
	# scripts start services through invoke-rc.d or deb-systemd-invoke,
	# which ask /usr/sbin/policy-rc.d; where there is none, one that
	# refuses prometheus (and nothing else) is in place for the install.
	policy=""
	case " $missing " in
	*" prometheus "*)
		if [ ! -e /usr/sbin/policy-rc.d ]; then
			policy=/usr/sbin/policy-rc.d
			trap 'rm -f "$policy"' EXIT
			cat >"$policy" <<-'EOF'
				#!/bin/sh
				# Written by ebpf-proxy's hack/deps.sh while it installs prometheus.
				for a; do
					case "$a" in
					--*) ;;
					prometheus | prometheus.service) exit 101 ;;
					*) exit 0 ;;
					esac
				done
				exit 0
			EOF
			chmod 755 "$policy"
		fi
		;;
	esac
	apt-get update -qq || fail "apt-get update failed"
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null || fail "apt-get install failed"
	case " $missing " in
	*" prometheus "*)
		# Nor start at the next boot.
		if command -v deb-systemd-helper >/dev/null; then
			deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
		fi
		if command -v update-rc.d >/dev/null; then
			update-rc.d prometheus disable >/dev/null 2>&1 || true
		fi
		;;
	esac
	if [ -n "$policy" ]; then
		rm -f "$policy"
		trap - EXIT
	fi
fi
