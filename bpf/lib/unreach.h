/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The ICMP port unreachable that a frontend without endpoints answers with,
 * as kube-proxy's REJECT does, built from the packet it refuses. */
#ifndef EBPF_PROXY_UNREACH_H
#define EBPF_PROXY_UNREACH_H

#include "common.h"
#include "csum.h"
#include "parse.h"
#include "reply.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>

/* The headers put in front of the refused packet, which becomes the quote. */
struct pkt_icmp_reply {
	struct iphdr ip;
	struct pkt_icmphdr icmp;
};

/* An ICMP error quotes as much of the packet as fits in 576 bytes (RFC 1812
 * 4.3.2.3), as the kernel's icmp_send does. */
#define ICMP_QUOTE_MAX (576 - sizeof(struct pkt_icmp_reply))
#define CSUM_CHUNK     64

/* The headers put in front of a refused IPv6 packet. */
struct pkt_icmp6_reply {
	struct pkt_ipv6hdr ip;
	struct pkt_icmphdr icmp;
};

#define ICMPV6_PORT_UNREACH 4
/* An ICMPv6 error quotes as much of the packet as fits in the minimum IPv6
 * MTU (RFC 4443 2.4 (c)), as the kernel's icmp6_send does. */
#define ICMP6_QUOTE_MAX (1280 - sizeof(struct pkt_icmp6_reply))
#define ICMP6_HOP_LIMIT 64

/* pkt_csum_quote adds to sum, a checksum so far, that of the first qlen
 * bytes of the IP packet, the quote, read chunks of CSUM_CHUNK bytes at a
 * time (at most chunks of them). Returns the sum, or a negative number
 * when a helper failed. */
static __always_inline __s64 pkt_csum_quote(struct __sk_buff *skb, __u64 qlen, const int chunks,
					    __s64 sum)
{
	__u8 buf[CSUM_CHUNK];
	__u64 off, n;
	int i;

	for (i = 0; i < chunks; i++) {
		off = i * CSUM_CHUNK;
		if (off >= qlen || sum < 0)
			break;
		n = qlen - off;
		if (n > CSUM_CHUNK)
			n = CSUM_CHUNK;
		/* n is in [1, CSUM_CHUNK]; the mask says so to verifiers
		 * (6.1) that learn no lower bound from a comparison. */
		barrier_var(n);
		n = ((n - 1) & (CSUM_CHUNK - 1)) + 1;
		/* A short last chunk is summed with zeros after it, as the
		 * checksum pads an odd byte. */
		__builtin_memset(buf, 0, sizeof(buf));
		if (bpf_skb_load_bytes(skb, ETH_HLEN + off, buf, n))
			return -1;
		n = (n + 3) & ~3ULL;
		barrier_var(n);
		if (n > CSUM_CHUNK)
			break;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)buf, n, (__u32)sum);
	}
	return sum;
}

/* pkt_icmp_port_unreach turns skb, whose packet p is of the family v6
 * says, into an ICMP port unreachable (ICMPv6 destination unreachable,
 * port unreachable: what ip6tables' REJECT --reject-with
 * icmp6-port-unreachable sends) from the packet's destination to its
 * source that quotes the packet, and sends it back out of the device it
 * arrived on. Returns the TC verdict.
 *
 * The new headers are inserted in front of the IP packet, which stays where
 * it is as the quote: inserting an even number of zero bytes keeps a
 * CHECKSUM_COMPLETE skb->csum right, and the stores of the headers update
 * it. Only a packet longer than the quote is trimmed, which turns such an
 * skb into CHECKSUM_NONE. Of the family's pair of headers, the other is
 * never used: the compiler drops it. */
static __always_inline int pkt_icmp_port_unreach(struct __sk_buff *skb, bool v6, const void *p)
{
	__u8 macs[2 * ETH_ALEN];
	struct pkt_icmp_reply r4 = {};
	struct pkt_icmp6_reply r6 = {};
	struct pkt_icmphdr *icmp = v6 ? &r6.icmp : &r4.icmp;
	const __u32 rlen = v6 ? sizeof(r6) : sizeof(r4);
	/* 64-bit, so that the compiler checks the same register it passes
	 * to the helpers (the verifier follows no zero-extended copy). */
	__u64 plen, qlen;
	__s64 sum = 0;

	if (v6) {
		plen = sizeof(struct pkt_ipv6hdr) + ((const struct pkt6 *)p)->payload_len;
		qlen = plen;
		if (qlen > ICMP6_QUOTE_MAX)
			qlen = ICMP6_QUOTE_MAX;
	} else {
		plen = ((const struct pkt4 *)p)->tot_len;
		qlen = plen;
		if (qlen > ICMP_QUOTE_MAX)
			qlen = ICMP_QUOTE_MAX;
	}
	if (pkt_reply_macs(skb, macs))
		return TC_ACT_SHOT;

	if (v6) {
		struct pkt_pseudo6 ph = {};

		icmp->type = ICMPV6_DEST_UNREACH;
		icmp->code = ICMPV6_PORT_UNREACH;
		__builtin_memcpy(ph.saddr, PKT_ADDR(p, true, daddr), sizeof(ph.saddr));
		__builtin_memcpy(ph.daddr, PKT_ADDR(p, true, saddr), sizeof(ph.daddr));
		ph.len = bpf_htonl(sizeof(*icmp) + qlen);
		ph.nexthdr = bpf_htonl(PKT_IPPROTO_ICMPV6);
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
		if (sum < 0)
			return TC_ACT_SHOT;
	} else {
		icmp->type = ICMP_DEST_UNREACH;
		icmp->code = ICMP_PORT_UNREACH;
	}
	sum = bpf_csum_diff(NULL, 0, (__be32 *)icmp, sizeof(*icmp), (__u32)sum);
	if (v6)
		sum = pkt_csum_quote(skb, qlen, ICMP6_QUOTE_MAX / CSUM_CHUNK + 1, sum);
	else
		sum = pkt_csum_quote(skb, qlen, ICMP_QUOTE_MAX / CSUM_CHUNK + 1, sum);
	if (sum < 0)
		return TC_ACT_SHOT;
	icmp->checksum = pkt_csum_fold(sum);

	if (v6) {
		r6.ip.vtc_flow = bpf_htonl(6 << 28);
		r6.ip.payload_len = bpf_htons(sizeof(r6.icmp) + qlen);
		r6.ip.nexthdr = PKT_IPPROTO_ICMPV6;
		r6.ip.hop_limit = ICMP6_HOP_LIMIT;
		__builtin_memcpy(r6.ip.saddr, PKT_ADDR(p, true, daddr), sizeof(r6.ip.saddr));
		__builtin_memcpy(r6.ip.daddr, PKT_ADDR(p, true, saddr), sizeof(r6.ip.daddr));
	} else {
		r4.ip.version = 4;
		r4.ip.ihl = 5;
		r4.ip.tot_len = bpf_htons(sizeof(r4) + qlen);
		r4.ip.ttl = 64;
		r4.ip.protocol = IPPROTO_ICMP;
		r4.ip.saddr = ((const struct pkt4 *)p)->daddr;
		r4.ip.daddr = ((const struct pkt4 *)p)->saddr;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r4.ip, sizeof(r4.ip), 0);
		if (sum < 0)
			return TC_ACT_SHOT;
		r4.ip.check = pkt_csum_fold(sum);
	}

	if (bpf_skb_adjust_room(skb, rlen, BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;
	if (qlen < plen && bpf_skb_change_tail(skb, ETH_HLEN + rlen + qlen, 0))
		return TC_ACT_SHOT;
	/* skb->csum covers the IP packet, not the Ethernet header: only the
	 * store of the new IP and ICMP headers updates it. */
	if (bpf_skb_store_bytes(skb, ETH_HLEN, v6 ? (void *)&r6 : (void *)&r4, rlen,
				BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	return pkt_reply_send(skb, macs);
}

#endif /* EBPF_PROXY_UNREACH_H */
