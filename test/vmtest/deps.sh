#!/bin/sh
# Installs the Debian packages the VM test runner needs, once: QEMU, a static
# busybox for the initramfs, and the tools that unpack Debian's kernels.
# Idempotent: when everything is present it only checks and exits.
set -eu

# package:file pairs; the file proves the package's tool is usable.
wanted="
qemu-system-x86:/usr/bin/qemu-system-x86_64
qemu-system-data:/usr/share/qemu/qboot.rom
busybox-static:/bin/busybox
cpio:/usr/bin/cpio
zstd:/usr/bin/zstd
xz-utils:/usr/bin/xz
kmod:/usr/bin/kmod
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
	echo "vmtest deps: missing packages:$missing; run this script as root or install them" >&2
	exit 1
fi

echo "vmtest deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
# The package lists may be absent or stale on a fresh machine: update once and
# retry when the first attempt cannot find the packages.
# shellcheck disable=SC2086
if ! apt-get install -y -q --no-install-recommends $missing >/dev/null; then
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
