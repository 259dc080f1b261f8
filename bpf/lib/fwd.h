/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sending a translated skb on by a FIB lookup, as a router would. */
#ifndef EBPF_PROXY_FWD_H
#define EBPF_PROXY_FWD_H

#include "common.h"
#include "csum.h"
#include "ct.h"
#include "parse.h"
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>

/* fwd_fib_lookup is bpf_fib_lookup for a packet of len bytes (IP length)
 * whose flow's map entry is e, or NULL: the next hop e keeps from a lookup
 * of the same second serves instead (ct_fib_get; never for GSO packets,
 * whose MTU the kernel checks per segment), and a successful lookup's is
 * kept there. */
static __always_inline long fwd_fib_lookup(struct __sk_buff *skb, bool v6, void *e, __u32 now,
					   __u32 len, struct bpf_fib_lookup *fib)
{
	bool cache = e && skb->gso_segs <= 1;
	long ret;

	if (cache && ct_fib_get(e, v6, now, len, fib))
		return BPF_FIB_LKUP_RET_SUCCESS;
	ret = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	if (cache && ret == BPF_FIB_LKUP_RET_SUCCESS)
		ct_fib_put(e, v6, now, len, fib);
	return ret;
}

/* fwd_store_macs writes the Ethernet addresses the FIB found for the next
 * hop, destination and source: in place when direct (rewrite.h), else in
 * one store. */
static __always_inline long fwd_store_macs(struct __sk_buff *skb, bool direct,
					   const struct bpf_fib_lookup *fib)
{
	__u8 macs[2 * ETH_ALEN];

	if (direct) {
		struct ethhdr *eth = pkt_skb_at(skb, 0, sizeof(*eth));

		if (eth) {
			__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
			__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
			return 0;
		}
	}
	__builtin_memcpy(macs, fib->dmac, ETH_ALEN);
	__builtin_memcpy(macs + ETH_ALEN, fib->smac, ETH_ALEN);
	return bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0);
}

/* pkt4_store_ttl decrements p's TTL, and the IP checksum with it. */
static __always_inline int pkt4_store_ttl(struct __sk_buff *skb, bool direct, const struct pkt4 *p)
{
	__be16 old_ttl = pkt4_ttl_word(p->ttl, p->proto),
	       new_ttl = pkt4_ttl_word(p->ttl - 1, p->proto);
	__u8 ttl = p->ttl - 1;

	if (direct) {
		struct iphdr *ip = pkt_skb_at(skb, ETH_HLEN, sizeof(*ip));

		if (ip) {
			ip->check = pkt_csum_replace(ip->check, old_ttl, new_ttl);
			ip->ttl = ttl;
			return 0;
		}
	}
	if (bpf_l3_csum_replace(skb, ETH_HLEN + pkt_offsetof(struct iphdr, check), old_ttl, new_ttl,
				sizeof(new_ttl)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + pkt_offsetof(struct iphdr, ttl), &ttl, sizeof(ttl),
				0))
		return -1;
	return 0;
}

/* pkt6_store_hop_limit decrements p's hop limit: no header checksum, and
 * skb->csum follows the change. pkt6_parse admits no extension header, so
 * the next header is p's protocol: the two are one 16-bit word. */
static __always_inline int pkt6_store_hop_limit(struct __sk_buff *skb, bool direct,
						const struct pkt6 *p)
{
	__u8 old_word[2] = { p->proto, p->hop_limit }, new_word[2] = { p->proto, p->hop_limit - 1 };

	if (direct) {
		struct pkt_ipv6hdr *ip = pkt_skb_at(skb, ETH_HLEN, sizeof(*ip));

		if (ip) {
			__be16 from, to;

			__builtin_memcpy(&from, old_word, sizeof(from));
			__builtin_memcpy(&to, new_word, sizeof(to));
			ip->hop_limit = new_word[1];
			bpf_csum_update(skb, pkt_csum_diff16(from, to));
			return 0;
		}
	}
	if (bpf_skb_store_bytes(skb, ETH_HLEN + pkt_offsetof(struct pkt_ipv6hdr, nexthdr), new_word,
				sizeof(new_word), BPF_F_RECOMPUTE_CSUM))
		return -1;
	return 0;
}

/* pkt_forward sends a translated packet p of family v6 out of the device
 * the FIB chooses for its new destination, bypassing the kernel's input
 * path: a packet whose source is now a node address would be a martian
 * there. It decrements the TTL or hop limit as a router does. No length is
 * given to the lookup for IPv4, so that the kernel checks the MTU against
 * the skb, which lets GRO packets through as its forwarding path does.
 * Returns the TC verdict, and sets *no_route when it drops the packet for
 * want of a route or TTL, for the caller to count.
 *
 * e, when not NULL, is the map entry of the flow whose tuple p now has,
 * which keeps the flow's next hop (fwd_fib_lookup); direct lets it store
 * in place (rewrite.h). v6 is a constant at every call. */
static __always_inline int pkt_forward(struct __sk_buff *skb, bool direct, bool v6, const void *p,
				       void *e, __u32 now, bool *no_route)
{
	const struct pkt4 *p4 = p;
	const struct pkt6 *p6 = p;
	struct bpf_fib_lookup fib = {
		.ifindex = skb->ifindex,
	};
	long ret;

	if ((v6 ? p6->hop_limit : p4->ttl) <= 1) {
		*no_route = true;
		return TC_ACT_SHOT;
	}
	if (v6) {
		fib.family = PKT_AF_INET6;
		fib.l4_protocol = p6->proto;
		fib.sport = p6->sport;
		fib.dport = p6->dport;
		__builtin_memcpy(fib.ipv6_src, p6->saddr, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, p6->daddr, sizeof(fib.ipv6_dst));
		ret = fwd_fib_lookup(skb, true, e, now,
				     sizeof(struct pkt_ipv6hdr) + p6->payload_len, &fib);
	} else {
		fib.family = PKT_AF_INET;
		fib.tos = p4->tos;
		fib.l4_protocol = p4->proto;
		fib.sport = p4->sport;
		fib.dport = p4->dport;
		fib.ipv4_src = p4->saddr;
		fib.ipv4_dst = p4->daddr;
		ret = fwd_fib_lookup(skb, false, e, now, p4->tot_len, &fib);
	}
	if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) {
		*no_route = true;
		return TC_ACT_SHOT;
	}
	if (v6 ? pkt6_store_hop_limit(skb, direct, p6) : pkt4_store_ttl(skb, direct, p4))
		return TC_ACT_SHOT;
	if (ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	if (fwd_store_macs(skb, direct, &fib))
		return TC_ACT_SHOT;
	return bpf_redirect(fib.ifindex, 0);
}

#endif /* EBPF_PROXY_FWD_H */
