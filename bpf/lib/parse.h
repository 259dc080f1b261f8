/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Reading IPv4 and IPv6 TCP and UDP headers into struct pkt4 and struct
 * pkt6, which every other packet header takes: from skbs straight from the
 * linear part where the headers are, else through bpf_skb_load_bytes (so
 * that paged skbs need no pull), from XDP buffers
 * with direct packet access, and the packet that an ICMP or ICMPv6 error
 * quotes. The wire definitions the vendored UAPI headers lack are here too. */
#ifndef EBPF_PROXY_PARSE_H
#define EBPF_PROXY_PARSE_H

#include "common.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>

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

/* pkt_skb_bounds reads skb->data and skb->data_end. Each is one load from
 * the context itself: the verifier rejects a load through a context pointer
 * moved to the field, which the compiler otherwise makes when it keeps the
 * fields' addresses in registers across many reads. */
static __always_inline void *pkt_skb_bounds(struct __sk_buff *skb, void **end)
{
	void *data, *data_end;

	asm volatile("%0 = *(u32 *)(%1 + %2)"
		     : "=r"(data)
		     : "r"(skb), "i"(pkt_offsetof(struct __sk_buff, data)));
	asm volatile("%0 = *(u32 *)(%1 + %2)"
		     : "=r"(data_end)
		     : "r"(skb), "i"(pkt_offsetof(struct __sk_buff, data_end)));
	*end = data_end;
	return data;
}

/* pkt_skb_load copies len bytes at off (from the Ethernet header) of skb to
 * to: read in place when they are in the linear part, as a packet's headers
 * almost always are (a helper call costs more than the copy), else with
 * bpf_skb_load_bytes. len is a constant at every call. */
static __always_inline long pkt_skb_load(struct __sk_buff *skb, __u32 off, void *to,
					 const __u32 len)
{
	void *end, *data = pkt_skb_bounds(skb, &end);

	if (off <= 0xff && data + off + len <= end) {
		__builtin_memcpy(to, data + off, len);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, to, len);
}

/* pkt_skb_at returns where the len bytes at off (from the Ethernet header,
 * below 256) of skb are, for a store in place, or NULL when they are not all
 * in the linear part (the caller then stores through the helpers). A store
 * in place costs no helper call, but makes the kernel unclone every cloned
 * skb the program sees (the verifier's prologue): only the ingress program
 * does (the direct argument of rewrite.h and fwd.h). off is bounded in the
 * register that is added (the asm): the compiler may otherwise add a
 * register that holds the same value but whose bounds 6.1's verifier does
 * not know. len is a constant at every call. */
static __always_inline void *pkt_skb_at(struct __sk_buff *skb, __u32 off, const __u32 len)
{
	void *end, *at = pkt_skb_bounds(skb, &end);
	__u64 o = off;

	asm volatile("%0 &= 0xff" : "+r"(o));
	at += o;
	if (at + len > end)
		return NULL;
	return at;
}

/* Where the L4 header of a frame with the usual IP header is: after an
 * IPv4 header without options, or an IPv6 header (pkt6_parse admits no
 * extension header). */
#define PKT4_L4_OFF (ETH_HLEN + sizeof(struct iphdr))
#define PKT6_L4_OFF (ETH_HLEN + sizeof(struct pkt_ipv6hdr))

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
	/* The UDP checksum as received (0: none, RFC 768); 0 for TCP. Kept
	 * here, not read again at csum_off when the packet is rewritten: a
	 * read at csum_off, whose range depends on the IP options, makes the
	 * verifier track that range exactly on every path from the parse to
	 * the rewrite, and not merge paths whose ranges differ. */
	__sum16 udp_csum;
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
	__be16 hdr[4];

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return PKT_OTHER;
	if (pkt_skb_load(skb, ETH_HLEN, &ip, sizeof(ip)))
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
	/* The first 8 bytes of the L4 header, which TCP's and UDP's both
	 * have: the ports and UDP's checksum. */
	if (pkt_skb_load(skb, p->l4_off, hdr, sizeof(hdr)))
		return PKT_OTHER;
	p->sport = hdr[0];
	p->dport = hdr[1];
	p->udp_csum = p->proto == IPPROTO_UDP ? hdr[3] : 0;
	p->tcp_flags = 0;
	if (p->proto == IPPROTO_TCP &&
	    pkt_skb_load(skb, p->l4_off + 13, &p->tcp_flags, sizeof(p->tcp_flags)))
		return PKT_OTHER;
	return PKT_OK;
}

/* IPv6. linux/ipv6.h is not vendored: its header is declared here. */
struct pkt_ipv6hdr {
	__be32 vtc_flow; /* version 4 bits, traffic class 8, flow label 20 */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be32 saddr[4];
	__be32 daddr[4];
};

#define PKT_IPPROTO_ICMPV6 58

/* The ICMPv6 error messages (RFC 4443 3): each quotes the packet it is
 * about after its 8-byte header (struct pkt_icmphdr). */
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG   2
#define ICMPV6_TIME_EXCEED  3
#define ICMPV6_PARAMPROB    4

/* The pseudo-header of IPv6 upper-layer checksums (RFC 8200 8.1), in its
 * wire layout. */
struct pkt_pseudo6 {
	__be32 saddr[4];
	__be32 daddr[4];
	__be32 len;
	__be32 nexthdr;
};

/* What pkt6_parse found in a frame, as struct pkt4. An IPv6 packet has no
 * header checksum, options or fragments of its own: extension headers,
 * fragments among them, make it one the programs pass untouched. */
struct pkt6 {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags;
	__u8 hop_limit;
	__u16 payload_len; /* the IPv6 payload length: TCP or UDP header and data */
	__u32 l4_off;
	__u32 csum_off; /* of the L4 checksum, from the frame start */
};

/* pkt6_parse reads the IPv6 and TCP/UDP headers of skb into p. Only a
 * complete IPv6 packet whose first next header is TCP or UDP is PKT_OK,
 * and one whose first next header is ICMPv6 PKT_ICMP (only the IPv6 fields
 * of p set, csum_off the ICMPv6 checksum's); everything else is PKT_OTHER,
 * which the programs pass untouched: packets with extension headers
 * (fragments among them: their ports may be in another fragment),
 * jumbograms, truncated packets, and UDP without checksum, which IPv6
 * forbids (RFC 8200 8.1): the receiver drops it as it would without us. */
static __always_inline enum pkt_parse pkt6_parse(struct __sk_buff *skb, struct pkt6 *p)
{
	struct pkt_ipv6hdr ip;
	__u32 plen, hlen;
	__be16 hdr[4];

	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return PKT_OTHER;
	if (pkt_skb_load(skb, ETH_HLEN, &ip, sizeof(ip)))
		return PKT_OTHER;
	plen = bpf_ntohs(ip.payload_len);
	barrier_var(plen);
	plen &= 0xffff;
	if ((bpf_ntohl(ip.vtc_flow) >> 28) != 6)
		return PKT_OTHER;
	if (ip.nexthdr == IPPROTO_TCP) {
		hlen = sizeof(struct tcphdr);
		p->csum_off = pkt_offsetof(struct tcphdr, check);
	} else if (ip.nexthdr == IPPROTO_UDP) {
		hlen = sizeof(struct udphdr);
		p->csum_off = pkt_offsetof(struct udphdr, check);
	} else if (ip.nexthdr == PKT_IPPROTO_ICMPV6) {
		hlen = sizeof(struct pkt_icmphdr);
		p->csum_off = pkt_offsetof(struct pkt_icmphdr, checksum);
	} else {
		return PKT_OTHER;
	}
	/* Bytes beyond the payload length are link padding; fewer is a
	 * truncated packet. A jumbogram says 0. */
	if (plen < hlen || skb->len < ETH_HLEN + sizeof(ip) + plen)
		return PKT_OTHER;
	p->l4_off = ETH_HLEN + sizeof(ip);
	p->csum_off += p->l4_off;
	if (ip.nexthdr == PKT_IPPROTO_ICMPV6) {
		__builtin_memcpy(p->saddr, ip.saddr, sizeof(p->saddr));
		__builtin_memcpy(p->daddr, ip.daddr, sizeof(p->daddr));
		p->proto = ip.nexthdr;
		p->hop_limit = ip.hop_limit;
		p->payload_len = plen;
		return PKT_ICMP;
	}
	if (pkt_skb_load(skb, p->l4_off, hdr, sizeof(hdr)))
		return PKT_OTHER;
	p->tcp_flags = 0;
	if (ip.nexthdr == IPPROTO_TCP) {
		if (pkt_skb_load(skb, p->l4_off + 13, &p->tcp_flags, sizeof(p->tcp_flags)))
			return PKT_OTHER;
	} else if (!hdr[3]) {
		return PKT_OTHER;
	}
	__builtin_memcpy(p->saddr, ip.saddr, sizeof(p->saddr));
	__builtin_memcpy(p->daddr, ip.daddr, sizeof(p->daddr));
	p->sport = hdr[0];
	p->dport = hdr[1];
	p->proto = ip.nexthdr;
	p->hop_limit = ip.hop_limit;
	p->payload_len = plen;
	return PKT_OK;
}

/* The XDP program handles only the simple, common frames (IPv4 without
 * options or IPv6 without extension headers, TCP or UDP, not a fragment,
 * headers in the linear part, no fragment pages) and leaves the rest to the
 * TC programs, so the headers it reads sit at fixed offsets: Ethernet, then
 * a 20-byte IPv4 header or a 40-byte IPv6 one. */
#define XDP_IP_OFF  ETH_HLEN
#define XDP_L4_OFF  PKT4_L4_OFF
#define XDP_L4_OFF6 PKT6_L4_OFF

/* PKT_F names a field that struct pkt4 and struct pkt6 share, of p, a
 * struct pkt6 when v6 (a constant at every call), as CT_E does for the
 * flow entries. */
#define PKT_F(p, v6, f) (*((v6) ? &((struct pkt6 *)(p))->f : &((struct pkt4 *)(p))->f))

/* What xdp_pkt_parse found. */
enum xdp_parse {
	XDP_PKT_OK,	  /* a frame xdp.c may translate; p is set */
	XDP_PKT_OTHER,	  /* anything else: for TC */
	XDP_PKT_MULTIBUF, /* a frame with fragment pages: for TC */
};

/* xdp_pkt_parse reads the headers of a frame into p, a struct pkt6 when v6
 * (else a struct pkt4), when it is one the XDP program translates: IPv4
 * with a 20-byte header and not a fragment, or IPv6 whose first next header
 * is TCP or UDP (extension headers, fragments among them, are TC's), with
 * its whole TCP or UDP header, no shorter than the IP header says, and
 * linear. A UDP datagram without checksum is one over IPv4 only: IPv6
 * forbids it (pkt6_parse), and the receiver drops it. */
static __always_inline enum xdp_parse xdp_pkt_parse(struct xdp_md *ctx, bool v6, void *p)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 l4_off = v6 ? XDP_L4_OFF6 : XDP_L4_OFF;
	__u8 *l4 = data + l4_off;
	/* Where the bytes that the IP header's length counts begin: the IPv4
	 * header, the IPv6 payload. */
	__u32 counted = v6 ? XDP_L4_OFF6 : XDP_IP_OFF;
	__u32 len, hlen, linear;
	__u8 proto;

	if (v6) {
		struct pkt_ipv6hdr *ip = data + XDP_IP_OFF;

		if ((void *)(ip + 1) > end)
			return XDP_PKT_OTHER;
		if (eth->h_proto != bpf_htons(ETH_P_IPV6) ||
		    (ip->vtc_flow & bpf_htonl(0xf0000000)) != bpf_htonl(0x60000000))
			return XDP_PKT_OTHER;
		proto = ip->nexthdr;
		len = bpf_ntohs(ip->payload_len);
	} else {
		struct iphdr *ip = data + XDP_IP_OFF;

		if ((void *)(ip + 1) > end)
			return XDP_PKT_OTHER;
		if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl != 5)
			return XDP_PKT_OTHER;
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return XDP_PKT_OTHER;
		proto = ip->protocol;
		len = bpf_ntohs(ip->tot_len);
	}
	if (proto == IPPROTO_TCP)
		hlen = sizeof(struct tcphdr);
	else if (proto == IPPROTO_UDP)
		hlen = sizeof(struct udphdr);
	else
		return XDP_PKT_OTHER;
	linear = (__u32)(end - data);
	/* Translation is only of headers, but sending a multi-buffer frame
	 * back out needs the devices' support for it: TC does those. */
	if (bpf_xdp_get_buff_len(ctx) != linear)
		return XDP_PKT_MULTIBUF;
	/* The 6.1 verifier does not bound a byte swap's result. */
	barrier_var(len);
	len &= 0xffff;
	/* Bytes beyond the length are link padding; fewer bytes than it says
	 * is a truncated packet, for the kernel to drop. An IPv6 jumbogram
	 * says 0. */
	if (counted + len < l4_off + hlen || linear < counted + len)
		return XDP_PKT_OTHER;
	if ((void *)(l4 + sizeof(struct udphdr)) > end)
		return XDP_PKT_OTHER;
	PKT_F(p, v6, tcp_flags) = 0;
	if (proto == IPPROTO_TCP) {
		if ((void *)(l4 + sizeof(struct tcphdr)) > end)
			return XDP_PKT_OTHER;
		PKT_F(p, v6, tcp_flags) = l4[13];
		PKT_F(p, v6, csum_off) = l4_off + pkt_offsetof(struct tcphdr, check);
	} else {
		if (v6 && !((struct udphdr *)l4)->check)
			return XDP_PKT_OTHER;
		PKT_F(p, v6, csum_off) = l4_off + pkt_offsetof(struct udphdr, check);
	}
	PKT_F(p, v6, sport) = ((struct udphdr *)l4)->source;
	PKT_F(p, v6, dport) = ((struct udphdr *)l4)->dest;
	PKT_F(p, v6, proto) = proto;
	PKT_F(p, v6, l4_off) = l4_off;
	if (v6) {
		struct pkt_ipv6hdr *ip = data + XDP_IP_OFF;
		struct pkt6 *p6 = p;

		__builtin_memcpy(p6->saddr, ip->saddr, sizeof(p6->saddr));
		__builtin_memcpy(p6->daddr, ip->daddr, sizeof(p6->daddr));
		p6->hop_limit = ip->hop_limit;
		p6->payload_len = len;
	} else {
		struct iphdr *ip = data + XDP_IP_OFF;
		struct pkt4 *p4 = p;

		p4->saddr = ip->saddr;
		p4->daddr = ip->daddr;
		p4->ttl = ip->ttl;
		p4->tos = ip->tos;
		p4->ihl_len = sizeof(struct iphdr);
		p4->tot_len = len;
		p4->fragment = false;
	}
	return XDP_PKT_OK;
}

/* The packet an ICMP or ICMPv6 error quotes: its ports as quoted, and where
 * its headers are, from the frame start; its addresses follow in struct
 * pkt4_inner or struct pkt6_inner, which begin with this. */
struct pkt_inner {
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u32 ip_off;
	__u32 l4_off;
	/* Of the quoted L4 checksum, 0 when the quote ends before it. */
	__u32 l4_check_off;
};

struct pkt4_inner {
	struct pkt_inner q;
	__be32 saddr;
	__be32 daddr;
};

struct pkt6_inner {
	struct pkt_inner q;
	__be32 saddr[4];
	__be32 daddr[4];
};

/* What is said once for both families, as ct.h's CT_E: v6 is a constant at
 * every call and says whether p is a struct pkt6 or a struct pkt4, and in
 * a struct pkt6_inner or a struct pkt4_inner. PKT_F names a field the two
 * packets share; PKT_ADDR and PKT_IN_ADDR an address, as a pointer to its
 * words (one for IPv4, four for IPv6). */
#define PKT_F(p, v6, f)	   (*((v6) ? &((struct pkt6 *)(p))->f : &((struct pkt4 *)(p))->f))
#define PKT_ADDR(p, v6, f) ((v6) ? ((struct pkt6 *)(p))->f : &((struct pkt4 *)(p))->f)
#define PKT_IN_ADDR(in, v6, f)                                                                     \
	((v6) ? ((struct pkt6_inner *)(in))->f : &((struct pkt4_inner *)(in))->f)

static __always_inline bool pkt6_addr_eq(const __be32 *a, const __be32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* pkt_addr_eq says whether two addresses of the family v6 says are equal. */
static __always_inline bool pkt_addr_eq(bool v6, const __be32 *a, const __be32 *b)
{
	return v6 ? pkt6_addr_eq(a, b) : *a == *b;
}

/* pkt_addr_copy copies an address of the family v6 says. */
static __always_inline void pkt_addr_copy(bool v6, __be32 *dst, const __be32 *src)
{
	if (v6)
		__builtin_memcpy(dst, src, 4 * sizeof(__be32));
	else
		*dst = *src;
}

/* pkt_parse_icmp_err reads the packet that an ICMP error p quotes into in,
 * the struct pkt_inner of a struct pkt6_inner when v6 (p a struct pkt6),
 * else of a struct pkt4_inner (p a struct pkt4), when it is a TCP or UDP
 * packet (IPv4: or its first fragment; IPv6: without extension headers)
 * quoted with at least its ports. The errors are ICMP destination
 * unreachable and time exceeded, and ICMPv6 destination unreachable, packet
 * too big, time exceeded and parameter problem. Returns 0 when it is. */
static __always_inline int pkt_parse_icmp_err(struct __sk_buff *skb, bool v6, const void *p,
					      struct pkt_inner *in)
{
	__u32 l4_off = PKT_F(p, v6, l4_off);
	/* Where the message ends: bytes after it are link padding. */
	__u32 end =
		v6 ? ETH_HLEN + sizeof(struct pkt_ipv6hdr) + ((const struct pkt6 *)p)->payload_len
		   : ETH_HLEN + ((const struct pkt4 *)p)->tot_len;
	__u32 ip_off = l4_off + sizeof(struct pkt_icmphdr), ihl;
	struct pkt_icmphdr icmp;
	__be16 ports[2];
	__u8 proto;

	if (end < ip_off + (v6 ? sizeof(struct pkt_ipv6hdr) : sizeof(struct iphdr)) + sizeof(ports))
		return -1;
	if (bpf_skb_load_bytes(skb, l4_off, &icmp, sizeof(icmp)))
		return -1;
	if (v6) {
		struct pkt_ipv6hdr ip;

		if (icmp.type < ICMPV6_DEST_UNREACH || icmp.type > ICMPV6_PARAMPROB)
			return -1;
		if (bpf_skb_load_bytes(skb, ip_off, &ip, sizeof(ip)))
			return -1;
		if ((bpf_ntohl(ip.vtc_flow) >> 28) != 6)
			return -1;
		ihl = sizeof(ip);
		proto = ip.nexthdr;
		__builtin_memcpy(PKT_IN_ADDR(in, v6, saddr), ip.saddr, sizeof(ip.saddr));
		__builtin_memcpy(PKT_IN_ADDR(in, v6, daddr), ip.daddr, sizeof(ip.daddr));
	} else {
		struct iphdr ip;

		if (icmp.type != ICMP_DEST_UNREACH && icmp.type != ICMP_TIME_EXCEEDED)
			return -1;
		if (bpf_skb_load_bytes(skb, ip_off, &ip, sizeof(ip)))
			return -1;
		ihl = ip.ihl * 4;
		if (ip.version != 4 || ihl < sizeof(ip) || (ip.frag_off & bpf_htons(IP_OFFSET)))
			return -1;
		proto = ip.protocol;
		*PKT_IN_ADDR(in, v6, saddr) = ip.saddr;
		*PKT_IN_ADDR(in, v6, daddr) = ip.daddr;
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return -1;
	in->ip_off = ip_off;
	in->l4_off = ip_off + ihl;
	if (end < ip_off + ihl + sizeof(ports))
		return -1;
	if (bpf_skb_load_bytes(skb, ip_off + ihl, ports, sizeof(ports)))
		return -1;
	in->sport = ports[0];
	in->dport = ports[1];
	in->proto = proto;
	in->l4_check_off = ip_off + ihl +
			   (proto == IPPROTO_TCP ? pkt_offsetof(struct tcphdr, check)
						 : pkt_offsetof(struct udphdr, check));
	if (end < in->l4_check_off + sizeof(__sum16))
		in->l4_check_off = 0;
	return 0;
}

#endif /* EBPF_PROXY_PARSE_H */
