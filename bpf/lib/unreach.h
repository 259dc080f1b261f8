/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The ICMP port unreachable that a frontend without endpoints answers with,
 * as kube-proxy's REJECT does, built from the packet it refuses. */
#ifndef EBPF_PROXY_UNREACH_H
#define EBPF_PROXY_UNREACH_H

#include "common.h"
#include "csum.h"
#include "parse.h"
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

/* pkt4_icmp_port_unreach turns skb into an ICMP port unreachable from the
 * packet's destination to its source that quotes the packet, and sends it
 * back out of the device it arrived on. Returns the TC verdict.
 *
 * The new headers are inserted in front of the IP packet, which stays where
 * it is as the quote: inserting an even number of zero bytes keeps a
 * CHECKSUM_COMPLETE skb->csum right, and the stores of the headers update
 * it. Only a packet longer than the quote is trimmed, which turns such an
 * skb into CHECKSUM_NONE. */
static __always_inline int pkt4_icmp_port_unreach(struct __sk_buff *skb, const struct pkt4 *p)
{
	__u8 macs[2 * ETH_ALEN];
	__u8 buf[CSUM_CHUNK];
	struct pkt_icmp_reply r = {};
	/* 64-bit, so that the compiler checks the same register it passes
	 * to the helpers (the verifier follows no zero-extended copy). */
	__u64 qlen = p->tot_len, off, n;
	__s64 sum;
	int i;

	if (qlen > ICMP_QUOTE_MAX)
		qlen = ICMP_QUOTE_MAX;
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)))
		return TC_ACT_SHOT;

	r.icmp.type = ICMP_DEST_UNREACH;
	r.icmp.code = ICMP_PORT_UNREACH;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r.icmp), 0);
	for (i = 0; i < ICMP_QUOTE_MAX / CSUM_CHUNK + 1; i++) {
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
			return TC_ACT_SHOT;
		n = (n + 3) & ~3ULL;
		barrier_var(n);
		if (n > CSUM_CHUNK)
			break;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)buf, n, (__u32)sum);
	}
	if (sum < 0)
		return TC_ACT_SHOT;
	r.icmp.checksum = pkt_csum_fold(sum);

	r.ip.version = 4;
	r.ip.ihl = 5;
	r.ip.tot_len = bpf_htons(sizeof(r) + qlen);
	r.ip.ttl = 64;
	r.ip.protocol = IPPROTO_ICMP;
	r.ip.saddr = p->daddr;
	r.ip.daddr = p->saddr;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.ip, sizeof(r.ip), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	r.ip.check = pkt_csum_fold(sum);

	if (bpf_skb_adjust_room(skb, sizeof(r), BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;
	if (qlen < p->tot_len && bpf_skb_change_tail(skb, ETH_HLEN + sizeof(r) + qlen, 0))
		return TC_ACT_SHOT;
	/* skb->csum covers the IP packet, not the Ethernet header: only the
	 * store of the new IP and ICMP headers updates it. */
	if (bpf_skb_store_bytes(skb, 0, macs + ETH_ALEN, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, macs, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &r, sizeof(r), BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

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

/* pkt6_icmp_port_unreach is pkt4_icmp_port_unreach for IPv6: skb becomes an
 * ICMPv6 destination unreachable, port unreachable, from the packet's
 * destination to its source, quoting the packet, what ip6tables' REJECT
 * --reject-with icmp6-port-unreachable sends; it goes back out of the
 * device it came in on. Returns the TC verdict. */
static __always_inline int pkt6_icmp_port_unreach(struct __sk_buff *skb, const struct pkt6 *p)
{
	__u8 macs[2 * ETH_ALEN];
	__u8 buf[CSUM_CHUNK];
	struct pkt_icmp6_reply r = {};
	struct pkt_pseudo6 ph = {};
	__u64 qlen = sizeof(struct pkt_ipv6hdr) + p->payload_len, off, n;
	__s64 sum;
	int i;

	if (qlen > ICMP6_QUOTE_MAX)
		qlen = ICMP6_QUOTE_MAX;
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)))
		return TC_ACT_SHOT;

	r.icmp.type = ICMPV6_DEST_UNREACH;
	r.icmp.code = ICMPV6_PORT_UNREACH;
	__builtin_memcpy(ph.saddr, p->daddr, sizeof(ph.saddr));
	__builtin_memcpy(ph.daddr, p->saddr, sizeof(ph.daddr));
	ph.len = bpf_htonl(sizeof(r.icmp) + qlen);
	ph.nexthdr = bpf_htonl(PKT_IPPROTO_ICMPV6);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r.icmp), (__u32)sum);
	for (i = 0; i < ICMP6_QUOTE_MAX / CSUM_CHUNK + 1; i++) {
		off = i * CSUM_CHUNK;
		if (off >= qlen || sum < 0)
			break;
		n = qlen - off;
		if (n > CSUM_CHUNK)
			n = CSUM_CHUNK;
		barrier_var(n);
		n = ((n - 1) & (CSUM_CHUNK - 1)) + 1;
		__builtin_memset(buf, 0, sizeof(buf));
		if (bpf_skb_load_bytes(skb, ETH_HLEN + off, buf, n))
			return TC_ACT_SHOT;
		n = (n + 3) & ~3ULL;
		barrier_var(n);
		if (n > CSUM_CHUNK)
			break;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)buf, n, (__u32)sum);
	}
	if (sum < 0)
		return TC_ACT_SHOT;
	r.icmp.checksum = pkt_csum_fold(sum);

	r.ip.vtc_flow = bpf_htonl(6 << 28);
	r.ip.payload_len = bpf_htons(sizeof(r.icmp) + qlen);
	r.ip.nexthdr = PKT_IPPROTO_ICMPV6;
	r.ip.hop_limit = ICMP6_HOP_LIMIT;
	__builtin_memcpy(r.ip.saddr, p->daddr, sizeof(r.ip.saddr));
	__builtin_memcpy(r.ip.daddr, p->saddr, sizeof(r.ip.daddr));

	if (bpf_skb_adjust_room(skb, sizeof(r), BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;
	if (qlen < sizeof(struct pkt_ipv6hdr) + p->payload_len &&
	    bpf_skb_change_tail(skb, ETH_HLEN + sizeof(r) + qlen, 0))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, macs + ETH_ALEN, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, macs, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &r, sizeof(r), BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

#endif /* EBPF_PROXY_UNREACH_H */
