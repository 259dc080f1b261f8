/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing and rewriting for the XDP program, with direct packet
 * access. The XDP program handles only the simple, common frames (IPv4
 * without options, TCP or UDP, not a fragment, headers in the linear part,
 * no fragment pages) and leaves the rest to the TC programs, so the headers
 * sit at fixed offsets.
 *
 * Checksums are updated incrementally (RFC 1624) in the headers: an XDP
 * frame carries no skb checksum state. Frames from a wire carry complete
 * checksums; so do those of a veth whose sender computes them (tx checksum
 * offload off), which is what a NIC would deliver. */
#ifndef EBPF_PROXY_XDP_PKT_H
#define EBPF_PROXY_XDP_PKT_H

#include "pkt.h"

/* Where the headers are: Ethernet, then a 20-byte IPv4 header. */
#define XDP_IP_OFF ETH_HLEN
#define XDP_L4_OFF (ETH_HLEN + sizeof(struct iphdr))

/* What xdp_pkt4_parse found. */
enum xdp_parse {
	XDP_PKT_OK,	  /* a frame xdp.c may translate; p is set */
	XDP_PKT_OTHER,	  /* anything else: for TC */
	XDP_PKT_MULTIBUF, /* a frame with fragment pages: for TC */
};

/* xdp_pkt4_parse reads the headers of a frame into p when it is one the
 * XDP program translates: IPv4 with a 20-byte header, not a fragment, TCP
 * or UDP with its whole header, no shorter than its total length says, and
 * linear. */
static __always_inline enum xdp_parse xdp_pkt4_parse(struct xdp_md *ctx, struct pkt4 *p)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + XDP_IP_OFF;
	__u32 tot_len, hlen, linear;
	__u8 *l4 = data + XDP_L4_OFF;

	if ((void *)(ip + 1) > end)
		return XDP_PKT_OTHER;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl != 5)
		return XDP_PKT_OTHER;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return XDP_PKT_OTHER;
	if (ip->protocol == IPPROTO_TCP) {
		hlen = sizeof(struct tcphdr);
		p->csum_off = XDP_L4_OFF + pkt_offsetof(struct tcphdr, check);
	} else if (ip->protocol == IPPROTO_UDP) {
		hlen = sizeof(struct udphdr);
		p->csum_off = XDP_L4_OFF + pkt_offsetof(struct udphdr, check);
	} else {
		return XDP_PKT_OTHER;
	}
	linear = (__u32)(end - data);
	/* Translation is only of headers, but sending a multi-buffer frame
	 * back out needs the devices' support for it: TC does those. */
	if (bpf_xdp_get_buff_len(ctx) != linear)
		return XDP_PKT_MULTIBUF;
	tot_len = bpf_ntohs(ip->tot_len);
	barrier_var(tot_len);
	tot_len &= 0xffff;
	/* Bytes beyond the total length are link padding; fewer bytes than
	 * it says is a truncated packet, for the kernel to drop. */
	if (tot_len < sizeof(struct iphdr) + hlen || linear < ETH_HLEN + tot_len)
		return XDP_PKT_OTHER;
	if ((void *)(l4 + sizeof(struct udphdr)) > end)
		return XDP_PKT_OTHER;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->proto = ip->protocol;
	p->ttl = ip->ttl;
	p->tos = ip->tos;
	p->ihl_len = sizeof(struct iphdr);
	p->tot_len = tot_len;
	p->l4_off = XDP_L4_OFF;
	p->fragment = false;
	p->sport = ((struct udphdr *)l4)->source;
	p->dport = ((struct udphdr *)l4)->dest;
	p->tcp_flags = 0;
	if (p->proto == IPPROTO_TCP) {
		if ((void *)(l4 + sizeof(struct tcphdr)) > end)
			return XDP_PKT_OTHER;
		p->tcp_flags = l4[13];
	}
	return XDP_PKT_OK;
}

/* xdp_pkt4_rewrite gives the frame that xdp_pkt4_parse read into p the
 * addresses and ports of n, decrements its TTL, and addresses it to the
 * next hop of fib (a successful lookup): the IP checksum and the TCP or UDP
 * checksum follow (a UDP datagram without checksum keeps none, and a
 * computed zero is sent as all ones). Returns 0, or -1 when the frame is
 * not what p says (then it is unchanged). */
static __always_inline int xdp_pkt4_rewrite(struct xdp_md *ctx, const struct pkt4 *p,
					    const struct pkt4 *n, const struct bpf_fib_lookup *fib)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + XDP_IP_OFF;
	__be16 *ports = data + XDP_L4_OFF;
	__sum16 *l4_check;
	__u32 old_ports, new_ports;
	__u16 check;
	__be16 old_ttl, new_ttl;

	if ((void *)(ports + 2) > end)
		return -1;
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = (void *)ports;

		if ((void *)(th + 1) > end)
			return -1;
		l4_check = &th->check;
	} else {
		struct udphdr *uh = (void *)ports;

		if ((void *)(uh + 1) > end)
			return -1;
		l4_check = &uh->check;
	}
	old_ports = ((__u32)p->dport << 16) | p->sport;
	new_ports = ((__u32)n->dport << 16) | n->sport;
	/* The TTL shares a 16-bit word with the protocol for the checksum. */
	old_ttl = bpf_htons(((__u16)p->ttl << 8) | p->proto);
	new_ttl = bpf_htons(((__u16)(p->ttl - 1) << 8) | p->proto);

	check = pkt_csum_replace(ip->check, p->saddr, n->saddr);
	check = pkt_csum_replace(check, p->daddr, n->daddr);
	ip->check = pkt_csum_replace(check, old_ttl, new_ttl);
	check = *l4_check;
	if (p->proto == IPPROTO_TCP || check) {
		/* The pseudo-header holds the addresses. */
		check = pkt_csum_replace(check, p->saddr, n->saddr);
		check = pkt_csum_replace(check, p->daddr, n->daddr);
		check = pkt_csum_replace(check, old_ports, new_ports);
		if (p->proto == IPPROTO_UDP && !check)
			check = 0xffff;
		*l4_check = check;
	}
	ip->saddr = n->saddr;
	ip->daddr = n->daddr;
	ip->ttl = p->ttl - 1;
	ports[0] = n->sport;
	ports[1] = n->dport;
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	return 0;
}

#endif /* EBPF_PROXY_XDP_PKT_H */
