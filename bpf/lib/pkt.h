/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing and rewriting for the TC programs: IPv4 TCP and UDP
 * headers read through bpf_skb_load_bytes (so that paged skbs need no pull),
 * address and port rewrites with the kernel's checksum helpers, the ICMP
 * port unreachable answer, and forwarding by a FIB lookup. */
#ifndef EBPF_PROXY_PKT_H
#define EBPF_PROXY_PKT_H

#include "common.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>

#define IP_MF	  0x2000
#define IP_OFFSET 0x1fff

/* offsetof without libc. */
#define pkt_offsetof(type, member) __builtin_offsetof(type, member)

/* linux/icmp.h needs the C library (see bpf/include/update.sh), so the
 * ICMP header is declared here. */
struct pkt_icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 unused;
};

#define ICMP_DEST_UNREACH  3
#define ICMP_PORT_UNREACH  3
#define ICMP_TIME_EXCEEDED 11

/* AF_INET for bpf_fib_lookup. */
#define PKT_AF_INET 2

/* What the parser found in a frame. Offsets are from the start of the
 * Ethernet header. */
struct pkt4 {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags; /* byte 13 of the TCP header */
	__u8 ttl;
	__u8 tos;
	__u16 ihl_len; /* IP header length in bytes */
	__u16 tot_len;
	__u32 l4_off;
	__u32 csum_off; /* of the L4 checksum, from the frame start */
	bool fragment;
};

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

enum pkt_parse {
	PKT_OK,	   /* TCP or UDP with whole headers */
	PKT_ICMP,  /* ICMP, not a fragment: only the IP fields of p are set */
	PKT_OTHER, /* not IPv4, another protocol, truncated, malformed */
};

/* pkt4_parse reads the IPv4 and TCP/UDP headers of skb into p. Anything
 * that is not a well-formed, complete IPv4 TCP or UDP packet is PKT_OTHER,
 * which the programs pass untouched: the kernel drops what is malformed.
 * Fragments parse as PKT_OK with p->fragment set and, for non-first
 * fragments, no ports. */
static __always_inline enum pkt_parse pkt4_parse(struct __sk_buff *skb, struct pkt4 *p)
{
	struct iphdr ip;
	__u32 ihl, tot_len, hlen;
	__be16 ports[2];

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return PKT_OTHER;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
		return PKT_OTHER;
	ihl = ip.ihl * 4;
	tot_len = bpf_ntohs(ip.tot_len);
	/* The 6.1 verifier does not bound a byte swap's result. */
	barrier_var(tot_len);
	tot_len &= 0xffff;
	if (ip.version != 4 || ihl < sizeof(ip) || tot_len < ihl)
		return PKT_OTHER;
	/* Bytes beyond the total length are link padding; fewer bytes than
	 * it says is a truncated packet. */
	if (skb->len < ETH_HLEN + tot_len)
		return PKT_OTHER;
	if (ip.protocol == IPPROTO_TCP) {
		hlen = sizeof(struct tcphdr);
		p->csum_off = pkt_offsetof(struct tcphdr, check);
	} else if (ip.protocol == IPPROTO_UDP) {
		hlen = sizeof(struct udphdr);
		p->csum_off = pkt_offsetof(struct udphdr, check);
	} else if (ip.protocol == IPPROTO_ICMP) {
		hlen = 0;
		p->csum_off = pkt_offsetof(struct pkt_icmphdr, checksum);
	} else {
		return PKT_OTHER;
	}
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->proto = ip.protocol;
	p->ttl = ip.ttl;
	p->tos = ip.tos;
	p->ihl_len = ihl;
	p->tot_len = tot_len;
	p->l4_off = ETH_HLEN + ihl;
	p->csum_off += p->l4_off;
	p->fragment = (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)) != 0;
	if (p->proto == IPPROTO_ICMP)
		return p->fragment ? PKT_OTHER : PKT_ICMP;
	if (ip.frag_off & bpf_htons(IP_OFFSET)) {
		p->sport = 0;
		p->dport = 0;
		return PKT_OK;
	}
	if (tot_len - ihl < hlen)
		return PKT_OTHER;
	if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)))
		return PKT_OTHER;
	p->sport = ports[0];
	p->dport = ports[1];
	p->tcp_flags = 0;
	if (p->proto == IPPROTO_TCP &&
	    bpf_skb_load_bytes(skb, p->l4_off + 13, &p->tcp_flags, sizeof(p->tcp_flags)))
		return PKT_OTHER;
	return PKT_OK;
}

/* pkt4_rewrite changes one side of the packet (the source when src, else
 * the destination) from (p's address, p's port) to (addr, port), keeping the
 * IP and L4 checksums and a CHECKSUM_COMPLETE skb->csum right, and updates p.
 * Returns 0 or a negative error (the packet may then be half rewritten and
 * must be dropped). */
static __always_inline int pkt4_rewrite(struct __sk_buff *skb, struct pkt4 *p, bool src,
					__be32 addr, __be16 port)
{
	__u32 addr_off = ETH_HLEN + (src ? pkt_offsetof(struct iphdr, saddr)
					 : pkt_offsetof(struct iphdr, daddr));
	__u32 port_off = p->l4_off + (src ? 0 : sizeof(__be16));
	__be32 old_addr = src ? p->saddr : p->daddr;
	__be16 old_port = src ? p->sport : p->dport;
	__u64 l4_flags = 0, port_flags = 0;
	__sum16 l4_csum;

	if (p->proto == IPPROTO_UDP) {
		/* A UDP datagram without checksum keeps none (RFC 768), and
		 * a computed zero is sent as all ones. Without a checksum
		 * field to cancel the port change in, skb->csum must follow
		 * the store itself. */
		l4_flags = BPF_F_MARK_MANGLED_0;
		if (bpf_skb_load_bytes(skb, p->csum_off, &l4_csum, sizeof(l4_csum)))
			return -1;
		if (!l4_csum)
			port_flags = BPF_F_RECOMPUTE_CSUM;
	}
	if (old_addr != addr) {
		if (bpf_l4_csum_replace(skb, p->csum_off, old_addr, addr,
					l4_flags | BPF_F_PSEUDO_HDR | sizeof(addr)))
			return -1;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + pkt_offsetof(struct iphdr, check), old_addr,
					addr, sizeof(addr)))
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0))
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, p->csum_off, old_port, port, l4_flags | sizeof(port)))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), port_flags))
			return -1;
	}
	if (src) {
		p->saddr = addr;
		p->sport = port;
	} else {
		p->daddr = addr;
		p->dport = port;
	}
	return 0;
}

static __always_inline __u16 pkt_csum_fold(__s64 sum)
{
	__u64 s = (__u64)sum;

	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* The headers put in front of a packet for a Service without endpoints to
 * turn it into the ICMP port unreachable kube-proxy's REJECT answers with. */
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

/* pkt4_tcp_rst_csum sets the TCP checksum of the reset being built at off
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
 * plain store and written again with a recomputing one. Returns 0 or -1. */
static __always_inline int pkt4_tcp_rst_csum(struct __sk_buff *skb, __u32 off,
					     const struct pkt_tcp_rst *rst, __sum16 old,
					     __be16 old_len)
{
	struct {
		struct pkt_tcphdr tcp;
		struct pkt_pseudo4 ph;
	} to = {
		.tcp = rst->tcp,
		.ph =
			{
				.saddr = rst->ip.saddr,
				.daddr = rst->ip.daddr,
				.proto = IPPROTO_TCP,
				.len = old_len,
			},
	};
	__be32 from = (__u16)~old;
	__be16 new_len = bpf_htons(sizeof(struct pkt_tcphdr));
	__sum16 mid;
	__s64 diff;

	to.tcp.check = 0;
	diff = bpf_csum_diff(&from, sizeof(from), (__be32 *)&to, sizeof(to), 0);
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

/* pkt4_tcp_rst turns the TCP segment p into the reset a host without its
 * connection answers with (RFC 793, "Reset Generation"), from the segment's
 * destination to its source, and sends it back out of the device it came
 * in on. A segment with ACK gets <SEQ=SEG.ACK><CTL=RST>, one without it
 * <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>. As the kernel's resets, it has
 * window 0, no options, TTL 64, DF, IP ID 0 and the segment's DSCP.
 *
 * The reset is built in place: IP options are cut out (so that a
 * CHECKSUM_PARTIAL skb's checksum start stays on the TCP header), the IP
 * and TCP headers rewritten and TCP options and payload trimmed off, which
 * leaves a CHECKSUM_COMPLETE skb CHECKSUM_NONE unless nothing was cut.
 * Returns the TC verdict: TC_ACT_SHOT for a segment that is itself a reset
 * (never answered, RFC 793), a malformed one, or a helper's failure. */
static __always_inline int pkt4_tcp_rst(struct __sk_buff *skb, const struct pkt4 *p)
{
	__u32 check_off = ETH_HLEN + sizeof(struct iphdr) + pkt_offsetof(struct pkt_tcphdr, check);
	__u64 frame_len = ETH_HLEN + sizeof(struct pkt_tcp_rst);
	struct pkt_tcp_rst r = {};
	struct pkt_tcphdr th;
	__u8 macs[2 * ETH_ALEN];
	__u32 thlen, seglen;
	__s64 sum;

	if (p->tcp_flags & TCP_FLAG_RST)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) ||
	    bpf_skb_load_bytes(skb, p->l4_off, &th, sizeof(th)))
		return TC_ACT_SHOT;
	thlen = (th.doff >> 4) * 4;
	if (thlen < sizeof(th) || p->ihl_len + thlen > p->tot_len)
		return TC_ACT_SHOT;

	r.tcp.source = th.dest;
	r.tcp.dest = th.source;
	r.tcp.doff = (sizeof(r.tcp) / 4) << 4;
	if (th.flags & TCP_FLAG_ACK) {
		r.tcp.seq = th.ack_seq;
		r.tcp.flags = TCP_FLAG_RST;
	} else {
		seglen = p->tot_len - p->ihl_len - thlen;
		seglen += !!(th.flags & TCP_FLAG_SYN) + !!(th.flags & TCP_FLAG_FIN);
		r.tcp.ack_seq = bpf_htonl(bpf_ntohl(th.seq) + seglen);
		r.tcp.flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	}

	r.ip.version = 4;
	r.ip.ihl = 5;
	r.ip.tos = p->tos & ~INET_ECN_MSK;
	r.ip.tot_len = bpf_htons(sizeof(r));
	r.ip.frag_off = bpf_htons(IP_DF);
	r.ip.ttl = RST_TTL;
	r.ip.protocol = IPPROTO_TCP;
	r.ip.saddr = p->daddr;
	r.ip.daddr = p->saddr;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.ip, sizeof(r.ip), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	r.ip.check = pkt_csum_fold(sum);

	if (p->ihl_len > sizeof(struct iphdr) &&
	    bpf_skb_adjust_room(skb, -(__s32)(p->ihl_len - sizeof(struct iphdr)), BPF_ADJ_ROOM_NET,
				0))
		return TC_ACT_SHOT;
	/* The TCP header but its checksum, then the checksum, then the IP
	 * header: every store keeps a CHECKSUM_COMPLETE skb->csum right. */
	if (bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(r.ip), &r.tcp,
				pkt_offsetof(struct pkt_tcphdr, check), BPF_F_RECOMPUTE_CSUM) ||
	    bpf_skb_store_bytes(skb, check_off + sizeof(r.tcp.check), &r.tcp.urg_ptr,
				sizeof(r.tcp.urg_ptr), BPF_F_RECOMPUTE_CSUM) ||
	    pkt4_tcp_rst_csum(skb, check_off, &r, th.check, bpf_htons(p->tot_len - p->ihl_len)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &r.ip, sizeof(r.ip), BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	if (skb->len > frame_len && bpf_skb_change_tail(skb, frame_len, 0))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, macs + ETH_ALEN, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, macs, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* The packet an ICMP error quotes: its addresses and ports as quoted, and
 * where its headers are, from the frame start. */
struct pkt4_inner {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u32 ip_off;
	__u32 l4_off;
	/* Of the quoted L4 checksum, 0 when the quote ends before it. */
	__u32 l4_check_off;
};

/* pkt4_parse_icmp_err reads the packet that an ICMP destination unreachable
 * or time exceeded message p quotes, when it is a TCP or UDP packet (or its
 * first fragment) quoted with at least its ports. Returns 0 when it is. */
static __always_inline int pkt4_parse_icmp_err(struct __sk_buff *skb, const struct pkt4 *p,
					       struct pkt4_inner *in)
{
	struct pkt_icmphdr icmp;
	struct iphdr ip;
	__be16 ports[2];
	__u32 ihl;

	if (p->tot_len < p->ihl_len + sizeof(icmp) + sizeof(ip) + sizeof(ports))
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4_off, &icmp, sizeof(icmp)))
		return -1;
	if (icmp.type != ICMP_DEST_UNREACH && icmp.type != ICMP_TIME_EXCEEDED)
		return -1;
	in->ip_off = p->l4_off + sizeof(icmp);
	if (bpf_skb_load_bytes(skb, in->ip_off, &ip, sizeof(ip)))
		return -1;
	ihl = ip.ihl * 4;
	if (ip.version != 4 || ihl < sizeof(ip) || (ip.frag_off & bpf_htons(IP_OFFSET)) ||
	    (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP))
		return -1;
	in->l4_off = in->ip_off + ihl;
	if (ETH_HLEN + p->tot_len < in->l4_off + sizeof(ports))
		return -1;
	if (bpf_skb_load_bytes(skb, in->l4_off, ports, sizeof(ports)))
		return -1;
	in->saddr = ip.saddr;
	in->daddr = ip.daddr;
	in->sport = ports[0];
	in->dport = ports[1];
	in->proto = ip.protocol;
	in->l4_check_off =
		in->l4_off + (ip.protocol == IPPROTO_TCP ? pkt_offsetof(struct tcphdr, check)
							 : pkt_offsetof(struct udphdr, check));
	if (ETH_HLEN + p->tot_len < in->l4_check_off + sizeof(__sum16))
		in->l4_check_off = 0;
	return 0;
}

/* pkt_csum_replace updates a ones' complement checksum for a field
 * changing from `from` to `to` (RFC 1624, eqn. 3): for checksums inside a
 * quoted packet, which the kernel helpers' checksum state must not touch. */
static __always_inline __u16 pkt_csum_replace(__u16 check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~check;

	sum += (~from & 0xffff) + (~from >> 16);
	sum += (to & 0xffff) + (to >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* pkt4_icmp_rewrite_outer changes the source (src) or destination address of
 * an ICMP message's own IP header; ICMP has no pseudo-header. */
static __always_inline int pkt4_icmp_rewrite_outer(struct __sk_buff *skb, struct pkt4 *p, bool src,
						   __be32 addr)
{
	__be32 old = src ? p->saddr : p->daddr;
	__u32 off = ETH_HLEN +
		    (src ? pkt_offsetof(struct iphdr, saddr) : pkt_offsetof(struct iphdr, daddr));

	if (old == addr)
		return 0;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + pkt_offsetof(struct iphdr, check), old, addr,
				sizeof(addr)) ||
	    bpf_skb_store_bytes(skb, off, &addr, sizeof(addr), 0))
		return -1;
	if (src)
		p->saddr = addr;
	else
		p->daddr = addr;
	return 0;
}

/* pkt4_icmp_rewrite_inner changes one side (src) of the quoted packet to
 * (addr, port): its IP and L4 checksums follow (the latter when quoted),
 * and the ICMP checksum follows every byte changed. On a CHECKSUM_PARTIAL
 * skb the ICMP checksum is the device's to compute, and the helper leaves
 * it alone, as it should. */
static __always_inline int pkt4_icmp_rewrite_inner(struct __sk_buff *skb, const struct pkt4 *p,
						   struct pkt4_inner *in, bool src, __be32 addr,
						   __be16 port)
{
	__u32 icmp_csum = p->csum_off;
	__u32 check_off = in->ip_off + pkt_offsetof(struct iphdr, check);
	__u32 addr_off = in->ip_off + (src ? pkt_offsetof(struct iphdr, saddr)
					   : pkt_offsetof(struct iphdr, daddr));
	__u32 port_off = in->l4_off + (src ? 0 : sizeof(__be16));
	__be32 old = src ? in->saddr : in->daddr;
	__be16 old_port = src ? in->sport : in->dport;
	__sum16 old_check, new_check;

	__u16 l4_check, l4_new;

	/* The quoted L4 checksum (its pseudo-header holds the addresses) is
	 * kept right for the quoted packet as it now reads. */
	if (in->l4_check_off && (old != addr || old_port != port)) {
		if (bpf_skb_load_bytes(skb, in->l4_check_off, &l4_check, sizeof(l4_check)))
			return -1;
		if (in->proto == IPPROTO_TCP || l4_check) {
			l4_new = pkt_csum_replace(l4_check, old, addr);
			l4_new = pkt_csum_replace(l4_new, old_port, port);
			if (in->proto == IPPROTO_UDP && !l4_new)
				l4_new = 0xffff;
			if (bpf_l4_csum_replace(skb, icmp_csum, l4_check, l4_new, sizeof(l4_new)) ||
			    bpf_skb_store_bytes(skb, in->l4_check_off, &l4_new, sizeof(l4_new), 0))
				return -1;
		}
	}
	if (old != addr) {
		if (bpf_skb_load_bytes(skb, check_off, &old_check, sizeof(old_check)) ||
		    bpf_l3_csum_replace(skb, check_off, old, addr, sizeof(addr)) ||
		    bpf_skb_load_bytes(skb, check_off, &new_check, sizeof(new_check)) ||
		    bpf_l4_csum_replace(skb, icmp_csum, old, addr, sizeof(addr)) ||
		    bpf_l4_csum_replace(skb, icmp_csum, old_check, new_check, sizeof(new_check)) ||
		    bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0))
			return -1;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, icmp_csum, old_port, port, sizeof(port)) ||
		    bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0))
			return -1;
	}
	if (src) {
		in->saddr = addr;
		in->sport = port;
	} else {
		in->daddr = addr;
		in->dport = port;
	}
	return 0;
}

/* pkt4_forward sends a translated packet out of the device the FIB chooses
 * for its new destination, bypassing the kernel's input path: a packet whose
 * source is now a node address would be a martian there. It decrements the
 * TTL as a router does. No tot_len is given to the lookup, so that the
 * kernel checks the MTU against the skb, which lets GRO packets through as
 * its forwarding path does. Returns the TC verdict, and sets *no_route when it
 * drops the packet for want of a route or TTL, for the caller to count. */
static __always_inline int pkt4_forward(struct __sk_buff *skb, const struct pkt4 *p, bool *no_route)
{
	struct bpf_fib_lookup fib = {
		.family = PKT_AF_INET,
		.tos = p->tos,
		.l4_protocol = p->proto,
		.sport = p->sport,
		.dport = p->dport,
		.ipv4_src = p->saddr,
		.ipv4_dst = p->daddr,
		.ifindex = skb->ifindex,
	};
	__be16 old_ttl, new_ttl;
	long ret;

	if (p->ttl <= 1) {
		*no_route = true;
		return TC_ACT_SHOT;
	}
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) {
		*no_route = true;
		return TC_ACT_SHOT;
	}
	/* The TTL shares a 16-bit word with the protocol for the checksum. */
	old_ttl = bpf_htons(((__u16)p->ttl << 8) | p->proto);
	new_ttl = bpf_htons(((__u16)(p->ttl - 1) << 8) | p->proto);
	if (bpf_l3_csum_replace(skb, ETH_HLEN + pkt_offsetof(struct iphdr, check), old_ttl, new_ttl,
				sizeof(new_ttl)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + pkt_offsetof(struct iphdr, ttl), &new_ttl,
				sizeof(__u8), 0))
		return TC_ACT_SHOT;
	if (ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(fib.ifindex, 0);
}

#endif /* EBPF_PROXY_PKT_H */
