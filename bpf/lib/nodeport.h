/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The decisions about traffic from outside the node to NodePorts,
 * ExternalIPs and LoadBalancer IPs, shared by the TC (tc.c) and XDP (xdp.c)
 * programs so that a flow gets the same verdict, backend and connection
 * tracking entries whichever hook sees its first packet, and either hook can
 * carry on a flow the other began. Nothing here touches the packet: each
 * hook rewrites it with the helpers for its buffers (rewrite.h). */
#ifndef EBPF_PROXY_NODEPORT_H
#define EBPF_PROXY_NODEPORT_H

#include "lb.h"
#include "ct.h"
#include "maglev.h"
#include "nexthop.h"
#include "parse.h"

/* Source NAT ports: above the kernel's default ephemeral range
 * (ip_local_port_range 32768-60999) and the NodePort range, so that the
 * node's own connections and NodePorts never collide with them. Set by the
 * loader, the same in both programs. */
volatile const __u16 snat_port_min = 61000;
volatile const __u16 snat_port_max = 65535;

#define EXTERNAL_FRONTEND (SVC_F_NODE_PORT | SVC_F_EXTERNAL_IP | SVC_F_LOAD_BALANCER)

/* np_port_wanted says whether p, a TCP or UDP packet from outside (a
 * struct pkt6 when v6, else a struct pkt4), may be of a flow this file
 * decides: its destination port is, or was, an external frontend's
 * (lb4_ext_ports_v1), or in the source NAT range, where the replies of
 * source-NATed flows come back, or it is a TCP SYN, which may reuse the
 * tuple of a flow to a local backend (np_forget_stale_reply). Any other
 * packet, most of what a node receives, is passed at the cost of one array
 * lookup. */
static __always_inline bool np_port_wanted(bool v6, const void *p)
{
	__u16 port = bpf_ntohs(PKT_F(p, v6, dport));
	__u32 word = port / 32;
	__u32 *bits;

	if (port >= snat_port_min && port <= snat_port_max)
		return true;
	if (PKT_F(p, v6, proto) == IPPROTO_TCP &&
	    (PKT_F(p, v6, tcp_flags) & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return true;
	if (v6)
		bits = bpf_map_lookup_elem(&lb6_ext_ports_v1, &word);
	else
		bits = bpf_map_lookup_elem(&lb4_ext_ports_v1, &word);
	return bits && (*bits & (1U << (port % 32)));
}

/* np_orig_fresh says whether e, the client-side entry of a flow of family
 * v6, was checked in full in this second (np_orig_valid, np_backend_gone),
 * so that p, a packet of the flow, needs no check and no refresh:
 *  - the checks were made in this second (fib_at): a source-NATed flow's
 *    next hop was found then (fib_ifindex set), which happens only when a
 *    packet is forwarded after the checks; a flow to a local backend, which
 *    keeps no next hop, was stamped then (np_checked);
 *  - p is a UDP datagram or a TCP segment without SYN, FIN or RST, which
 *    changes no state the checks follow, and the entry already has the
 *    lifetime p would give it: a TCP flow an established connection's (a
 *    SYN's shorter one is extended by the check of the segment after), a
 *    UDP flow at least the shorter of its two;
 *  - neither side has begun to close (CT_F_CLOSING: the client's FIN;
 *    CT_F_REPLY_CLOSING: the backend's, np_reply_seen): every packet of a
 *    closing flow is checked, as its source NAT port may soon serve another;
 *  - no backend was removed in this second (lb_removed_at_v1): a check made
 *    before the removal no longer holds.
 * What the checks would catch otherwise (an expired entry) is caught at the
 * flow's first packet of the next second, and a tracked packet costs one
 * hash lookup, as in Katran. */
static __always_inline bool np_orig_fresh(const void *e, bool v6, const void *p, __u32 now)
{
	__u32 fam = v6 ? LB_REMOVED_AT_IPV6 : LB_REMOVED_AT_IPV4;
	__u16 f = CT_E(e, v6, flags) & (CT_F_SNAT | CT_F_CLOSING | CT_F_REPLY_CLOSING);
	bool snat = f & CT_F_SNAT, tcp = PKT_F(p, v6, proto) == IPPROTO_TCP;
	__u32 *removed;

	if (f != (snat ? CT_F_SNAT : 0) || snat != (CT_E(e, v6, fib_ifindex) != 0) ||
	    CT_E(e, v6, fib_at) != (__u16)now)
		return false;
	if (tcp && (PKT_F(p, v6, tcp_flags) & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)))
		return false;
	if (CT_E(e, v6, expires) < now + (tcp ? CT_LIFETIME_TCP : CT_LIFETIME_UDP_SHORT))
		return false;
	removed = bpf_map_lookup_elem(&lb_removed_at_v1, &fam);
	return removed && *removed != now;
}

/* np_checked stamps e, the client-side entry of a flow to a local backend,
 * as checked in full in second now, once a packet of the flow passed
 * np_orig_valid and np_backend_gone: the flow's other packets of that second
 * skip them (np_orig_fresh). Such a flow keeps no next hop, so the stamp is
 * fib_at; a source-NATed flow's is its next hop's (ct_fib_put). */
static __always_inline void np_checked(void *e, bool v6, __u32 now)
{
	if (!(CT_E(e, v6, flags) & CT_F_SNAT) && CT_E(e, v6, fib_at) != (__u16)now)
		CT_E(e, v6, fib_at) = (__u16)now;
}

/* np_reply_seen is told of p, a backend's packet of family v6 that the
 * reply entry r of a source-NATed flow translates: after a FIN or an RST,
 * which may close the flow, the client-side entry is marked
 * CT_F_REPLY_CLOSING, so that the client's packets are checked in full
 * (np_orig_fresh) and refresh r, which follows the close. */
static __always_inline void np_reply_seen(const void *r, bool v6, const void *p)
{
	struct ct4_key k4 = {};
	struct ct6_key k6 = {};
	void *e;

	if (PKT_F(p, v6, proto) != IPPROTO_TCP ||
	    !(PKT_F(p, v6, tcp_flags) & (TCP_FLAG_FIN | TCP_FLAG_RST)) ||
	    !(CT_E(r, v6, flags) & CT_F_SNAT))
		return;
	/* The client-side key: the client is where r sends replies, the
	 * frontend where they come from. */
	if (v6) {
		const struct ct6_entry *r6 = r;

		__builtin_memcpy(k6.saddr, r6->nat_daddr, sizeof(k6.saddr));
		__builtin_memcpy(k6.daddr, r6->nat_saddr, sizeof(k6.daddr));
		k6.sport = r6->nat_dport;
		k6.dport = r6->nat_sport;
		k6.proto = IPPROTO_TCP;
		k6.dir = CT_DIR_ORIG;
		e = bpf_map_lookup_elem(&tc6_ct_v1, &k6);
	} else {
		const struct ct4_entry *r4 = r;

		k4.saddr = r4->nat_daddr;
		k4.daddr = r4->nat_saddr;
		k4.sport = r4->nat_dport;
		k4.dport = r4->nat_sport;
		k4.proto = IPPROTO_TCP;
		k4.dir = CT_DIR_ORIG;
		e = bpf_map_lookup_elem(&tc4_ct_v1, &k4);
	}
	if (e && !(CT_E(e, v6, flags) & CT_F_REPLY_CLOSING))
		CT_E(e, v6, flags) |= CT_F_REPLY_CLOSING;
}

/* lb_backend_at says whether be, a backend of the family v6 says, is at
 * addr and port. */
static __always_inline bool lb_backend_at(const void *be, bool v6, const __be32 *addr, __be16 port)
{
	return pkt_addr_eq(v6, LB_BE_ADDR(be, v6), addr) && LB_BE(be, v6, port) == port;
}

/* np_orig_valid says whether the tracked flow e still holds for p (e and
 * p of the family v6 says). A flow lives until it expires; a new TCP
 * connection or a UDP datagram also needs its backend to still be one the
 * ServicePort may choose (kube-proxy clears the UDP flows of removed
 * endpoints), and a source-NATed flow needs its reply entry, which a newer
 * flow may have taken over (its old client's late packets, a retransmitted
 * final ACK say, then select again: a new flow, whose backend answers an
 * RST, which frees that flow's port). A source-NATed flow lives as long as
 * either entry: the reply entry sees both directions (a UDP flow only the
 * backend keeps talking on). Of the family's pair of keys and entries, the
 * other is never used: the compiler drops it. */
static __always_inline bool np_orig_valid(void *e, bool v6, const void *p, __u32 now)
{
	struct ct4_entry rval4 = {};
	struct ct6_entry rval6 = {};
	struct ct4_key rkey4 = {};
	struct ct6_key rkey6 = {};
	void *rkey = v6 ? (void *)&rkey6 : (void *)&rkey4;
	void *rval = v6 ? (void *)&rval6 : (void *)&rval4;
	__u8 proto = PKT_F(p, v6, proto), tf = PKT_F(p, v6, tcp_flags);
	bool snat = CT_E(e, v6, flags) & CT_F_SNAT;
	const void *be;
	void *r;

	if (!snat && ct_expired_v(e, v6, now))
		return false;
	if (proto == IPPROTO_UDP || (tf & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		be = lb_member_backend(v6, CT_E(e, v6, backend_id), CT_E(e, v6, svc_id));
		if (!be ||
		    !lb_backend_at(be, v6, CT_E_ADDR(e, v6, nat_daddr), CT_E(e, v6, nat_dport)))
			return false;
	}
	if (!snat)
		return true;
	/* Spelled out per family: with one call, clang 14 laid xdp_nodeport
	 * out so that the verifier walked 40% more instructions (6.18). */
	if (v6)
		ct_reply_key(rkey, true, e, p);
	else
		ct_reply_key(rkey, false, e, p);
	r = bpf_map_lookup_elem(ct_map(v6), rkey);
	if (r) {
		if (!pkt_addr_eq(v6, CT_E_ADDR(r, v6, nat_daddr), PKT_ADDR(p, v6, saddr)) ||
		    CT_E(r, v6, nat_dport) != PKT_F(p, v6, sport))
			return false;
		if (ct_expired_v(e, v6, now) && ct_expired_v(r, v6, now))
			return false;
		ct_refresh_v(r, v6, proto, tf, now, false);
		return true;
	}
	if (ct_expired_v(e, v6, now))
		return false;
	/* Evicted from the LRU: take the port back if nobody else has. */
	pkt_addr_copy(v6, CT_E_ADDR(rval, v6, nat_saddr), PKT_ADDR(p, v6, daddr));
	pkt_addr_copy(v6, CT_E_ADDR(rval, v6, nat_daddr), PKT_ADDR(p, v6, saddr));
	CT_E(rval, v6, nat_sport) = PKT_F(p, v6, dport);
	CT_E(rval, v6, nat_dport) = PKT_F(p, v6, sport);
	CT_E(rval, v6, backend_id) = CT_E(e, v6, backend_id);
	CT_E(rval, v6, svc_id) = CT_E(e, v6, svc_id);
	CT_E(rval, v6, flags) = CT_F_SNAT;
	ct_refresh_v(rval, v6, proto, tf, now, false);
	return !bpf_map_update_elem(ct_map(v6), rkey, rval, BPF_NOEXIST);
}

/* np_snat_lookup is the FIB lookup that chooses a new flow's source NAT
 * address (fib's input filled in, of a packet of len bytes, IP length): the
 * kernel's own for the packet kube-proxy DNATs, from the client to the
 * backend, on the device it came in on. The route it finds is the one the
 * packet takes, as the kernel routes before it masquerades; the flow's entry
 * e keeps it (ct_fib_put), which spares the forwarding a second lookup.
 * Where the agent lets them, new flows to the backend in the same second
 * share the next hop found for the first: the client's, or every client's
 * (nexthop.h). A packet too big for the route's MTU is looked up again
 * without its length, for the address alone: the forwarding then finds it
 * too big. */
static __always_inline long np_snat_lookup(void *ctx, bool v6, struct bpf_fib_lookup *fib,
					   __u32 len, void *e, __u32 now)
{
	__u32 share = nh_share(v6);
	__be32 smask = nh_key_mask(share);
	void *slot = share != NH_SHARE_OFF ? nh_slot(v6, fib, smask) : NULL;
	long ret;

	if (slot && nh_get(v6, slot, now, len, fib, smask)) {
		lb_count(LB_M_TC_NEXTHOP_SHARED);
		ct_fib_put(e, v6, now, len, fib);
		return BPF_FIB_LKUP_RET_SUCCESS;
	}
	fib->tot_len = len;
	ret = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (ret == BPF_FIB_LKUP_RET_SUCCESS) {
		ct_fib_put(e, v6, now, len, fib);
		if (slot)
			nh_put(v6, slot, e);
	}
	if (ret != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return ret;
	fib->tot_len = 0;
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* np_snat_addr finds the address source NAT gives a packet p to backend be
 * (of the family v6 says) that came in on ifindex: that of the device the
 * FIB sends it out of, else (unless egress_only) that of the device it came
 * in on. It returns the address's words (one, or four for IPv6) as the map
 * of source NAT addresses holds them, or NULL when the agent configured
 * none of them. ctx is the program's context (skb or xdp_md); orig, the
 * flow's entry, keeps the route (np_snat_lookup). */
static __always_inline const __be32 *np_snat_addr(void *ctx, bool v6, __u32 ifindex, const void *p,
						  const void *be, bool egress_only, void *orig,
						  __u32 now)
{
	struct bpf_fib_lookup fib = {
		.family = v6 ? PKT_AF_INET6 : PKT_AF_INET,
		.l4_protocol = PKT_F(p, v6, proto),
		.sport = PKT_F(p, v6, sport),
		.dport = LB_BE(be, v6, port),
		.ifindex = ifindex,
	};
	void *addrs = v6 ? (void *)&tc6_snat_addrs_v1 : (void *)&tc4_snat_addrs_v1;
	__u32 len;
	void *a = NULL;
	long ret;

	if (v6) {
		__builtin_memcpy(fib.ipv6_src, PKT_ADDR(p, true, saddr), sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, LB_BE_ADDR(be, true), sizeof(fib.ipv6_dst));
		len = sizeof(struct pkt_ipv6hdr) + ((const struct pkt6 *)p)->payload_len;
	} else {
		fib.tos = ((const struct pkt4 *)p)->tos;
		fib.ipv4_src = ((const struct pkt4 *)p)->saddr;
		fib.ipv4_dst = ((const struct lb4_backend *)be)->address;
		len = ((const struct pkt4 *)p)->tot_len;
	}
	ret = np_snat_lookup(ctx, v6, &fib, len, orig, now);
	if (ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		a = bpf_map_lookup_elem(addrs, &fib.ifindex);
	if (!a && !egress_only)
		a = bpf_map_lookup_elem(addrs, &ifindex);
	/* struct tc6_snat_addr and struct tc4_snat_addr begin with it. */
	return a;
}

/* np_source_allowed says whether the client may reach a LoadBalancer IP
 * with loadBalancerSourceRanges (kube-proxy drops the others; NodePorts and
 * ExternalIPs of the same Service are open to all). */
static __always_inline bool np_source_allowed(const struct lb4_service *svc, bool v6, const void *p)
{
	struct lb4_src_range_key key4 = {
		.prefixlen = 64,
		.svc_id = svc->svc_id,
	};
	struct lb6_src_range_key key6 = {
		.prefixlen = 160,
		.svc_id = svc->svc_id,
	};

	if (v6) {
		__builtin_memcpy(key6.address, PKT_ADDR(p, true, saddr), sizeof(key6.address));
		return bpf_map_lookup_elem(&lb6_source_ranges_v1, &key6) != NULL;
	}
	key4.address = ((const struct pkt4 *)p)->saddr;
	return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key4) != NULL;
}

/* What np_decide found for the first packet of a flow. */
enum np_verdict {
	NP_NOT_OURS,	 /* not an external frontend: pass */
	NP_FRAGMENT,	 /* a fragment to a frontend: pass untranslated */
	NP_DROP,	 /* policy Local without local endpoint (counted) */
	NP_REJECT,	 /* no endpoint: an ICMP port unreachable */
	NP_SRC_RANGE,	 /* client outside loadBalancerSourceRanges: drop */
	NP_NO_BACKEND,	 /* the maps are inconsistent (counted by lb.h): drop */
	NP_LOCAL_POLICY, /* policy Local: only endpoints on this node */
	NP_FORWARD,	 /* c holds the backend */
};

/* A new flow's frontend and backend (a struct lb6_backend for IPv6, else
 * a struct lb4_backend). */
struct np_choice {
	struct lb4_service *svc;
	void *be;
	__u32 backend_id;
	/* svc is the frontend's inside-scope entry (LB_SCOPE_INT): policy
	 * Local short-circuited for a client inside the cluster. */
	bool inside;
};

/* np_decide gives a new flow p (of the family v6 says) its frontend's
 * verdict and, when it is to be forwarded, a backend: by session affinity,
 * the ServicePort's Maglev table or at random (lb_choose_backend_for).
 * External clients are told apart by address, as kube-proxy does; svc_id,
 * and with it the affinity, is shared with the ClusterIP. With
 * select_local false, a Service under externalTrafficPolicy=Local stops at
 * NP_LOCAL_POLICY before choosing (its endpoints are all on this node).
 *
 * With pod, p comes from a pod on this node, translated per packet where
 * the socket programs leave its sockets alone: every frontend is its,
 * ClusterIPs included, with the verdicts a pod's socket meets (the inside
 * scope: lb_lookup_service), but for the node's localhost NodePorts, which
 * a pod's loopback never leaves for.
 *
 * Verdicts are not counted: the hook that acts on them does. The keys that
 * only some frontends need are built in their branches: zeroing 40-byte
 * keys up front cost every packet. */
static __always_inline enum np_verdict np_decide(bool v6, void *p, struct np_choice *c,
						 bool select_local, bool pod)
{
	struct lb4_key lkey4 = {
		.dport = PKT_F(p, v6, dport),
		.proto = PKT_F(p, v6, proto),
	};
	struct lb6_key lkey6 = {
		.dport = PKT_F(p, v6, dport),
		.proto = PKT_F(p, v6, proto),
	};
	void *lkey = v6 ? (void *)&lkey6 : (void *)&lkey4;
	struct lb4_service *svc;
	__u32 backend_id = 0, maglev_id = 0;
	void *be;

	if (v6)
		__builtin_memcpy(lkey6.address, PKT_ADDR(p, true, daddr), sizeof(lkey6.address));
	else
		lkey4.address = ((struct pkt4 *)p)->daddr;
	svc = lb_lookup_service(lkey, v6, pod ? LB_SCOPE_INT : LB_SCOPE_EXT);
	if (!svc || (pod ? (svc->flags & SVC_F_LOCALHOST) : !(svc->flags & EXTERNAL_FRONTEND)))
		return NP_NOT_OURS;
	/* Ports are only in an IPv4 packet's first fragment: translating it
	 * alone would split the packet. The kernel gets it as it is.
	 * pkt6_parse and xdp_pkt_parse admit no IPv6 fragment. */
	if (!v6 && ((struct pkt4 *)p)->fragment)
		return NP_FRAGMENT;
	if (svc->flags & SVC_F_DROP)
		return NP_DROP;
	/* Without endpoints every client is refused, inside the source
	 * ranges or not, as kube-proxy's REJECT comes before its firewall. */
	if ((svc->flags & SVC_F_REJECT) || svc->count == 0)
		return NP_REJECT;
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !np_source_allowed(svc, v6, p))
		return NP_SRC_RANGE;
	if (!select_local && (svc->flags & SVC_F_EXT_LOCAL))
		return NP_LOCAL_POLICY;
	if (svc->flags & SVC_F_MAGLEV)
		maglev_id = lb_maglev_backend_id(
			v6, svc->svc_id,
			v6 ? flow_hash6(PKT_ADDR(p, true, saddr), PKT_ADDR(p, true, daddr),
					PKT_F(p, true, sport), PKT_F(p, true, dport),
					PKT_F(p, true, proto))
			   : flow_hash(((struct pkt4 *)p)->saddr, ((struct pkt4 *)p)->daddr,
				       PKT_F(p, false, sport), PKT_F(p, false, dport),
				       PKT_F(p, false, proto)));
	if (!svc->affinity_timeout) {
		be = lb_new_backend(lkey, v6, svc, maglev_id, &backend_id);
	} else {
		struct lb4_affinity_key akey4 = {
			.svc_id = svc->svc_id,
			.client_kind = AFFINITY_CLIENT_ADDR,
		};
		struct lb6_affinity_key akey6 = {
			.svc_id = svc->svc_id,
			.client_kind = AFFINITY_CLIENT_ADDR,
		};

		if (v6)
			__builtin_memcpy(akey6.client, PKT_ADDR(p, true, saddr),
					 sizeof(akey6.client));
		else
			akey4.client = ((struct pkt4 *)p)->saddr;
		be = lb_affine_backend(lkey, v6, svc, v6 ? (void *)&akey6 : (void *)&akey4,
				       maglev_id, &backend_id);
	}
	if (!be)
		return NP_NO_BACKEND;
	c->svc = svc;
	c->be = be;
	c->backend_id = backend_id;
	c->inside = (v6 ? lkey6.scope : lkey4.scope) == LB_SCOPE_INT;
	return NP_FORWARD;
}

/* What np_reply_put did with a flow's reply entry. */
enum np_reply_put_ret {
	NP_REPLY_PUT,	/* written */
	NP_REPLY_FULL,	/* the map refused it */
	NP_REPLY_CLASH, /* the tuple is a live flow's, of another frontend */
};

/* np_reply_put writes rval, the reply entry of a new flow p that keeps its
 * client's address and port, under rkey (both of the family v6 says),
 * unless a live flow of another frontend holds that tuple: a client that
 * reaches one backend through two frontends from one source port (a pod
 * binding its port, many users behind one NAT port). Overwriting that
 * entry would turn the older flow's replies into the newer's, and the
 * backend's answer to the newer SYN (a challenge ACK on the older
 * connection) would reach the client as the newer's, which resets it. As
 * kube-proxy's conntrack does, the newer flow then gets another source
 * port instead (np_record). An entry of the same frontend (the same
 * connection tracked again, or a new one on its tuple), an expired one and
 * a closed TCP connection's are taken over. */
static __always_inline enum np_reply_put_ret np_reply_put(void *rkey, bool v6, const void *rval,
							  const void *p, __u32 now)
{
	void *old;

	if (!bpf_map_update_elem(ct_map(v6), rkey, rval, BPF_NOEXIST))
		return NP_REPLY_PUT;
	old = bpf_map_lookup_elem(ct_map(v6), rkey);
	if (old && !ct_expired_v(old, v6, now) && !(CT_E(old, v6, flags) & CT_F_CLOSED) &&
	    ((CT_E(old, v6, flags) & CT_F_SNAT) ||
	     !pkt_addr_eq(v6, CT_E_ADDR(old, v6, nat_saddr), PKT_ADDR(p, v6, daddr)) ||
	     CT_E(old, v6, nat_sport) != PKT_F(p, v6, dport)))
		return NP_REPLY_CLASH;
	if (bpf_map_update_elem(ct_map(v6), rkey, rval, BPF_ANY))
		return NP_REPLY_FULL;
	return NP_REPLY_PUT;
}

/* np_record writes the connection tracking entries of a new flow p (of the
 * family v6 says) to the backend of c and fills orig, a zeroed struct
 * ct6_entry or struct ct4_entry, with the client-side entry, which says how
 * to rewrite p. A backend on another node gets source NAT to the address of
 * the device towards it and a free port; one on this node keeps the client
 * (see below). A pod's flow (pod) keeps its client, as pod addresses route
 * across the cluster, where kube-proxy keeps it: kube-proxy masquerades a
 * pod reaching itself through a frontend (a hairpin: the pod's kernel would
 * drop a packet from its own address) and a pod's traffic to a NodePort,
 * ExternalIP or LoadBalancer IP under policy Cluster (every client's
 * traffic to an external destination), and so does this, to the address of
 * the device the packet leaves by, else of the pod's device. ifindex is the
 * device p came in on. A flow that keeps its client's address whose reply
 * tuple a live flow to another frontend holds gets another source port of
 * the client's own address instead (np_reply_put): port-only source NAT,
 * whose replies are translated where they meet a program, at ingress, or
 * at the egress of the client's device (tc_egress_flow). Returns 0, or -1
 * after counting why the flow cannot be recorded (the packet is then
 * dropped). */
static __always_inline int np_record(void *ctx, bool v6, __u32 ifindex, const void *p,
				     const struct np_choice *c, __u32 now, void *orig, bool pod)
{
	struct ct4_entry rval4 = {};
	struct ct6_entry rval6 = {};
	struct ct4_key okey4 = {}, rkey4 = {};
	struct ct6_key okey6 = {}, rkey6 = {};
	void *rval = v6 ? (void *)&rval6 : (void *)&rval4;
	void *okey = v6 ? (void *)&okey6 : (void *)&okey4;
	void *rkey = v6 ? (void *)&rkey6 : (void *)&rkey4;
	const void *be = c->be;
	bool local = LB_BE(be, v6, flags) & BE_F_LOCAL;
	const __be32 *snat_addr = NULL;

	pkt_addr_copy(v6, CT_E_ADDR(orig, v6, nat_daddr), LB_BE_ADDR(be, v6));
	CT_E(orig, v6, nat_dport) = LB_BE(be, v6, port);
	CT_E(orig, v6, backend_id) = c->backend_id;
	CT_E(orig, v6, svc_id) = c->svc->svc_id;
	ct_refresh_v(orig, v6, PKT_F(p, v6, proto), PKT_F(p, v6, tcp_flags), now, false);
	if (pod)
		CT_E(orig, v6, flags) |= CT_F_POD;
	pkt_addr_copy(v6, CT_E_ADDR(rval, v6, nat_saddr), PKT_ADDR(p, v6, daddr));
	CT_E(rval, v6, nat_sport) = PKT_F(p, v6, dport);
	CT_E(rval, v6, backend_id) = c->backend_id;
	CT_E(rval, v6, svc_id) = c->svc->svc_id;
	CT_E(rval, v6, expires) = CT_E(orig, v6, expires);
	CT_E(rval, v6, born) = CT_E(orig, v6, born);
	CT_E(rval, v6, flags) = CT_E(orig, v6, flags);
	pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, saddr), LB_BE_ADDR(be, v6));
	CT_K(rkey, v6, sport) = LB_BE(be, v6, port);
	CT_K(rkey, v6, proto) = PKT_F(p, v6, proto);
	CT_K(rkey, v6, dir) = CT_DIR_REPLY;

	/* kube-proxy masquerades externalTrafficPolicy=Cluster traffic to
	 * endpoints on the node too, to the address of the device toward the
	 * pod. Its replies must then meet a program on that device: only when
	 * the agent attached there (its address is known) does the pod see
	 * the node; else it sees the client. One call for both cases keeps
	 * one copy of the lookup in the program. */
	if (pod) {
		if (pkt_addr_eq(v6, LB_BE_ADDR(be, v6), PKT_ADDR(p, v6, saddr)) ||
		    ((c->svc->flags & EXTERNAL_FRONTEND) && !(c->svc->flags & SVC_F_EXT_LOCAL) &&
		     !c->inside)) {
			snat_addr = np_snat_addr(ctx, v6, ifindex, p, be, false, orig, now);
			if (!snat_addr) {
				lb_count(LB_M_TC_SNAT_NO_ADDR);
				return -1;
			}
		}
	} else if (!local || !(c->svc->flags & SVC_F_EXT_LOCAL)) {
		snat_addr = np_snat_addr(ctx, v6, ifindex, p, be, local, orig, now);
		if (!snat_addr && !local) {
			lb_count(LB_M_TC_SNAT_NO_ADDR);
			return -1;
		}
	}

	if (!snat_addr) {
		pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, daddr), PKT_ADDR(p, v6, saddr));
		CT_K(rkey, v6, dport) = PKT_F(p, v6, sport);
		switch (np_reply_put(rkey, v6, rval, p, now)) {
		case NP_REPLY_PUT:
			goto record;
		case NP_REPLY_FULL:
			lb_count(LB_M_TC_CT_FULL);
			return -1;
		default:
			/* The reply tuple is another frontend's flow's: this
			 * flow keeps the client's address, on another port. */
			lb_count(LB_M_TC_PORT_CLASH);
			snat_addr = PKT_ADDR(p, v6, saddr);
		}
	}
	pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, daddr), snat_addr);
	pkt_addr_copy(v6, CT_E_ADDR(rval, v6, nat_daddr), PKT_ADDR(p, v6, saddr));
	CT_E(rval, v6, nat_dport) = PKT_F(p, v6, sport);
	CT_E(rval, v6, flags) |= CT_F_SNAT;
	ct_refresh_v(rval, v6, PKT_F(p, v6, proto), PKT_F(p, v6, tcp_flags), now,
		     false); /* UDP: source NAT lifetimes */
	if (ct_snat_alloc_v(rkey, v6, rval, snat_port_min, snat_port_max, now)) {
		lb_count(LB_M_TC_SNAT_NO_PORT);
		return -1;
	}
	pkt_addr_copy(v6, CT_E_ADDR(orig, v6, nat_saddr), CT_K_ADDR(rkey, v6, daddr));
	CT_E(orig, v6, nat_sport) = CT_K(rkey, v6, dport);
	CT_E(orig, v6, flags) |= CT_F_SNAT;
	ct_refresh_v(orig, v6, PKT_F(p, v6, proto), PKT_F(p, v6, tcp_flags), now, false);
record:
	ct_orig_key(okey, v6, p);
	if (bpf_map_update_elem(ct_map(v6), okey, orig, BPF_ANY)) {
		bpf_map_delete_elem(ct_map(v6), rkey);
		lb_count(LB_M_TC_CT_FULL);
		return -1;
	}
	return 0;
}

/* np_forget_stale_reply drops the reply entry of an earlier flow that a new
 * connection p (of the family v6 says) reuses: a client that reached a
 * local backend through a frontend, and now connects to that backend
 * directly (a pod on another node through the ClusterIP) from the same
 * port, must not have the backend's answers rewritten to come from the
 * frontend. A new SYN is the only packet that can start such a connection.
 * A pod's flow (CT_F_POD) is forgotten only at the pod's device (pod): at
 * the node's devices its translated packets look like such a connection. */
static __always_inline void np_forget_stale_reply(bool v6, const void *p, bool pod)
{
	struct ct4_key rkey4 = {};
	struct ct6_key rkey6 = {};
	void *rkey = v6 ? (void *)&rkey6 : (void *)&rkey4;
	void *e;

	/* The tuple turned around. */
	pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, saddr), PKT_ADDR(p, v6, daddr));
	pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, daddr), PKT_ADDR(p, v6, saddr));
	CT_K(rkey, v6, sport) = PKT_F(p, v6, dport);
	CT_K(rkey, v6, dport) = PKT_F(p, v6, sport);
	CT_K(rkey, v6, proto) = PKT_F(p, v6, proto);
	CT_K(rkey, v6, dir) = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(ct_map(v6), rkey);
	if (e && !(CT_E(e, v6, flags) & CT_F_SNAT) && (pod || !(CT_E(e, v6, flags) & CT_F_POD))) {
		bpf_map_delete_elem(ct_map(v6), rkey);
		lb_count(LB_M_TC_STALE_REPLY);
	}
}

/* np_reply_restore puts back the reply entry of e, the client-side entry
 * of a pod's UDP flow through a frontend to a backend it keeps the pod's
 * address for (p a datagram of the flow), when it is gone: a datagram of
 * the pod straight to the backend from the same port took the tuple over
 * (np_forget_stale_reply), and now the pod sends through the frontend
 * again. The tuple's newest use wins, in both directions, as with the
 * socket programs; kube-proxy's conntrack gives the direct flow another
 * source port instead. */
static __always_inline void np_reply_restore(const void *e, bool v6, const void *p)
{
	struct ct4_entry rval4 = {};
	struct ct6_entry rval6 = {};
	struct ct4_key rkey4 = {};
	struct ct6_key rkey6 = {};
	void *rkey = v6 ? (void *)&rkey6 : (void *)&rkey4;
	void *rval = v6 ? (void *)&rval6 : (void *)&rval4;

	if (CT_E(e, v6, flags) & CT_F_SNAT)
		return;
	ct_reply_key(rkey, v6, e, p);
	if (bpf_map_lookup_elem(ct_map(v6), rkey))
		return;
	pkt_addr_copy(v6, CT_E_ADDR(rval, v6, nat_saddr), PKT_ADDR(p, v6, daddr));
	CT_E(rval, v6, nat_sport) = PKT_F(p, v6, dport);
	CT_E(rval, v6, backend_id) = CT_E(e, v6, backend_id);
	CT_E(rval, v6, svc_id) = CT_E(e, v6, svc_id);
	CT_E(rval, v6, expires) = CT_E(e, v6, expires);
	CT_E(rval, v6, born) = CT_E(e, v6, born);
	CT_E(rval, v6, flags) = CT_E(e, v6, flags);
	bpf_map_update_elem(ct_map(v6), rkey, rval, BPF_NOEXIST);
}

/* np_lookup_tracked finds the entry saying how to rewrite p, a packet of
 * the family v6 says that is not a fragment, when it belongs to a tracked
 * flow: its client-side entry while the flow holds (refreshed; *reply
 * false), else the reply entry of a source-NATed flow when p comes to a
 * source NAT port (*reply true). NULL for a packet of no tracked flow, and
 * (with *reply true) for a backend's late packet of an older connection on
 * the port (ct_reply_late_v), which the hook hands to the node's stack
 * untranslated. A new TCP connection first forgets the stale reply entry of
 * its tuple (np_forget_stale_reply; pod as its). */
static __always_inline void *np_lookup_tracked(bool v6, const void *p, __u32 now, bool *reply,
					       bool pod)
{
	struct ct4_key key4;
	struct ct6_key key6;
	void *key = v6 ? (void *)&key6 : (void *)&key4;
	__u8 proto = PKT_F(p, v6, proto), tf = PKT_F(p, v6, tcp_flags);
	__u16 port;
	void *e;

	ct_orig_key(key, v6, p);
	e = bpf_map_lookup_elem(ct_map(v6), key);
	if (e && np_orig_fresh(e, v6, p, now)) {
		*reply = false;
		return e;
	}
	if (e && np_orig_valid(e, v6, p, now)) {
		ct_refresh_v(e, v6, proto, tf, now, false);
		*reply = false;
		return e;
	}
	if (proto == IPPROTO_TCP && (tf & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		np_forget_stale_reply(v6, p, pod);
	/* Replies to source-NATed flows come back to a port of the source NAT
	 * range: most packets need no second lookup. */
	port = bpf_ntohs(PKT_F(p, v6, dport));
	if (port < snat_port_min || port > snat_port_max)
		return NULL;
	CT_K(key, v6, dir) = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(ct_map(v6), key);
	if (!e || !(CT_E(e, v6, flags) & CT_F_SNAT))
		return NULL;
	*reply = true;
	return ct_reply_late_v(e, v6, proto, tf) ? NULL : e;
}

/* np_backend_gone says whether the backend of a tracked TCP flow was
 * removed, for p, a packet of the flow whose client-side entry
 * np_lookup_tracked returned as e: the backend's id is no longer in
 * lb4_backends_v1, or names another endpoint now. internal/maps keeps a
 * terminating endpoint there (no longer a member: chosen by no new flow)
 * until its EndpointSlice drops it, so that its flows live on meanwhile. A
 * new SYN on the tuple is a new connection, which np_orig_valid already
 * sends to a backend the ServicePort may choose; UDP flows move there too.
 * Such a flow is reset by TC (tc.c tc_reset); XDP hands its packets over.
 * e and p are of the family v6 says. */
static __always_inline bool np_backend_gone(const void *e, bool v6, const void *p, __u32 now)
{
	__u32 id = CT_E(e, v6, backend_id);
	const void *be;

	if (np_orig_fresh(e, v6, p, now) || PKT_F(p, v6, proto) != IPPROTO_TCP ||
	    (PKT_F(p, v6, tcp_flags) & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return false;
	be = bpf_map_lookup_elem(lb_backends_map(v6), &id);
	return !be || !lb_backend_at(be, v6, CT_E_ADDR(e, v6, nat_daddr), CT_E(e, v6, nat_dport)) ||
	       LB_BE(be, v6, proto) != PKT_F(p, v6, proto);
}

#endif /* EBPF_PROXY_NODEPORT_H */
