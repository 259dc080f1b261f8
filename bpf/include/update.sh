#!/bin/sh
# Refreshes the vendored BPF headers in this directory from pinned Debian
# packages: libbpf's helper headers and the kernel's UAPI headers that
# linux/bpf.h needs. Run it by hand after changing a pin; the result is
# committed so that building the BPF objects needs only clang.
set -eu

LIBBPF_DEV=libbpf-dev=1:1.1.2-0+deb12u1
LINUX_LIBC_DEV=linux-libc-dev=6.1.192-2

HEADERS="
bpf/bpf_helpers.h
bpf/bpf_helper_defs.h
bpf/bpf_endian.h
linux/bpf.h
linux/bpf_common.h
linux/types.h
linux/posix_types.h
linux/stddef.h
asm-generic/types.h
asm-generic/int-ll64.h
asm-generic/bitsperlong.h
asm-generic/posix_types.h
linux/if_ether.h
linux/ip.h
linux/in.h
linux/tcp.h
linux/udp.h
linux/pkt_cls.h
linux/pkt_sched.h
linux/const.h
linux/socket.h
linux/libc-compat.h
linux/byteorder/little_endian.h
linux/swab.h
"
# linux/icmp.h is left out on purpose: it includes linux/if.h, which needs
# the C library's sys/socket.h. bpf/lib/parse.h declares the ICMP header.
# Architecture-specific headers, taken from the amd64 multiarch directory.
ASM_HEADERS="
asm/types.h
asm/bitsperlong.h
asm/posix_types.h
asm/posix_types_64.h
asm/byteorder.h
asm/swab.h
"

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download "$LIBBPF_DEV" "$LINUX_LIBC_DEV"
for deb in ./*.deb; do dpkg -x "$deb" root; done
for h in $HEADERS; do
	mkdir -p "$here/$(dirname "$h")"
	cp "root/usr/include/$h" "$here/$h"
done
for h in $ASM_HEADERS; do
	mkdir -p "$here/$(dirname "$h")"
	cp "root/usr/include/x86_64-linux-gnu/$h" "$here/$h"
done
echo "vendored headers refreshed from $LIBBPF_DEV $LINUX_LIBC_DEV"
