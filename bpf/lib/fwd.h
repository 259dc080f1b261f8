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

/* pkt4_forward sends a translated packet out of the device the FIB chooses
 * for its new destination, bypassing the kernel's input path: a packet whose
 * source is now a node address would be a martian there. It decrements the
 * TTL as a router does. No tot_len is given to the lookup, so that the
 * kernel checks the MTU against the skb, which lets GRO packets through as
 * its forwarding path does. Returns the TC verdict, and sets *no_route when it
 * drops the packet for want of a route or TTL, for the caller to count.
 *
 * e, when not NULL, is the map entry of the flow whose tuple p now has: the
 * next hop it keeps from a lookup of the same second serves instead of a
 * new lookup (ct_fib_get; not for GSO packets, whose MTU check is the
 * kernel's per segment), and a new lookup's result is kept there. */
static __always_inline int pkt4_forward(struct __sk_buff *skb, const struct pkt4 *p, void *e,
					__u32 now, bool *no_route)
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
	bool cache;
	long ret;

	if (p->ttl <= 1) {
		*no_route = true;
		return TC_ACT_SHOT;
	}
	cache = e && skb->gso_segs <= 1;
	if (cache && ct_fib_get(e, false, now, p->tot_len, &fib)) {
		ret = BPF_FIB_LKUP_RET_SUCCESS;
	} else {
		ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
		if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) {
			*no_route = true;
			return TC_ACT_SHOT;
		}
		if (cache && ret == BPF_FIB_LKUP_RET_SUCCESS)
			ct_fib_put(e, false, now, p->tot_len, &fib);
	}
	old_ttl = pkt4_ttl_word(p->ttl, p->proto);
	new_ttl = pkt4_ttl_word(p->ttl - 1, p->proto);
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

/* pkt6_forward is pkt4_forward for IPv6: the hop limit is decremented
 * (no header checksum; skb->csum follows the store). */
static __always_inline int pkt6_forward(struct __sk_buff *skb, const struct pkt6 *p, void *e,
					__u32 now, bool *no_route)
{
	struct bpf_fib_lookup fib = {
		.family = PKT_AF_INET6,
		.l4_protocol = p->proto,
		.sport = p->sport,
		.dport = p->dport,
		.ifindex = skb->ifindex,
	};
	/* The next header and the hop limit, one 16-bit word. */
	__u8 word[2] = { p->proto, p->hop_limit - 1 };
	bool cache;
	__u32 len;
	long ret;

	if (p->hop_limit <= 1) {
		*no_route = true;
		return TC_ACT_SHOT;
	}
	__builtin_memcpy(fib.ipv6_src, p->saddr, sizeof(fib.ipv6_src));
	__builtin_memcpy(fib.ipv6_dst, p->daddr, sizeof(fib.ipv6_dst));
	len = sizeof(struct pkt_ipv6hdr) + p->payload_len;
	cache = e && skb->gso_segs <= 1;
	if (cache && ct_fib_get(e, true, now, len, &fib)) {
		ret = BPF_FIB_LKUP_RET_SUCCESS;
	} else {
		ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
		if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) {
			*no_route = true;
			return TC_ACT_SHOT;
		}
		if (cache && ret == BPF_FIB_LKUP_RET_SUCCESS)
			ct_fib_put(e, true, now, len, &fib);
	}
	if (bpf_skb_store_bytes(skb, ETH_HLEN + pkt_offsetof(struct pkt_ipv6hdr, nexthdr), word,
				sizeof(word), BPF_F_RECOMPUTE_CSUM))
		return TC_ACT_SHOT;
	if (ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(fib.ifindex, 0);
}

#endif /* EBPF_PROXY_FWD_H */
