/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Ones' complement checksum arithmetic done by hand, for what the kernel's
 * checksum helpers cannot do: headers built from nothing (the ICMP
 * unreachable, the TCP reset), checksums inside a quoted packet, and XDP
 * buffers, which have no skb checksum state. */
#ifndef EBPF_PROXY_CSUM_H
#define EBPF_PROXY_CSUM_H

#include "common.h"

/* pkt_csum_fold makes a checksum field of the 64-bit sum bpf_csum_diff
 * returns. */
static __always_inline __u16 pkt_csum_fold(__s64 sum)
{
	__u64 s = (__u64)sum;

	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* pkt_csum_replace updates a ones' complement checksum for a field
 * changing from `from` to `to` (RFC 1624, eqn. 3): for checksums inside a
 * quoted packet, which the kernel helpers' checksum state must not touch,
 * and for XDP buffers. */
static __always_inline __u16 pkt_csum_replace(__u16 check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~check;

	sum += (~from & 0xffff) + (~from >> 16);
	sum += (to & 0xffff) + (to >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* pkt_csum_add updates a ones' complement checksum for data whose sum
 * changed by diff, what bpf_csum_diff returns for the change (RFC 1624,
 * eqn. 3, for several fields at once). */
static __always_inline __u16 pkt_csum_add(__u16 check, __s64 diff)
{
	return pkt_csum_fold((__u16)~check + (__u64)(__u32)diff);
}

/* pkt_csum_replace_n is pkt_csum_replace for n consecutive 32-bit words
 * (an IPv6 address: n is 4), summed before one fold: 2^16 is 1 in ones'
 * complement arithmetic, so a 32-bit word counts as its two halves. */
static __always_inline __u16 pkt_csum_replace_n(__u16 check, const __be32 *from, const __be32 *to,
						int n)
{
	__u64 sum = (__u16)~check;
	int i;

#pragma unroll
	for (i = 0; i < n; i++)
		sum += (__u64)(__u32)~from[i] + to[i];
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* pkt_csum_diff_n is the ones' complement sum of the change from n 32-bit
 * words to n others, what bpf_csum_diff returns, without a helper call: a
 * __wsum for the checksum helpers' by-difference mode (size 0). */
static __always_inline __u32 pkt_csum_diff_n(const __be32 *from, const __be32 *to, int n)
{
	__u64 sum = 0;
	int i;

#pragma unroll
	for (i = 0; i < n; i++)
		sum += (__u64)(__u32)~from[i] + to[i];
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return (__u32)sum;
}

/* pkt_csum_diff16 is pkt_csum_diff_n for one 16-bit field at an even
 * offset (a port, an IPv6 header's next header and hop limit). */
static __always_inline __u32 pkt_csum_diff16(__be16 from, __be16 to)
{
	return (__u32)(__u16)~from + to;
}

/* pkt4_ttl_word is the 16-bit word of the IP header that a TTL change
 * alters: the IP checksum sums the TTL together with the protocol. */
static __always_inline __be16 pkt4_ttl_word(__u16 ttl, __u8 proto)
{
	return bpf_htons((ttl << 8) | proto);
}

#endif /* EBPF_PROXY_CSUM_H */
