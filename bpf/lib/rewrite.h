/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Address and port translation of a parsed packet (parse.h) with every
 * checksum kept right: of an skb in place or through the kernel's helpers,
 * keeping a CHECKSUM_COMPLETE skb->csum right too; of an ICMP or ICMPv6
 * error and the packet it quotes; and of an XDP buffer, by hand. */
#ifndef EBPF_PROXY_REWRITE_H
#define EBPF_PROXY_REWRITE_H

#include "common.h"
#include "csum.h"
#include "parse.h"
#include "structs.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>

/* pkt4_csum_flags sets the flags of p's L4 checksum changes and of its
 * port stores. A UDP datagram without checksum keeps none (RFC 768), and a
 * computed zero is sent as all ones. Without a checksum field to cancel the
 * port change in, skb->csum must follow the store itself. Returns 0 or a
 * negative error. */
static __always_inline int pkt4_csum_flags(struct __sk_buff *skb, const struct pkt4 *p,
					   __u64 *l4_flags, __u64 *port_flags)
{
	*l4_flags = 0;
	*port_flags = 0;
	if (p->proto != IPPROTO_UDP)
		return 0;
	*l4_flags = BPF_F_MARK_MANGLED_0;
	if (!p->udp_csum)
		*port_flags = BPF_F_RECOMPUTE_CSUM;
	return 0;
}

/* The stores of a rewrite are made in place when direct and the headers
 * are in the linear part (pkt_skb_at), else through the helpers; either
 * way a CHECKSUM_COMPLETE skb->csum stays right. The L4 checksum always
 * changes through bpf_l4_csum_replace: only the kernel knows whether it is
 * a CHECKSUM_PARTIAL skb's pseudo-header sum, which a port change leaves
 * alone. */

/* pkt4_store_addrs writes n (1 or 2) consecutive addresses at off of the IP
 * header, and its checksum for the change diff (pkt_csum_diff_n). The
 * header's sum stays the same, so skb->csum does too. */
static __always_inline int pkt4_store_addrs(struct __sk_buff *skb, bool direct, __u32 off,
					    const __be32 *addrs, const int n, __u32 diff)
{
	if (direct) {
		struct iphdr *ip = pkt_skb_at(skb, ETH_HLEN, sizeof(*ip));

		if (ip) {
			__be32 *at = (void *)ip + off;

			ip->check = pkt_csum_add(ip->check, diff);
			at[0] = addrs[0];
			if (n == 2)
				at[1] = addrs[1];
			return 0;
		}
	}
	if (bpf_l3_csum_replace(skb, ETH_HLEN + pkt_offsetof(struct iphdr, check), 0, diff, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + off, addrs, n * sizeof(__be32), 0))
		return -1;
	return 0;
}

/* pkt6_store_addrs writes n (4 or 8) words of addresses at off of the IPv6
 * header, whose sum changes by diff: skb->csum follows (the L4 checksum's
 * pseudo-header change, which bpf_l4_csum_replace reports, cancels it). */
static __always_inline int pkt6_store_addrs(struct __sk_buff *skb, bool direct, __u32 off,
					    const __be32 *addrs, const int n, __u32 diff)
{
	if (direct) {
		struct pkt_ipv6hdr *ip = pkt_skb_at(skb, ETH_HLEN, sizeof(*ip));

		if (ip) {
			__builtin_memcpy((void *)ip + off, addrs, n * sizeof(__be32));
			bpf_csum_update(skb, diff);
			return 0;
		}
	}
	if (bpf_skb_store_bytes(skb, ETH_HLEN + off, addrs, n * sizeof(__be32),
				BPF_F_RECOMPUTE_CSUM))
		return -1;
	return 0;
}

/* pkt_store_ports writes n (1 or 2) port fields at first (0: the source
 * port, 2: the destination's) of the L4 header at l4_off (from the frame
 * start). In place only when the header is at usual, the family's offset
 * without IP options: a constant offset, which every kernel's verifier
 * bounds. Their change is cancelled in skb->csum by the L4 checksum's,
 * except for a UDP datagram without checksum (recompute), where skb->csum
 * follows the change diff. */
static __always_inline int pkt_store_ports(struct __sk_buff *skb, bool direct, __u32 l4_off,
					   const __u32 usual, const __u32 first,
					   const __be16 *ports, const int n, bool recompute,
					   __u32 diff)
{
	if (direct && l4_off == usual) {
		__be16 *at = pkt_skb_at(skb, usual + first, n * sizeof(__be16));

		if (at) {
			at[0] = ports[0];
			if (n == 2)
				at[1] = ports[1];
			if (recompute)
				bpf_csum_update(skb, diff);
			return 0;
		}
	}
	if (bpf_skb_store_bytes(skb, l4_off + first, ports, n * sizeof(__be16),
				recompute ? BPF_F_RECOMPUTE_CSUM : 0))
		return -1;
	return 0;
}

/* pkt4_rewrite changes one side of the packet (the source when src, else
 * the destination) from (p's address, p's port) to (addr, port), keeping the
 * IP and L4 checksums and a CHECKSUM_COMPLETE skb->csum right, and updates p.
 * Returns 0 or a negative error (the packet may then be half rewritten and
 * must be dropped). */
static __always_inline int pkt4_rewrite(struct __sk_buff *skb, bool direct, struct pkt4 *p,
					bool src, __be32 addr, __be16 port)
{
	__u32 addr_off =
		src ? pkt_offsetof(struct iphdr, saddr) : pkt_offsetof(struct iphdr, daddr);
	__u32 first = src ? 0 : sizeof(__be16);
	__be32 old_addr = src ? p->saddr : p->daddr;
	__be16 old_port = src ? p->sport : p->dport;
	__u64 l4_flags, port_flags;

	if (pkt4_csum_flags(skb, p, &l4_flags, &port_flags))
		return -1;
	if (old_addr != addr) {
		__u32 diff = pkt_csum_diff_n(&old_addr, &addr, 1);

		if (pkt4_store_addrs(skb, direct, addr_off, &addr, 1, diff) ||
		    bpf_l4_csum_replace(skb, p->csum_off, 0, diff, l4_flags | BPF_F_PSEUDO_HDR))
			return -1;
	}
	if (old_port != port) {
		if (pkt_store_ports(skb, direct, p->l4_off, PKT4_L4_OFF, first, &port, 1,
				    port_flags, pkt_csum_diff16(old_port, port)) ||
		    bpf_l4_csum_replace(skb, p->csum_off, old_port, port, l4_flags | sizeof(port)))
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

/* pkt4_rewrite_both is pkt4_rewrite for both sides at once, as a source-NATed
 * flow's packets need: the two addresses are one store and one change of
 * each checksum, and so are the two ports. */
static __always_inline int pkt4_rewrite_both(struct __sk_buff *skb, bool direct, struct pkt4 *p,
					     __be32 saddr, __be16 sport, __be32 daddr, __be16 dport)
{
	__be32 old_addrs[2] = { p->saddr, p->daddr }, addrs[2] = { saddr, daddr };
	__be16 old_ports[2] = { p->sport, p->dport }, ports[2] = { sport, dport };
	__u32 addr_diff = pkt_csum_diff_n(old_addrs, addrs, 2);
	__u32 port_diff =
		pkt_csum_diff16(old_ports[0], ports[0]) + pkt_csum_diff16(old_ports[1], ports[1]);
	__u64 l4_flags, port_flags;

	if (pkt4_csum_flags(skb, p, &l4_flags, &port_flags))
		return -1;
	if (pkt4_store_addrs(skb, direct, pkt_offsetof(struct iphdr, saddr), addrs, 2, addr_diff) ||
	    pkt_store_ports(skb, direct, p->l4_off, PKT4_L4_OFF, 0, ports, 2, port_flags,
			    port_diff) ||
	    bpf_l4_csum_replace(skb, p->csum_off, 0, addr_diff, l4_flags | BPF_F_PSEUDO_HDR) ||
	    bpf_l4_csum_replace(skb, p->csum_off, 0, port_diff, l4_flags))
		return -1;
	p->saddr = saddr;
	p->daddr = daddr;
	p->sport = sport;
	p->dport = dport;
	return 0;
}

/* pkt6_rewrite_addr changes the source (src) or the destination address of
 * p to addr; the checksum at p->csum_off, whose pseudo-header holds it
 * (TCP's, UDP's, ICMPv6's), follows with l4_flags, and so does a
 * CHECKSUM_COMPLETE skb->csum (pkt6_store_addrs). */
static __always_inline int pkt6_rewrite_addr(struct __sk_buff *skb, bool direct, struct pkt6 *p,
					     bool src, const __be32 *addr, __u64 l4_flags)
{
	__u32 addr_off = src ? pkt_offsetof(struct pkt_ipv6hdr, saddr)
			     : pkt_offsetof(struct pkt_ipv6hdr, daddr);
	__be32 *old_addr = src ? p->saddr : p->daddr;
	__be32 new_addr[4];
	__u32 diff;

	__builtin_memcpy(new_addr, addr, sizeof(new_addr));
	if (pkt6_addr_eq(old_addr, new_addr))
		return 0;
	diff = pkt_csum_diff_n(old_addr, new_addr, 4);
	if (bpf_l4_csum_replace(skb, p->csum_off, 0, diff, l4_flags | BPF_F_PSEUDO_HDR) ||
	    pkt6_store_addrs(skb, direct, addr_off, new_addr, 4, diff))
		return -1;
	__builtin_memcpy(old_addr, new_addr, sizeof(new_addr));
	return 0;
}

/* pkt6_rewrite is pkt4_rewrite for IPv6: one side of the packet (the
 * source when src) becomes (addr, port), the L4 checksum follows (over the
 * IPv6 pseudo-header, pkt6_rewrite_addr) and so does a CHECKSUM_COMPLETE
 * skb->csum. pkt6_parse admits no UDP datagram without checksum; a
 * computed zero is sent as all ones. */
static __always_inline int pkt6_rewrite(struct __sk_buff *skb, bool direct, struct pkt6 *p,
					bool src, const __be32 *addr, __be16 port)
{
	__u32 first = src ? 0 : sizeof(__be16);
	__be16 old_port = src ? p->sport : p->dport;
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (pkt6_rewrite_addr(skb, direct, p, src, addr, l4_flags))
		return -1;
	if (old_port != port) {
		if (pkt_store_ports(skb, direct, p->l4_off, PKT6_L4_OFF, first, &port, 1, false,
				    0) ||
		    bpf_l4_csum_replace(skb, p->csum_off, old_port, port, l4_flags | sizeof(port)))
			return -1;
		if (src)
			p->sport = port;
		else
			p->dport = port;
	}
	return 0;
}

/* pkt6_rewrite_both is pkt6_rewrite for both sides at once: the two
 * addresses, 32 bytes in a row, are one store and one change of the L4
 * checksum, and so are the two ports. */
static __always_inline int pkt6_rewrite_both(struct __sk_buff *skb, bool direct, struct pkt6 *p,
					     const __be32 *saddr, __be16 sport, const __be32 *daddr,
					     __be16 dport)
{
	__be32 old_addrs[8], addrs[8];
	__be16 old_ports[2] = { p->sport, p->dport }, ports[2] = { sport, dport };
	__u64 l4_flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u32 addr_diff, port_diff;

	__builtin_memcpy(old_addrs, p->saddr, 16);
	__builtin_memcpy(old_addrs + 4, p->daddr, 16);
	__builtin_memcpy(addrs, saddr, 16);
	__builtin_memcpy(addrs + 4, daddr, 16);
	addr_diff = pkt_csum_diff_n(old_addrs, addrs, 8);
	port_diff =
		pkt_csum_diff16(old_ports[0], ports[0]) + pkt_csum_diff16(old_ports[1], ports[1]);
	if (pkt6_store_addrs(skb, direct, pkt_offsetof(struct pkt_ipv6hdr, saddr), addrs, 8,
			     addr_diff) ||
	    pkt_store_ports(skb, direct, p->l4_off, PKT6_L4_OFF, 0, ports, 2, false, 0) ||
	    bpf_l4_csum_replace(skb, p->csum_off, 0, addr_diff, l4_flags | BPF_F_PSEUDO_HDR) ||
	    bpf_l4_csum_replace(skb, p->csum_off, 0, port_diff, l4_flags))
		return -1;
	__builtin_memcpy(p->saddr, saddr, 16);
	__builtin_memcpy(p->daddr, daddr, 16);
	p->sport = sport;
	p->dport = dport;
	return 0;
}

/* pkt4_icmp_rewrite_outer changes the source (src) or destination address of
 * an ICMP message's own IP header; ICMP has no pseudo-header. */
static __always_inline int pkt4_icmp_rewrite_outer(struct __sk_buff *skb, struct pkt4 *p, bool src,
						   __be32 addr)
{
	__be32 old = src ? p->saddr : p->daddr;
	__u32 off = src ? pkt_offsetof(struct iphdr, saddr) : pkt_offsetof(struct iphdr, daddr);

	if (old == addr)
		return 0;
	if (pkt4_store_addrs(skb, false, off, &addr, 1, pkt_csum_diff_n(&old, &addr, 1)))
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
		return pkt6_rewrite_addr(skb, false, p, src, addr, 0);
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

/* xdp_pkt_rewrite gives the frame that xdp_pkt_parse read into p (a
 * struct pkt6 when v6, else a struct pkt4) the addresses and ports of its
 * flow's entry e (a struct ct6_entry or a struct ct4_entry: nat_saddr,
 * nat_sport to nat_daddr, nat_dport), decrements its TTL or hop limit, and
 * addresses it to the next hop of fib (a successful lookup): the IPv4
 * checksum and the TCP or UDP checksum follow (an IPv4 UDP datagram without
 * checksum keeps none, and a computed zero is sent as all ones). Returns 0,
 * or -1 when the frame is not what p says (then it is unchanged).
 *
 * The checksums are updated in the headers (RFC 1624): an XDP frame carries
 * no skb checksum state. Frames from a wire carry complete checksums; so do
 * those of a veth whose sender computes them (tx checksum offload off),
 * which is what a NIC would deliver. */
static __always_inline int xdp_pkt_rewrite(struct xdp_md *ctx, bool v6, const void *p,
					   const void *e, const struct bpf_fib_lookup *fib)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__be16 *ports = data + (v6 ? XDP_L4_OFF6 : XDP_L4_OFF);
	__u8 proto = PKT_F(p, v6, proto);
	__be16 sport = v6 ? ((const struct ct6_entry *)e)->nat_sport
			  : ((const struct ct4_entry *)e)->nat_sport;
	__be16 dport = v6 ? ((const struct ct6_entry *)e)->nat_dport
			  : ((const struct ct4_entry *)e)->nat_dport;
	__sum16 *l4_check;
	__u32 old_ports, new_ports;
	__u16 check;
	bool l4_sum;

	if ((void *)(ports + 2) > end)
		return -1;
	if (proto == IPPROTO_TCP) {
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
	old_ports = ((__u32)PKT_F(p, v6, dport) << 16) | PKT_F(p, v6, sport);
	new_ports = ((__u32)dport << 16) | sport;
	check = *l4_check;
	/* The pseudo-header holds the addresses. An IPv4 UDP datagram
	 * without checksum keeps none; xdp_pkt_parse admits no IPv6 one. */
	l4_sum = proto == IPPROTO_TCP || check;
	if (v6) {
		const struct pkt6 *p6 = p;
		const struct ct6_entry *e6 = e;
		struct pkt_ipv6hdr *ip = data + XDP_IP_OFF;

		if ((void *)(ip + 1) > end)
			return -1;
		if (l4_sum) {
			check = pkt_csum_replace_n(check, p6->saddr, e6->nat_saddr, 4);
			check = pkt_csum_replace_n(check, p6->daddr, e6->nat_daddr, 4);
		}
		__builtin_memcpy(ip->saddr, e6->nat_saddr, sizeof(ip->saddr));
		__builtin_memcpy(ip->daddr, e6->nat_daddr, sizeof(ip->daddr));
		ip->hop_limit = p6->hop_limit - 1;
	} else {
		const struct pkt4 *p4 = p;
		const struct ct4_entry *e4 = e;
		struct iphdr *ip = data + XDP_IP_OFF;
		__be16 old_ttl, new_ttl;
		__u16 ip_check;

		if ((void *)(ip + 1) > end)
			return -1;
		old_ttl = pkt4_ttl_word(p4->ttl, proto);
		new_ttl = pkt4_ttl_word(p4->ttl - 1, proto);
		ip_check = pkt_csum_replace(ip->check, p4->saddr, e4->nat_saddr);
		ip_check = pkt_csum_replace(ip_check, p4->daddr, e4->nat_daddr);
		ip->check = pkt_csum_replace(ip_check, old_ttl, new_ttl);
		if (l4_sum) {
			check = pkt_csum_replace(check, p4->saddr, e4->nat_saddr);
			check = pkt_csum_replace(check, p4->daddr, e4->nat_daddr);
		}
		ip->saddr = e4->nat_saddr;
		ip->daddr = e4->nat_daddr;
		ip->ttl = p4->ttl - 1;
	}
	if (l4_sum) {
		check = pkt_csum_replace(check, old_ports, new_ports);
		if (proto == IPPROTO_UDP && !check)
			check = 0xffff;
		*l4_check = check;
	}
	ports[0] = sport;
	ports[1] = dport;
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	return 0;
}

#endif /* EBPF_PROXY_REWRITE_H */
