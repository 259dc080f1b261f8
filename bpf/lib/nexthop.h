/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The next hop of a new flow from an earlier flow to the same backend
 * (tc4_nexthop_v1, tc6_nexthop_v1): a new flow's FIB lookup is the most
 * expensive step of its first packet (about 200 ns over IPv4 and 450 over
 * IPv6 on 6.18), and the new flows of a NodePort ask the same question
 * again and again: a load balancer's health checks and its few source
 * addresses in front of many users, or many clients to a few backends.
 *
 * A next hop found in one second serves the new flows of that second
 * only, by the rule a flow's own next hop follows (ct.h ct_fib_get): a
 * route or neighbour change reaches new flows within a second, and a
 * packet longer than the lookup let through is looked up, so that the MTU
 * is still checked. The key holds everything the lookup is given but the
 * client's port, which changes the route only under a multipath hash over
 * ports or a routing rule on the source port: where the agent sees either,
 * it turns sharing off for the family (tc_nexthop_share_v1) and every new
 * flow is looked up as before. Where, besides, the client's address cannot
 * change the route either (no routing rule on source addresses, no
 * multipath route, whose hash takes them, no IPv6 route by source), the
 * agent lets every client's flows share (NH_SHARE_ALL): the key then holds
 * the unspecified address in the client's place.
 *
 * The cache is a per-CPU array of slots indexed by a hash of the key,
 * each holding the last key that hashed there: a lookup is an array
 * access and a comparison, a miss overwrites the slot, with no allocation
 * or lock (an LRU map's insert costs a new client's first flow about
 * 200 ns). A program runs on one CPU to its end, and no other program of
 * this cache runs on that CPU meanwhile (softirq, or bottom halves off), so
 * a slot is never read half written; on a PREEMPT_RT kernel, where that
 * does not hold, the agent leaves sharing off. */
#ifndef EBPF_PROXY_NEXTHOP_H
#define EBPF_PROXY_NEXTHOP_H

#include "ct.h"
#include "maglev.h"

/* nh_put takes a flow entry's fib_* fields as a struct nh_entry. */
#define NH_AT(t, f) (__builtin_offsetof(struct t, f) - __builtin_offsetof(struct t, fib_ifindex))
_Static_assert(NH_AT(ct4_entry, fib_smac) == __builtin_offsetof(struct nh_entry, smac) &&
		       NH_AT(ct6_entry, fib_smac) == __builtin_offsetof(struct nh_entry, smac) &&
		       NH_AT(ct4_entry, fib_dmac) == __builtin_offsetof(struct nh_entry, dmac) &&
		       NH_AT(ct4_entry, fib_at) == __builtin_offsetof(struct nh_entry, at) &&
		       NH_AT(ct4_entry, fib_len) == __builtin_offsetof(struct nh_entry, len),
	       "struct nh_entry is not the layout of a flow entry's next hop");

/* nh_share is how the agent lets new flows of family v6 share their next
 * hop: NH_SHARE_OFF, NH_SHARE_ON (a client's flows) or NH_SHARE_ALL (every
 * client's). */
static __always_inline __u32 nh_share(bool v6)
{
	__u32 fam = v6 ? NH_SHARE_IPV6 : NH_SHARE_IPV4;
	__u32 *share = bpf_map_lookup_elem(&tc_nexthop_share_v1, &fam);

	if (!share || (*share != NH_SHARE_ON && *share != NH_SHARE_ALL))
		return NH_SHARE_OFF;
	return *share;
}

/* The slot functions below take fib, the input of a new flow's lookup,
 * and smask, which the key's client address is fib's source ANDed with:
 * all ones, or 0 where every client shares (nh_key_mask). */

/* nh_key_mask is the mask of the key's client address under sharing
 * share. */
static __always_inline __be32 nh_key_mask(__u32 share)
{
	return share == NH_SHARE_ALL ? 0 : ~(__be32)0;
}

/* nh_unforwarded6 says whether an IPv6 source is one the kernel forwards
 * no packet from (multicast, link-local, loopback), which its FIB lookup
 * refuses: a next hop shared by every client, found for another source,
 * must not let such a packet through. */
static __always_inline bool nh_unforwarded6(const __be32 *src)
{
	__u32 w0 = bpf_ntohl(src[0]);

	return (w0 >> 24) == 0xff || (w0 & 0xffc00000) == 0xfe800000 ||
	       (!w0 && !src[1] && !src[2] && src[3] == bpf_htonl(1));
}

/* nh_slot is this CPU's slot (a struct nh6_slot when v6, else a struct
 * nh4_slot) for the key of fib and smask, or NULL: the key's slot,
 * whatever key it holds, or none for a source the FIB refuses
 * (nh_unforwarded6). */
static __always_inline void *nh_slot(bool v6, const struct bpf_fib_lookup *fib, __be32 smask)
{
	__u32 i;

	if (v6) {
		if (nh_unforwarded6(fib->ipv6_src))
			return NULL;
		i = flow_hash6_masked(fib->ipv6_src, smask, fib->ipv6_dst, (__u16)fib->ifindex,
				      fib->dport, fib->l4_protocol);
		i &= NH_SLOTS - 1;
		return bpf_map_lookup_elem(&tc6_nexthop_v1, &i);
	}
	i = flow_hash(fib->ipv4_src & smask, fib->ipv4_dst, (__u16)fib->ifindex, fib->dport,
		      fib->l4_protocol ^ fib->tos);
	i &= NH_SLOTS - 1;
	return bpf_map_lookup_elem(&tc4_nexthop_v1, &i);
}

/* nh_holds says whether slot s holds the key of fib and smask. */
static __always_inline bool nh_holds(bool v6, const void *s, const struct bpf_fib_lookup *fib,
				     __be32 smask)
{
	if (v6) {
		const struct nh6_key *k = &((const struct nh6_slot *)s)->key;

		return k->ifindex == fib->ifindex && k->dport == fib->dport &&
		       k->proto == fib->l4_protocol && pkt6_addr_eq(k->daddr, fib->ipv6_dst) &&
		       k->saddr[0] == (fib->ipv6_src[0] & smask) &&
		       k->saddr[1] == (fib->ipv6_src[1] & smask) &&
		       k->saddr[2] == (fib->ipv6_src[2] & smask) &&
		       k->saddr[3] == (fib->ipv6_src[3] & smask);
	}
	const struct nh4_key *k = &((const struct nh4_slot *)s)->key;

	return k->saddr == (fib->ipv4_src & smask) && k->daddr == fib->ipv4_dst &&
	       k->ifindex == fib->ifindex && k->dport == fib->dport &&
	       k->proto == fib->l4_protocol && k->tos == fib->tos;
}

static __always_inline struct nh_entry *nh_of(bool v6, void *s)
{
	return v6 ? &((struct nh6_slot *)s)->nh : &((struct nh4_slot *)s)->nh;
}

/* nh_get gives fib the next hop of slot s when s holds the key of fib and
 * smask and a next hop found in second now that let a packet of at least
 * len bytes (IP length) through; else it makes s the key's, with no next
 * hop yet, and returns false: the caller looks the route up and keeps the
 * answer in s (nh_put). To be called before the lookup, which overwrites its input's
 * device (and, over IPv4, its destination with the gateway). */
static __always_inline bool nh_get(bool v6, void *s, __u32 now, __u32 len,
				   struct bpf_fib_lookup *fib, __be32 smask)
{
	struct nh_entry *n = nh_of(v6, s);

	if (nh_holds(v6, s, fib, smask)) {
		if (!n->ifindex || n->at != (__u16)now || len > n->len)
			return false;
		fib->ifindex = n->ifindex;
		__builtin_memcpy(fib->dmac, n->dmac, ETH_ALEN);
		__builtin_memcpy(fib->smac, n->smac, ETH_ALEN);
		return true;
	}
	if (v6) {
		struct nh6_key *k = &((struct nh6_slot *)s)->key;

		k->saddr[0] = fib->ipv6_src[0] & smask;
		k->saddr[1] = fib->ipv6_src[1] & smask;
		k->saddr[2] = fib->ipv6_src[2] & smask;
		k->saddr[3] = fib->ipv6_src[3] & smask;
		__builtin_memcpy(k->daddr, fib->ipv6_dst, sizeof(k->daddr));
		k->ifindex = fib->ifindex;
		k->dport = fib->dport;
		k->proto = fib->l4_protocol;
		k->pad = 0;
	} else {
		struct nh4_key *k = &((struct nh4_slot *)s)->key;

		k->saddr = fib->ipv4_src & smask;
		k->daddr = fib->ipv4_dst;
		k->ifindex = fib->ifindex;
		k->dport = fib->dport;
		k->proto = fib->l4_protocol;
		k->tos = fib->tos;
	}
	n->ifindex = 0;
	return false;
}

/* nh_put keeps in slot s, which nh_get made its key's, the next hop that a
 * successful lookup found, as the new flow's entry e keeps it after
 * ct_fib_put: struct nh_entry is the layout of e's fib_* fields. A longer
 * packet of the same second through the same device leaves the length
 * the shorter ones were let through at. */
static __always_inline void nh_put(bool v6, void *s, const void *e)
{
	const struct nh_entry *v = (const void *)&CT_E(e, v6, fib_ifindex);
	struct nh_entry *n = nh_of(v6, s);
	__u16 len = v->len;

	if (n->ifindex == v->ifindex && n->at == v->at && n->len > len)
		len = n->len;
	__builtin_memcpy(n, v, sizeof(*v));
	n->len = len;
}

#endif /* EBPF_PROXY_NEXTHOP_H */
