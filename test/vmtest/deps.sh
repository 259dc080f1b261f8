#!/bin/sh
# Installs the Debian packages the VM test runner needs, once: QEMU, a static
# busybox for the initramfs, and the tools that unpack Debian's kernels.
# Idempotent: when everything is present it only checks and exits.
set -eu

# package:file pairs; the file proves the package's tool is usable.
exec sh "$(dirname "$0")/../../hack/debpkgs.sh" "vmtest deps" \
	qemu-system-x86:/usr/bin/qemu-system-x86_64 \
	qemu-system-data:/usr/share/qemu/qboot.rom \
	busybox-static:/bin/busybox \
	cpio:/usr/bin/cpio \
	zstd:/usr/bin/zstd \
	xz-utils:/usr/bin/xz \
	kmod:/usr/bin/kmod
