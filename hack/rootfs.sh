#!/usr/bin/env bash
# Makes the Debian root filesystem that the agent's and upstream kube-proxy's
# images are built on (hack/mkimage), as a tarball in a cache, and prints the
# tarball's path on stdout; everything else goes to stderr.
#
#   hack/rootfs.sh [PACKAGE...]      default: iptables ipset nftables kmod
#
# The filesystem is `debootstrap --variant=minbase` of $ROOTFS_SUITE
# (bookworm) from $DEBIAN_MIRROR plus the packages, the same layout as the
# final stage of deploy/Dockerfile (debian:bookworm-slim with the same
# packages): what the fallback modes and upstream kube-proxy run (iptables,
# ip6tables and their -restore/-save, legacy and nft; ipset; nft for our
# and kube-proxy's nftables modes; modprobe). It takes a minute or more, so the
# tarball is kept as
#
#   $EBPF_PROXY_CACHE/images/rootfs-<suite>-<key>.tar
#
# where the key is a hash of the suite, the mirror, the sorted package list
# and this script: a tarball that exists is used as it is. The tarball is made
# to change as little as possible between builds (names sorted, owners
# numeric, every mtime the same) and holds no package lists, documentation,
# manual pages, logs or device nodes.
#
# Needs root (debootstrap does), debootstrap (`make image` installs it) and
# the network; it fails, saying which, when one is missing.
set -euo pipefail

suite=${ROOTFS_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${EBPF_PROXY_CACHE:-/var/cache/ebpf-proxy}/images
if (($#)); then
	packages=$(printf '%s\n' "$@" | sort -u | paste -sd, -)
else
	packages=ipset,iptables,kmod,nftables
fi

log() { echo "rootfs.sh: $*" >&2; }
die() { log "$*"; exit 1; }

key=$( { echo "$suite $mirror $packages"; cat "$0"; } | sha256sum | cut -c1-16)
out=$cache/rootfs-$suite-$key.tar
if [[ -f $out ]]; then
	log "$out is up to date ($packages)"
	echo "$out"
	exit 0
fi

[[ $(id -u) == 0 ]] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap; make image does)"

mkdir -p "$cache"
# Two builds at once would both spend minutes on the same tarball.
exec 9>"$cache/.rootfs.lock"
flock 9
if [[ -f $out ]]; then
	log "$out was made while waiting for the lock"
	echo "$out"
	exit 0
fi

work=$(mktemp -d "$cache/rootfs-$suite-$key.tmp.XXXXXX")
target=$work/root
cleanup() {
	# debootstrap mounts /proc and /sys in the target; an interrupted run
	# leaves them there, and they must go before the directory does.
	local m
	for m in $(awk -v d="$work/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
		umount -l "$m" || true
	done
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$SECONDS
log "debootstrap --variant=minbase --include=$packages $suite from $mirror (about a minute)"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$target" "$mirror" >"$work/debootstrap.log" 2>&1; then
	tail -n 20 "$work/debootstrap.log" >&2
	[[ -f $target/debootstrap/debootstrap.log ]] && tail -n 20 "$target/debootstrap/debootstrap.log" >&2
	die "debootstrap of $suite from $mirror failed (is the mirror reachable?); log above"
fi
log "debootstrap done in $((SECONDS - start))s"

# Only what a container needs: no package lists (apt-get update fetches
# them), no caches, logs, documentation or locales other than the C one.
# Copyright files stay, as in debian:bookworm-slim.
find "$target/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$target/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$target"/usr/share/{man,info,lintian,linda}/* "$target"/usr/share/locale/*
rm -rf "$target"/var/lib/apt/lists/* "$target"/var/cache/apt/* "$target"/var/cache/debconf/*-old \
	"$target"/var/lib/dpkg/*-old "$target"/var/cache/ldconfig/aux-cache
find "$target/var/log" -type f -delete
rm -rf "$target"/tmp/* "$target"/var/tmp/* "$target"/dev/* "$target"/proc/* "$target"/sys/* "$target"/run/*
# The container runtime provides these, per container.
: >"$target/etc/hostname"
: >"$target/etc/resolv.conf"
rm -f "$target/etc/machine-id"

# The version of each package, for the image's label and for a reader.
chroot "$target" dpkg-query -W -f '${Package} ${Version}\n' | sort >"$work/packages.txt"
log "$(wc -l <"$work/packages.txt") packages, $(du -sh "$target" | cut -f1)"

tar --create --file "$work/rootfs.tar" --directory "$target" \
	--sort=name --numeric-owner --mtime=@0 --xattrs --xattrs-include='security.capability' \
	--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
	.
mv "$work/packages.txt" "${out%.tar}.packages"
mv "$work/rootfs.tar" "$out"
log "$out: $(du -h "$out" | cut -f1) in $((SECONDS - start))s"
echo "$out"
