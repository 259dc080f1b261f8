/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Reading IPv4 TCP and UDP headers into struct pkt4, which every other
 * packet header takes: from skbs through bpf_skb_load_bytes (so that paged
 * skbs need no pull), from XDP buffers with direct packet access, and the
 * packet that an ICMP error quotes. The wire definitions the vendored UAPI
 * headers lack are here too. */
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
 * complete IPv6 packet whose first next header is TCP or UDP is PKT_OK;
 * everything else is PKT_OTHER, which the programs pass untouched: packets
 * with extension headers (fragments among them: their ports may be in
 * another fragment), ICMPv6 (neighbour discovery and errors), jumbograms,
 * truncated packets, and UDP without checksum, which IPv6 forbids (RFC
 * 8200 8.1): the receiver drops it as it would without us. */
static __always_inline enum pkt_parse pkt6_parse(struct __sk_buff *skb, struct pkt6 *p)
{
	struct pkt_ipv6hdr ip;
	__u32 plen, hlen;
	__be16 hdr[4];

	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return PKT_OTHER;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
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
	} else {
		return PKT_OTHER;
	}
	/* Bytes beyond the payload length are link padding; fewer is a
	 * truncated packet. A jumbogram says 0. */
	if (plen < hlen || skb->len < ETH_HLEN + sizeof(ip) + plen)
		return PKT_OTHER;
	p->l4_off = ETH_HLEN + sizeof(ip);
	p->csum_off += p->l4_off;
	if (bpf_skb_load_bytes(skb, p->l4_off, hdr, sizeof(hdr)))
		return PKT_OTHER;
	p->tcp_flags = 0;
	if (ip.nexthdr == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, p->l4_off + 13, &p->tcp_flags, sizeof(p->tcp_flags)))
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
#define XDP_L4_OFF  (ETH_HLEN + sizeof(struct iphdr))
#define XDP_L4_OFF6 (ETH_HLEN + sizeof(struct pkt_ipv6hdr))

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

#endif /* EBPF_PROXY_PARSE_H */
