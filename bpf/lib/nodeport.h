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

/* np_orig_valid says whether the tracked flow e still holds for p. A flow
 * lives until it expires; a new TCP connection or a UDP datagram also needs
 * its backend to still be one the ServicePort may choose (kube-proxy
 * clears the UDP flows of removed endpoints), and a source-NATed flow needs
 * its reply entry, which a newer flow may have taken over (its old client's
 * late packets, a retransmitted final ACK say, then select again: a new
 * flow, whose backend answers an RST, which frees that flow's port). A
 * source-NATed flow lives as long as either entry: the reply entry sees
 * both directions (a UDP flow only the backend keeps talking on). */
static __always_inline bool np_orig_valid(struct ct4_entry *e, const struct pkt4 *p, __u32 now)
{
	struct ct4_entry *r, rval = {};
	struct ct4_key rkey = {};
	struct lb4_backend *be;

	if (!(e->flags & CT_F_SNAT) && ct_expired(e, now))
		return false;
	if (p->proto == IPPROTO_UDP ||
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		be = lb4_member_backend(e->backend_id, e->svc_id);
		if (!be || be->address != e->nat_daddr || be->port != e->nat_dport)
			return false;
	}
	if (!(e->flags & CT_F_SNAT))
		return true;
	ct_reply_key(&rkey, e, p);
	r = bpf_map_lookup_elem(&tc4_ct_v1, &rkey);
	if (r) {
		if (r->nat_daddr != p->saddr || r->nat_dport != p->sport)
			return false;
		if (ct_expired(e, now) && ct_expired(r, now))
			return false;
		ct_refresh(r, p, now);
		return true;
	}
	if (ct_expired(e, now))
		return false;
	/* Evicted from the LRU: take the port back if nobody else has. */
	rval.nat_saddr = p->daddr;
	rval.nat_sport = p->dport;
	rval.nat_daddr = p->saddr;
	rval.nat_dport = p->sport;
	rval.backend_id = e->backend_id;
	rval.svc_id = e->svc_id;
	rval.flags = CT_F_SNAT;
	ct_refresh(&rval, p, now);
	return !bpf_map_update_elem(&tc4_ct_v1, &rkey, &rval, BPF_NOEXIST);
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

/* np_snat_addr is the address source NAT gives a packet p to backend be
 * that came in on ifindex: that of the device the FIB sends it out of, else
 * (unless egress_only) that of the device it came in on. 0 if the agent
 * configured none of them. ctx is the program's context (skb or xdp_md);
 * orig, the flow's entry, keeps the route (np_snat_lookup). */
static __always_inline __be32 np_snat_addr(void *ctx, __u32 ifindex, const struct pkt4 *p,
					   const struct lb4_backend *be, bool egress_only,
					   struct ct4_entry *orig, __u32 now)
{
	struct bpf_fib_lookup fib = {
		.family = PKT_AF_INET,
		.tos = p->tos,
		.l4_protocol = p->proto,
		.sport = p->sport,
		.dport = be->port,
		.ipv4_src = p->saddr,
		.ipv4_dst = be->address,
		.ifindex = ifindex,
	};
	struct tc4_snat_addr *a = NULL;
	long ret;

	ret = np_snat_lookup(ctx, false, &fib, p->tot_len, orig, now);
	if (ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		a = bpf_map_lookup_elem(&tc4_snat_addrs_v1, &fib.ifindex);
	if (!a && !egress_only)
		a = bpf_map_lookup_elem(&tc4_snat_addrs_v1, &ifindex);
	return a ? a->address : 0;
}

/* np_source_allowed says whether the client may reach a LoadBalancer IP
 * with loadBalancerSourceRanges (kube-proxy drops the others; NodePorts and
 * ExternalIPs of the same Service are open to all). */
static __always_inline bool np_source_allowed(const struct lb4_service *svc, const struct pkt4 *p)
{
	struct lb4_src_range_key key = {
		.prefixlen = 64,
		.svc_id = svc->svc_id,
		.address = p->saddr,
	};

	return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key) != NULL;
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

/* A new flow's frontend and backend. */
struct np_choice {
	struct lb4_service *svc;
	struct lb4_backend *be;
	__u32 backend_id;
};

/* np_decide gives a new flow p its frontend's verdict and, when it is to
 * be forwarded, a backend (lb4_choose_backend: by session affinity, the
 * ServicePort's Maglev table or at random). With select_local false, a
 * Service under externalTrafficPolicy=Local stops at NP_LOCAL_POLICY before
 * choosing (its endpoints are all on this node). Verdicts are not counted:
 * the hook that acts on them does. */
static __always_inline enum np_verdict np_decide(struct pkt4 *p, struct np_choice *c,
						 bool select_local)
{
	struct lb4_key lkey = {
		.address = p->daddr,
		.dport = p->dport,
		.proto = p->proto,
	};
	struct lb4_service *svc;
	struct lb4_backend *be;
	__u32 backend_id = 0, maglev_id = 0;

	svc = lb4_lookup_service(&lkey, LB_SCOPE_EXT);
	if (!svc || !(svc->flags & EXTERNAL_FRONTEND))
		return NP_NOT_OURS;
	/* Ports are only in the first fragment: translating it alone would
	 * split the packet. The kernel gets it as it is. */
	if (p->fragment)
		return NP_FRAGMENT;
	if (svc->flags & SVC_F_DROP)
		return NP_DROP;
	/* Without endpoints every client is refused, inside the source
	 * ranges or not, as kube-proxy's REJECT comes before its firewall. */
	if ((svc->flags & SVC_F_REJECT) || svc->count == 0)
		return NP_REJECT;
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !np_source_allowed(svc, p))
		return NP_SRC_RANGE;
	if (!select_local && (svc->flags & SVC_F_EXT_LOCAL))
		return NP_LOCAL_POLICY;
	if (svc->flags & SVC_F_MAGLEV)
		maglev_id = lb_maglev_backend_id(
			false, svc->svc_id,
			flow_hash(p->saddr, p->daddr, p->sport, p->dport, p->proto));
	/* External clients are told apart by address, as kube-proxy does;
	 * svc_id, and with it the affinity, is shared with the ClusterIP. */
	be = lb4_choose_backend(&lkey, svc, p->saddr, AFFINITY_CLIENT_ADDR, maglev_id, &backend_id);
	if (!be)
		return NP_NO_BACKEND;
	c->svc = svc;
	c->be = be;
	c->backend_id = backend_id;
	return NP_FORWARD;
}

/* np_record writes the connection tracking entries of a new flow p to the
 * backend of c and fills orig with the client-side entry, which says how
 * to rewrite p. A backend on another node gets source NAT to the address of
 * the device towards it and a free port; one on this node keeps the client
 * (see below). ifindex is the device p came in on. Returns 0, or -1 after
 * counting why the flow cannot be recorded (the packet is then dropped). */
static __always_inline int np_record(void *ctx, __u32 ifindex, const struct pkt4 *p,
				     const struct np_choice *c, __u32 now, struct ct4_entry *orig)
{
	struct lb4_backend *be = c->be;
	struct ct4_entry rval = {};
	struct ct4_key okey = {}, rkey = {};
	bool local = be->flags & BE_F_LOCAL;
	__be32 snat_addr = 0;

	orig->nat_daddr = be->address;
	orig->nat_dport = be->port;
	orig->backend_id = c->backend_id;
	orig->svc_id = c->svc->svc_id;
	ct_refresh(orig, p, now);
	rval.nat_saddr = p->daddr;
	rval.nat_sport = p->dport;
	rval.backend_id = c->backend_id;
	rval.svc_id = c->svc->svc_id;
	rval.expires = orig->expires;
	rval.born = orig->born;
	rval.flags = orig->flags;
	rkey.saddr = be->address;
	rkey.sport = be->port;
	rkey.proto = p->proto;
	rkey.dir = CT_DIR_REPLY;

	/* kube-proxy masquerades externalTrafficPolicy=Cluster traffic to
	 * endpoints on the node too, to the address of the device toward the
	 * pod. Its replies must then meet a program on that device: only when
	 * the agent attached there (its address is known) does the pod see
	 * the node; else it sees the client. One call for both cases keeps
	 * one copy of the lookup in the program. */
	if (!local || !(c->svc->flags & SVC_F_EXT_LOCAL)) {
		snat_addr = np_snat_addr(ctx, ifindex, p, be, local, orig, now);
		if (!snat_addr && !local) {
			lb_count(LB_M_TC_SNAT_NO_ADDR);
			return -1;
		}
	}

	if (!snat_addr) {
		rkey.daddr = p->saddr;
		rkey.dport = p->sport;
		if (bpf_map_update_elem(&tc4_ct_v1, &rkey, &rval, BPF_ANY)) {
			lb_count(LB_M_TC_CT_FULL);
			return -1;
		}
	} else {
		rkey.daddr = snat_addr;
		rval.nat_daddr = p->saddr;
		rval.nat_dport = p->sport;
		rval.flags |= CT_F_SNAT;
		ct_refresh(&rval, p, now); /* UDP: source NAT lifetimes */
		if (ct_snat_alloc(&rkey, &rval, snat_port_min, snat_port_max, now)) {
			lb_count(LB_M_TC_SNAT_NO_PORT);
			return -1;
		}
		orig->nat_saddr = snat_addr;
		orig->nat_sport = rkey.dport;
		orig->flags |= CT_F_SNAT;
		ct_refresh(orig, p, now);
	}
	ct_orig_key(&okey, p);
	if (bpf_map_update_elem(&tc4_ct_v1, &okey, orig, BPF_ANY)) {
		bpf_map_delete_elem(&tc4_ct_v1, &rkey);
		lb_count(LB_M_TC_CT_FULL);
		return -1;
	}
	return 0;
}

/* np_forget_stale_reply drops the reply entry of an earlier flow that a new
 * connection reuses: a client that reached a local backend through a
 * frontend, and now connects to that backend directly (a pod on another
 * node through the ClusterIP) from the same port, must not have the
 * backend's answers rewritten to come from the frontend. A new SYN is the
 * only packet that can start such a connection. */
static __always_inline void np_forget_stale_reply(const struct pkt4 *p)
{
	struct ct4_key rkey = {
		.saddr = p->daddr,
		.daddr = p->saddr,
		.sport = p->dport,
		.dport = p->sport,
		.proto = p->proto,
		.dir = CT_DIR_REPLY,
	};
	struct ct4_entry *e = bpf_map_lookup_elem(&tc4_ct_v1, &rkey);

	if (e && !(e->flags & CT_F_SNAT)) {
		bpf_map_delete_elem(&tc4_ct_v1, &rkey);
		lb_count(LB_M_TC_STALE_REPLY);
	}
}

/* np_lookup_tracked finds the entry saying how to rewrite p, a packet that
 * is not a fragment, when it belongs to a tracked flow: its client-side
 * entry while the flow holds (refreshed; *reply false), else the reply entry
 * of a source-NATed flow when p comes to a source NAT port (*reply true).
 * NULL for a packet of no tracked flow, and (with *reply true) for a
 * backend's late packet of an older connection on the port (ct_reply_late),
 * which the hook hands to the node's stack untranslated. A new TCP
 * connection first forgets the stale reply entry of its tuple
 * (np_forget_stale_reply). */
static __always_inline struct ct4_entry *np_lookup_tracked(const struct pkt4 *p, __u32 now,
							   bool *reply)
{
	struct ct4_key key;
	struct ct4_entry *e;
	__u16 port;

	ct_orig_key(&key, p);
	e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
	if (e && np_orig_fresh(e, false, p, now)) {
		*reply = false;
		return e;
	}
	if (e && np_orig_valid(e, p, now)) {
		ct_refresh(e, p, now);
		*reply = false;
		return e;
	}
	if (p->proto == IPPROTO_TCP &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		np_forget_stale_reply(p);
	/* Replies to source-NATed flows come back to a port of the source NAT
	 * range: most packets need no second lookup. */
	port = bpf_ntohs(p->dport);
	if (port < snat_port_min || port > snat_port_max)
		return NULL;
	key.dir = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
	if (!e || !(e->flags & CT_F_SNAT))
		return NULL;
	*reply = true;
	return ct_reply_late(e, p) ? NULL : e;
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
	const struct lb4_backend *be4;
	const struct lb6_backend *be6;
	const void *be;

	if (np_orig_fresh(e, v6, p, now) || PKT_F(p, v6, proto) != IPPROTO_TCP ||
	    (PKT_F(p, v6, tcp_flags) & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return false;
	be = bpf_map_lookup_elem(lb_backends_map(v6), &id);
	if (!be)
		return true;
	if (v6) {
		be6 = be;
		return !pkt6_addr_eq(be6->address, CT_E_ADDR(e, true, nat_daddr)) ||
		       be6->port != CT_E(e, true, nat_dport) || be6->proto != PKT_F(p, true, proto);
	}
	be4 = be;
	return be4->address != ((const struct ct4_entry *)e)->nat_daddr ||
	       be4->port != CT_E(e, false, nat_dport) || be4->proto != PKT_F(p, false, proto);
}

/* IPv6. The same decisions for IPv6 packets (struct pkt6), with the IPv6
 * maps: lb.h's selection with v6 set, the flow tracking of ct.h with v6 set,
 * tc6_ct_v1 and tc6_snat_addrs_v1, maglev.h's tables with v6 set and
 * flow_hash6. Both hooks call them, as the IPv4 ones. */

/* np6_orig_valid is np_orig_valid for IPv6. */
static __always_inline bool np6_orig_valid(struct ct6_entry *e, const struct pkt6 *p, __u32 now)
{
	struct ct6_entry *r, rval = {};
	struct ct6_key rkey = {};
	struct lb6_backend *be;

	if (!(e->flags & CT_F_SNAT) && ct_expired_v(e, true, now))
		return false;
	if (p->proto == IPPROTO_UDP ||
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		be = lb_member_backend(true, e->backend_id, e->svc_id);
		if (!be || !pkt6_addr_eq(be->address, e->nat_daddr) || be->port != e->nat_dport)
			return false;
	}
	if (!(e->flags & CT_F_SNAT))
		return true;
	ct6_reply_key(&rkey, e, p);
	r = bpf_map_lookup_elem(&tc6_ct_v1, &rkey);
	if (r) {
		if (!pkt6_addr_eq(r->nat_daddr, p->saddr) || r->nat_dport != p->sport)
			return false;
		if (ct_expired_v(e, true, now) && ct_expired_v(r, true, now))
			return false;
		ct_refresh_v(r, true, p->proto, p->tcp_flags, now, false);
		return true;
	}
	if (ct_expired_v(e, true, now))
		return false;
	/* Evicted from the LRU: take the port back if nobody else has. */
	__builtin_memcpy(rval.nat_saddr, p->daddr, sizeof(rval.nat_saddr));
	__builtin_memcpy(rval.nat_daddr, p->saddr, sizeof(rval.nat_daddr));
	rval.nat_sport = p->dport;
	rval.nat_dport = p->sport;
	rval.backend_id = e->backend_id;
	rval.svc_id = e->svc_id;
	rval.flags = CT_F_SNAT;
	ct_refresh_v(&rval, true, p->proto, p->tcp_flags, now, false);
	return !bpf_map_update_elem(&tc6_ct_v1, &rkey, &rval, BPF_NOEXIST);
}

/* np6_snat_addr is np_snat_addr for IPv6: it copies the address into out
 * and returns 0, or returns -1 when the agent configured none. */
static __always_inline int np6_snat_addr(void *ctx, __u32 ifindex, const struct pkt6 *p,
					 const struct lb6_backend *be, bool egress_only,
					 struct ct6_entry *orig, __u32 now, __be32 *out)
{
	struct bpf_fib_lookup fib = {
		.family = PKT_AF_INET6,
		.l4_protocol = p->proto,
		.sport = p->sport,
		.dport = be->port,
		.ifindex = ifindex,
	};
	struct tc6_snat_addr *a = NULL;
	long ret;

	__builtin_memcpy(fib.ipv6_src, p->saddr, sizeof(fib.ipv6_src));
	__builtin_memcpy(fib.ipv6_dst, be->address, sizeof(fib.ipv6_dst));
	ret = np_snat_lookup(ctx, true, &fib, sizeof(struct pkt_ipv6hdr) + p->payload_len, orig,
			     now);
	if (ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		a = bpf_map_lookup_elem(&tc6_snat_addrs_v1, &fib.ifindex);
	if (!a && !egress_only)
		a = bpf_map_lookup_elem(&tc6_snat_addrs_v1, &ifindex);
	if (!a)
		return -1;
	__builtin_memcpy(out, a->address, sizeof(a->address));
	return 0;
}

/* A new IPv6 flow's frontend and backend. */
struct np6_choice {
	struct lb4_service *svc;
	struct lb6_backend *be;
	__u32 backend_id;
};

/* np6_decide is np_decide for IPv6: by session affinity, the
 * ServicePort's Maglev table or at random, and with select_local false
 * stopping at NP_LOCAL_POLICY for a Service under
 * externalTrafficPolicy=Local. pkt6_parse and xdp_pkt_parse admit no
 * fragment. */
static __always_inline enum np_verdict np6_decide(struct pkt6 *p, struct np6_choice *c,
						  bool select_local)
{
	/* The keys that only some frontends need are built in their
	 * branches: zeroing 40-byte keys up front cost every packet. */
	struct lb6_key lkey = {
		.dport = p->dport,
		.proto = p->proto,
	};
	struct lb4_service *svc;
	struct lb6_backend *be;
	__u32 backend_id = 0, maglev_id = 0;
	__u64 now;

	__builtin_memcpy(lkey.address, p->daddr, sizeof(lkey.address));
	svc = lb_lookup_service(&lkey, true, LB_SCOPE_EXT);
	if (!svc || !(svc->flags & EXTERNAL_FRONTEND))
		return NP_NOT_OURS;
	if (svc->flags & SVC_F_DROP)
		return NP_DROP;
	if ((svc->flags & SVC_F_REJECT) || svc->count == 0)
		return NP_REJECT;
	if (svc->flags & SVC_F_SOURCE_RANGES) {
		struct lb6_src_range_key rkey = {
			.prefixlen = 160,
			.svc_id = svc->svc_id,
		};

		__builtin_memcpy(rkey.address, p->saddr, sizeof(rkey.address));
		if (!bpf_map_lookup_elem(&lb6_source_ranges_v1, &rkey))
			return NP_SRC_RANGE;
	}
	if (!select_local && (svc->flags & SVC_F_EXT_LOCAL))
		return NP_LOCAL_POLICY;
	if (svc->flags & SVC_F_MAGLEV)
		maglev_id = lb_maglev_backend_id(
			true, svc->svc_id,
			flow_hash6(p->saddr, p->daddr, p->sport, p->dport, p->proto));
	/* Affinity is keyed on the client's whole address, shared with the
	 * ClusterIP through svc_id (lb_choose_backend takes one word: the
	 * affinity is looked up here with lb.h's helpers instead). */
	if (!svc->affinity_timeout) {
		be = lb_new_backend(&lkey, true, svc, maglev_id, &backend_id);
	} else {
		struct lb6_affinity_key akey = {
			.svc_id = svc->svc_id,
			.client_kind = AFFINITY_CLIENT_ADDR,
		};

		__builtin_memcpy(akey.client, p->saddr, sizeof(akey.client));
		now = bpf_ktime_get_ns();
		be = lb_affinity_backend(true, &akey, svc, now, &backend_id);
		if (!be) {
			be = lb_new_backend(&lkey, true, svc, maglev_id, &backend_id);
			if (be)
				lb_affinity_record(true, &akey, now, backend_id);
		}
	}
	if (!be)
		return NP_NO_BACKEND;
	c->svc = svc;
	c->be = be;
	c->backend_id = backend_id;
	return NP_FORWARD;
}

/* np6_record is np_record for IPv6. */
static __always_inline int np6_record(void *ctx, __u32 ifindex, const struct pkt6 *p,
				      const struct np6_choice *c, __u32 now, struct ct6_entry *orig)
{
	struct lb6_backend *be = c->be;
	struct ct6_entry rval = {};
	struct ct6_key okey = {}, rkey = {};
	bool local = be->flags & BE_F_LOCAL;
	__be32 snat_addr[4] = {};
	int snat = -1;

	__builtin_memcpy(orig->nat_daddr, be->address, sizeof(orig->nat_daddr));
	orig->nat_dport = be->port;
	orig->backend_id = c->backend_id;
	orig->svc_id = c->svc->svc_id;
	ct_refresh_v(orig, true, p->proto, p->tcp_flags, now, false);
	__builtin_memcpy(rval.nat_saddr, p->daddr, sizeof(rval.nat_saddr));
	rval.nat_sport = p->dport;
	rval.backend_id = c->backend_id;
	rval.svc_id = c->svc->svc_id;
	rval.expires = orig->expires;
	rval.born = orig->born;
	rval.flags = orig->flags;
	__builtin_memcpy(rkey.saddr, be->address, sizeof(rkey.saddr));
	rkey.sport = be->port;
	rkey.proto = p->proto;
	rkey.dir = CT_DIR_REPLY;

	if (!local || !(c->svc->flags & SVC_F_EXT_LOCAL)) {
		snat = np6_snat_addr(ctx, ifindex, p, be, local, orig, now, snat_addr);
		if (snat && !local) {
			lb_count(LB_M_TC_SNAT_NO_ADDR);
			return -1;
		}
	}

	if (snat) {
		__builtin_memcpy(rkey.daddr, p->saddr, sizeof(rkey.daddr));
		rkey.dport = p->sport;
		if (bpf_map_update_elem(&tc6_ct_v1, &rkey, &rval, BPF_ANY)) {
			lb_count(LB_M_TC_CT_FULL);
			return -1;
		}
	} else {
		__builtin_memcpy(rkey.daddr, snat_addr, sizeof(rkey.daddr));
		__builtin_memcpy(rval.nat_daddr, p->saddr, sizeof(rval.nat_daddr));
		rval.nat_dport = p->sport;
		rval.flags |= CT_F_SNAT;
		ct_refresh_v(&rval, true, p->proto, p->tcp_flags, now, false);
		if (ct_snat_alloc_v(&rkey, true, &rval, snat_port_min, snat_port_max, now)) {
			lb_count(LB_M_TC_SNAT_NO_PORT);
			return -1;
		}
		__builtin_memcpy(orig->nat_saddr, snat_addr, sizeof(orig->nat_saddr));
		orig->nat_sport = rkey.dport;
		orig->flags |= CT_F_SNAT;
		ct_refresh_v(orig, true, p->proto, p->tcp_flags, now, false);
	}
	ct6_orig_key(&okey, p);
	if (bpf_map_update_elem(&tc6_ct_v1, &okey, orig, BPF_ANY)) {
		bpf_map_delete_elem(&tc6_ct_v1, &rkey);
		lb_count(LB_M_TC_CT_FULL);
		return -1;
	}
	return 0;
}

/* np6_lookup_tracked is np_lookup_tracked for IPv6. */
static __always_inline struct ct6_entry *np6_lookup_tracked(const struct pkt6 *p, __u32 now,
							    bool *reply)
{
	struct ct6_key key;
	struct ct6_entry *e;
	__u16 port;

	ct6_orig_key(&key, p);
	e = bpf_map_lookup_elem(&tc6_ct_v1, &key);
	if (e && np_orig_fresh(e, true, p, now)) {
		*reply = false;
		return e;
	}
	if (e && np6_orig_valid(e, p, now)) {
		ct_refresh_v(e, true, p->proto, p->tcp_flags, now, false);
		*reply = false;
		return e;
	}
	key.dir = CT_DIR_REPLY;
	if (p->proto == IPPROTO_TCP &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		/* np_forget_stale_reply: the reply entry of the tuple turned
		 * around. */
		struct ct6_key skey = {
			.sport = p->dport,
			.dport = p->sport,
			.proto = p->proto,
			.dir = CT_DIR_REPLY,
		};
		struct ct6_entry *s;

		__builtin_memcpy(skey.saddr, p->daddr, sizeof(skey.saddr));
		__builtin_memcpy(skey.daddr, p->saddr, sizeof(skey.daddr));
		s = bpf_map_lookup_elem(&tc6_ct_v1, &skey);
		if (s && !(s->flags & CT_F_SNAT)) {
			bpf_map_delete_elem(&tc6_ct_v1, &skey);
			lb_count(LB_M_TC_STALE_REPLY);
		}
	}
	port = bpf_ntohs(p->dport);
	if (port < snat_port_min || port > snat_port_max)
		return NULL;
	e = bpf_map_lookup_elem(&tc6_ct_v1, &key);
	if (!e || !(e->flags & CT_F_SNAT))
		return NULL;
	*reply = true;
	return ct_reply_late_v(e, true, p->proto, p->tcp_flags) ? NULL : e;
}

#endif /* EBPF_PROXY_NODEPORT_H */
