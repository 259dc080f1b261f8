/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Address and port translation of a parsed packet (parse.h) with every
 * checksum kept right: of an skb through the kernel's checksum helpers,
 * which also keep a CHECKSUM_COMPLETE skb->csum right; of an ICMP or ICMPv6
 * error and the packet it quotes; and of an XDP buffer, by hand. */
#ifndef EBPF_PROXY_REWRITE_H
#define EBPF_PROXY_REWRITE_H

#include "common.h"
#include "csum.h"
#include "parse.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>

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

/* pkt6_rewrite_addr changes the source (src) or the destination address of
 * p to addr; the checksum at p->csum_off, whose pseudo-header holds it
 * (TCP's, UDP's, ICMPv6's), follows with l4_flags, and so does a
 * CHECKSUM_COMPLETE skb->csum. There is no IP checksum: the address store
 * itself moves skb->csum, and the checksum field's change, which
 * bpf_l4_csum_replace reports to skb->csum for a pseudo-header change,
 * cancels it. */
static __always_inline int pkt6_rewrite_addr(struct __sk_buff *skb, struct pkt6 *p, bool src,
					     const __be32 *addr, __u64 l4_flags)
{
	__u32 addr_off = ETH_HLEN + (src ? pkt_offsetof(struct pkt_ipv6hdr, saddr)
					 : pkt_offsetof(struct pkt_ipv6hdr, daddr));
	__be32 *old_addr = src ? p->saddr : p->daddr;
	__be32 new_addr[4];
	__s64 diff;

	__builtin_memcpy(new_addr, addr, sizeof(new_addr));
	if (pkt6_addr_eq(old_addr, new_addr))
		return 0;
	diff = bpf_csum_diff(old_addr, 16, new_addr, 16, 0);
	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, p->csum_off, 0, (__u32)diff, l4_flags | BPF_F_PSEUDO_HDR))
		return -1;
	if (bpf_skb_store_bytes(skb, addr_off, new_addr, sizeof(new_addr), BPF_F_RECOMPUTE_CSUM))
		return -1;
	__builtin_memcpy(old_addr, new_addr, sizeof(new_addr));
	return 0;
}

/* pkt6_rewrite is pkt4_rewrite for IPv6: one side of the packet (the
 * source when src) becomes (addr, port), the L4 checksum follows (over the
 * IPv6 pseudo-header, pkt6_rewrite_addr) and so does a CHECKSUM_COMPLETE
 * skb->csum. pkt6_parse admits no UDP datagram without checksum; a
 * computed zero is sent as all ones. */
static __always_inline int pkt6_rewrite(struct __sk_buff *skb, struct pkt6 *p, bool src,
					const __be32 *addr, __be16 port)
{
	__u32 port_off = p->l4_off + (src ? 0 : sizeof(__be16));
	__be16 old_port = src ? p->sport : p->dport;
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (pkt6_rewrite_addr(skb, p, src, addr, l4_flags))
		return -1;
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, p->csum_off, old_port, port, l4_flags | sizeof(port)))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0))
			return -1;
		if (src)
			p->sport = port;
		else
			p->dport = port;
	}
	return 0;
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

/* pkt_icmp_rewrite_outer changes the source (src) or destination address of
 * an ICMP error's own IP header (v6: an ICMPv6 error's, p a struct pkt6,
 * whose checksum covers the addresses in its pseudo-header). */
static __always_inline int pkt_icmp_rewrite_outer(struct __sk_buff *skb, bool v6, void *p, bool src,
						  const __be32 *addr)
{
	if (v6)
		return pkt6_rewrite_addr(skb, p, src, addr, 0);
	return pkt4_icmp_rewrite_outer(skb, p, src, *addr);
}

/* pkt_icmp_rewrite_inner changes one side (src) of the packet that an ICMP
 * error quotes (in, from pkt_parse_icmp_err with the same v6) to (addr,
 * port): its IPv4 header checksum and its L4 checksum (when quoted) follow,
 * and the ICMP checksum at icmp_csum follows every byte changed (an ICMPv6
 * checksum covers the quoted addresses as bytes of the message, the outer
 * ones in its pseudo-header: pkt_icmp_rewrite_outer). Each byte change comes
 * with the opposite change of the ICMP checksum, so a CHECKSUM_COMPLETE
 * skb->csum stays as it is. On a CHECKSUM_PARTIAL skb the ICMP checksum is
 * the device's to compute, and the helper leaves it alone, as it should. */
static __always_inline int pkt_icmp_rewrite_inner(struct __sk_buff *skb, bool v6, __u32 icmp_csum,
						  struct pkt_inner *in, bool src,
						  const __be32 *addr, __be16 port)
{
	__u32 ip_off = in->ip_off;
	__u32 check_off = ip_off + pkt_offsetof(struct iphdr, check);
	__u32 addr_off = ip_off + (v6 ? (src ? pkt_offsetof(struct pkt_ipv6hdr, saddr)
					     : pkt_offsetof(struct pkt_ipv6hdr, daddr))
				      : (src ? pkt_offsetof(struct iphdr, saddr)
					     : pkt_offsetof(struct iphdr, daddr)));
	__u32 port_off = in->l4_off + (src ? 0 : sizeof(__be16));
	__u32 l4_check_off = in->l4_check_off;
	__u32 alen = v6 ? 4 * sizeof(__be32) : sizeof(__be32);
	__be32 *old = src ? PKT_IN_ADDR(in, v6, saddr) : PKT_IN_ADDR(in, v6, daddr);
	__be16 *old_port = src ? &in->sport : &in->dport;
	bool addr_changed = !pkt_addr_eq(v6, old, addr);
	__sum16 old_check, new_check;
	__u16 l4_check, l4_new;
	__s64 diff = 0;

	if (addr_changed) {
		diff = bpf_csum_diff(old, alen, (__be32 *)addr, alen, 0);
		if (diff < 0)
			return -1;
	}
	/* The quoted L4 checksum (its pseudo-header holds the addresses) is
	 * kept right for the quoted packet as it now reads. */
	if (l4_check_off && (addr_changed || *old_port != port)) {
		if (bpf_skb_load_bytes(skb, l4_check_off, &l4_check, sizeof(l4_check)))
			return -1;
		if (in->proto == IPPROTO_TCP || l4_check) {
			l4_new = pkt_csum_add(l4_check, diff);
			l4_new = pkt_csum_replace(l4_new, *old_port, port);
			if (in->proto == IPPROTO_UDP && !l4_new)
				l4_new = 0xffff;
			if (bpf_l4_csum_replace(skb, icmp_csum, l4_check, l4_new, sizeof(l4_new)) ||
			    bpf_skb_store_bytes(skb, l4_check_off, &l4_new, sizeof(l4_new), 0))
				return -1;
		}
	}
	if (addr_changed) {
		/* Only IPv4 headers have a checksum. */
		if (!v6 &&
		    (bpf_skb_load_bytes(skb, check_off, &old_check, sizeof(old_check)) ||
		     bpf_l3_csum_replace(skb, check_off, 0, (__u32)diff, 0) ||
		     bpf_skb_load_bytes(skb, check_off, &new_check, sizeof(new_check)) ||
		     bpf_l4_csum_replace(skb, icmp_csum, old_check, new_check, sizeof(new_check))))
			return -1;
		if (bpf_l4_csum_replace(skb, icmp_csum, 0, (__u32)diff, 0) ||
		    bpf_skb_store_bytes(skb, addr_off, addr, alen, 0))
			return -1;
		pkt_addr_copy(v6, old, addr);
	}
	if (*old_port != port) {
		if (bpf_l4_csum_replace(skb, icmp_csum, *old_port, port, sizeof(port)) ||
		    bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0))
			return -1;
		*old_port = port;
	}
	return 0;
}

/* xdp_pkt4_rewrite gives the frame that xdp_pkt4_parse read into p the
 * addresses and ports of n, decrements its TTL, and addresses it to the
 * next hop of fib (a successful lookup): the IP checksum and the TCP or UDP
 * checksum follow (a UDP datagram without checksum keeps none, and a
 * computed zero is sent as all ones). Returns 0, or -1 when the frame is
 * not what p says (then it is unchanged).
 *
 * The checksums are updated in the headers (RFC 1624): an XDP frame carries
 * no skb checksum state. Frames from a wire carry complete checksums; so do
 * those of a veth whose sender computes them (tx checksum offload off),
 * which is what a NIC would deliver. */
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
	old_ttl = pkt4_ttl_word(p->ttl, p->proto);
	new_ttl = pkt4_ttl_word(p->ttl - 1, p->proto);

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

#endif /* EBPF_PROXY_REWRITE_H */
