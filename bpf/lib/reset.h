/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The TCP reset that a segment of a flow whose backend was removed is
 * answered with, built in place from that segment. */
#ifndef EBPF_PROXY_RESET_H
#define EBPF_PROXY_RESET_H

#include "common.h"
#include "csum.h"
#include "parse.h"
#include "reply.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>

/* A TCP header without bit fields, whose layout depends on the target. */
struct pkt_tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff; /* data offset in words, in the high nibble */
	__u8 flags;
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

/* The headers of a TCP reset without options, which is all it carries. */
struct pkt_tcp_rst {
	struct iphdr ip;
	struct pkt_tcphdr tcp;
};

/* The pseudo-header of the TCP checksum, in its wire layout. */
struct pkt_pseudo4 {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

#define IP_DF	     0x4000
#define RST_TTL	     64
#define INET_ECN_MSK 0x03

/* pkt_tcp_rst_csum sets the TCP checksum of the reset being built at off
 * (its header rst already stored, the packet not yet trimmed) from the
 * segment's own checksum old: the checksum of a CHECKSUM_PARTIAL skb (the
 * device sums the data; GRO packets and those of local senders) covers the
 * pseudo-header only, that of any other the whole segment, and nothing in a
 * program tells the two apart. bpf_l4_csum_replace does: it changes the
 * field of a CHECKSUM_PARTIAL skb only for pseudo-header changes. So the
 * sum of the old segment, ~old, is replaced with that of the new header and
 * the old pseudo-header (a no-op on CHECKSUM_PARTIAL), then the pseudo-
 * header's length with the new one (on both). That first change does not
 * follow into a CHECKSUM_COMPLETE skb->csum: the field is put back with a
 * plain store and written again with a recomputing one. v6 says which
 * pseudo-header (saddr and daddr: the reset's, one word for IPv4). Returns
 * 0 or -1. */
static __always_inline int pkt_tcp_rst_csum(struct __sk_buff *skb, __u32 off, bool v6,
					    const struct pkt_tcphdr *tcp, const __be32 *saddr,
					    const __be32 *daddr, __sum16 old, __be16 old_len)
{
	struct {
		struct pkt_tcphdr tcp;
		struct pkt_pseudo4 ph;
	} to4 = {
		.tcp = *tcp,
		.ph =
			{
				.proto = IPPROTO_TCP,
				.len = old_len,
			},
	};
	/* The IPv6 pseudo-header's 32-bit length holds the same 16 bits in
	 * its second half, which the last step below replaces alike. */
	struct {
		struct pkt_tcphdr tcp;
		struct pkt_pseudo6 ph;
	} to6 = {
		.tcp = *tcp,
		.ph =
			{
				.len = (__be32)old_len << 16,
				.nexthdr = bpf_htonl(IPPROTO_TCP),
			},
	};
	__be32 from = (__u16)~old;
	__be16 new_len = bpf_htons(sizeof(struct pkt_tcphdr));
	__sum16 mid;
	__s64 diff;

	if (v6) {
		to6.tcp.check = 0;
		__builtin_memcpy(to6.ph.saddr, saddr, sizeof(to6.ph.saddr));
		__builtin_memcpy(to6.ph.daddr, daddr, sizeof(to6.ph.daddr));
		diff = bpf_csum_diff(&from, sizeof(from), (__be32 *)&to6, sizeof(to6), 0);
	} else {
		to4.tcp.check = 0;
		to4.ph.saddr = saddr[0];
		to4.ph.daddr = daddr[0];
		diff = bpf_csum_diff(&from, sizeof(from), (__be32 *)&to4, sizeof(to4), 0);
	}
	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, off, 0, (__u32)diff, 0) ||
	    bpf_skb_load_bytes(skb, off, &mid, sizeof(mid)) ||
	    bpf_skb_store_bytes(skb, off, &old, sizeof(old), 0) ||
	    bpf_skb_store_bytes(skb, off, &mid, sizeof(mid), BPF_F_RECOMPUTE_CSUM))
		return -1;
	return bpf_l4_csum_replace(skb, off, old_len, new_len, BPF_F_PSEUDO_HDR | sizeof(new_len))
		       ? -1
		       : 0;
}

/* The headers of an IPv6 TCP reset. */
struct pkt_tcp6_rst {
	struct pkt_ipv6hdr ip;
	struct pkt_tcphdr tcp;
};

/* pkt_tcp_rst turns the TCP segment p (of the family v6 says) into the
 * reset a host without its connection answers with (RFC 793, "Reset
 * Generation"), from the segment's destination to its source, and sends it
 * back out of the device it came in on. A segment with ACK gets
 * <SEQ=SEG.ACK><CTL=RST>, one without it <SEQ=0><ACK=SEG.SEQ+SEG.LEN>
 * <CTL=RST,ACK>. As the kernel's resets, it has window 0, no options,
 * TTL (hop limit) 64 and the segment's DSCP (traffic class) without ECN;
 * IPv4 adds DF and IP ID 0, IPv6 no flow label.
 *
 * The reset is built in place: IPv4 options are cut out (so that a
 * CHECKSUM_PARTIAL skb's checksum start stays on the TCP header; pkt6_parse
 * admits no IPv6 extension headers), the IP and TCP headers rewritten and
 * TCP options and payload trimmed off, which leaves a CHECKSUM_COMPLETE skb
 * CHECKSUM_NONE unless nothing was cut. Returns the TC verdict: TC_ACT_SHOT
 * for a segment that is itself a reset (never answered, RFC 793), a
 * malformed one, or a helper's failure. Of the family's pair of headers,
 * the other is never used: the compiler drops it. */
static __always_inline int pkt_tcp_rst(struct __sk_buff *skb, bool v6, const void *p)
{
	const __u32 iplen = v6 ? sizeof(struct pkt_ipv6hdr) : sizeof(struct iphdr);
	__u32 check_off = ETH_HLEN + iplen + pkt_offsetof(struct pkt_tcphdr, check);
	__u64 frame_len = ETH_HLEN + iplen + sizeof(struct pkt_tcphdr);
	const struct pkt4 *p4 = p;
	const struct pkt6 *p6 = p;
	struct pkt_tcp_rst r4 = {};
	struct pkt_tcp6_rst r6 = {};
	struct pkt_tcphdr *tcp = v6 ? &r6.tcp : &r4.tcp;
	struct pkt_tcphdr th;
	__u8 macs[2 * ETH_ALEN];
	__u32 thlen, seglen, l4len;
	__be32 vtc;
	__s64 sum;

	if (PKT_F(p, v6, tcp_flags) & TCP_FLAG_RST)
		return TC_ACT_SHOT;
	if (pkt_reply_macs(skb, macs) ||
	    (v6 && bpf_skb_load_bytes(skb, ETH_HLEN, &vtc, sizeof(vtc))) ||
	    bpf_skb_load_bytes(skb, PKT_F(p, v6, l4_off), &th, sizeof(th)))
		return TC_ACT_SHOT;
	thlen = (th.doff >> 4) * 4;
	if (thlen < sizeof(th) ||
	    (v6 ? thlen > p6->payload_len : p4->ihl_len + thlen > p4->tot_len))
		return TC_ACT_SHOT;
	l4len = v6 ? p6->payload_len : p4->tot_len - p4->ihl_len;

	tcp->source = th.dest;
	tcp->dest = th.source;
	tcp->doff = (sizeof(*tcp) / 4) << 4;
	if (th.flags & TCP_FLAG_ACK) {
		tcp->seq = th.ack_seq;
		tcp->flags = TCP_FLAG_RST;
	} else {
		seglen = l4len - thlen;
		seglen += !!(th.flags & TCP_FLAG_SYN) + !!(th.flags & TCP_FLAG_FIN);
		tcp->ack_seq = bpf_htonl(bpf_ntohl(th.seq) + seglen);
		tcp->flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	}

	if (v6) {
		/* Version and traffic class without ECN; no flow label. */
		r6.ip.vtc_flow = bpf_htonl(bpf_ntohl(vtc) & 0xff300000);
		r6.ip.payload_len = bpf_htons(sizeof(r6.tcp));
		r6.ip.nexthdr = IPPROTO_TCP;
		r6.ip.hop_limit = RST_TTL;
		__builtin_memcpy(r6.ip.saddr, p6->daddr, sizeof(r6.ip.saddr));
		__builtin_memcpy(r6.ip.daddr, p6->saddr, sizeof(r6.ip.daddr));
	} else {
		r4.ip.version = 4;
		r4.ip.ihl = 5;
		r4.ip.tos = p4->tos & ~INET_ECN_MSK;
		r4.ip.tot_len = bpf_htons(sizeof(r4));
		r4.ip.frag_off = bpf_htons(IP_DF);
		r4.ip.ttl = RST_TTL;
		r4.ip.protocol = IPPROTO_TCP;
		r4.ip.saddr = p4->daddr;
		r4.ip.daddr = p4->saddr;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r4.ip, sizeof(r4.ip), 0);
		if (sum < 0)
			return TC_ACT_SHOT;
		r4.ip.check = pkt_csum_fold(sum);
		if (p4->ihl_len > sizeof(struct iphdr) &&
		    bpf_skb_adjust_room(skb, -(__s32)(p4->ihl_len - sizeof(struct iphdr)),
					BPF_ADJ_ROOM_NET, 0))
			return TC_ACT_SHOT;
	}

	/* The TCP header but its checksum, then the checksum, then the IP
	 * header: every store keeps a CHECKSUM_COMPLETE skb->csum right. */
	if (bpf_skb_store_bytes(skb, ETH_HLEN + iplen, tcp, pkt_offsetof(struct pkt_tcphdr, check),
				BPF_F_RECOMPUTE_CSUM) ||
	    bpf_skb_store_bytes(skb, check_off + sizeof(tcp->check), &tcp->urg_ptr,
				sizeof(tcp->urg_ptr), BPF_F_RECOMPUTE_CSUM) ||
	    pkt_tcp_rst_csum(skb, check_off, v6, tcp, v6 ? r6.ip.saddr : &r4.ip.saddr,
			     v6 ? r6.ip.daddr : &r4.ip.daddr, th.check, bpf_htons(l4len)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, v6 ? (void *)&r6.ip : (void *)&r4.ip, iplen,
				BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	if (skb->len > frame_len && bpf_skb_change_tail(skb, frame_len, 0))
		return TC_ACT_SHOT;
	return pkt_reply_send(skb, macs);
}

#endif /* EBPF_PROXY_RESET_H */
