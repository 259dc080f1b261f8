// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* NodePort, ExternalIP and LoadBalancer-IP translation on the node's devices,
 * for traffic from outside the node, which never passes a socket hook.
 *
 * At ingress, a new TCP or UDP flow to an external frontend gets a backend
 * (lb.h, the selection the socket programs use), a connection tracking entry
 * for each direction, and its destination rewritten:
 *  - to a backend on this node, the kernel delivers it and the client's
 *    address is kept; the backend's replies leave through a device's egress,
 *    where they get the frontend's address back;
 *  - to a backend on another node (externalTrafficPolicy=Cluster), the
 *    source becomes this node's address and a free port, and the packet is
 *    sent straight out of the device the FIB names; the replies come back to
 *    this node's ingress and are translated back and forwarded to the client.
 * A frontend without any endpoint answers with an ICMP port unreachable; one
 * with externalTrafficPolicy=Local and no endpoint on this node drops.
 * Everything else passes untouched. */

#include "lib/common.h"
#include "lib/lb.h"
#include "lib/ct.h"
#include "lib/maglev.h"

/* Source NAT ports: above the kernel's default ephemeral range
 * (ip_local_port_range 32768-60999) and the NodePort range, so that the
 * node's own connections and NodePorts never collide with them. Set by the
 * loader. */
volatile const __u16 snat_port_min = 61000;
volatile const __u16 snat_port_max = 65535;

#define EXTERNAL_FRONTEND (SVC_F_NODE_PORT | SVC_F_EXTERNAL_IP | SVC_F_LOAD_BALANCER)

/* tc_send sends a translated packet on: a source-NATed one (or a reply to
 * a client outside) straight out through the FIB, anything else to the
 * kernel. */
static __always_inline int tc_send(struct __sk_buff *skb, const struct pkt4 *p, bool fib)
{
	bool no_route = false;
	int ret;

	if (!fib)
		return TC_ACT_OK;
	ret = pkt4_forward(skb, p, &no_route);
	if (no_route)
		lb_count(LB_M_TC_NO_ROUTE);
	return ret;
}

/* tc_xlate_orig rewrites a client's packet as its flow's entry e says. */
static __always_inline int tc_xlate_orig(struct __sk_buff *skb, struct pkt4 *p,
					 const struct ct4_entry *e)
{
	__be32 saddr = e->nat_saddr, daddr = e->nat_daddr;
	__be16 sport = e->nat_sport, dport = e->nat_dport;
	bool snat = e->flags & CT_F_SNAT;

	if (pkt4_rewrite(skb, p, false, daddr, dport))
		return TC_ACT_SHOT;
	if (snat && pkt4_rewrite(skb, p, true, saddr, sport))
		return TC_ACT_SHOT;
	return tc_send(skb, p, snat);
}

/* tc_orig_valid says whether the tracked flow e still holds for p. A flow
 * lives until it expires; a new TCP connection or a UDP datagram also needs
 * its backend to still be one the ServicePort may choose (kube-proxy
 * clears the UDP flows of removed endpoints), and a source-NATed flow needs
 * its reply entry, which a newer flow may have taken over. */
static __always_inline bool tc_orig_valid(struct ct4_entry *e, const struct pkt4 *p, __u32 now)
{
	struct ct4_entry *r, rval = {};
	struct ct4_key rkey = {};
	struct lb4_backend *be;

	if (ct_expired(e, now))
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
		ct_refresh(r, p, now);
		return true;
	}
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

/* tc_snat_addr is the address source NAT gives a packet to dst: that of
 * the device the FIB sends it out of, else (unless egress_only) that of the
 * device it came in on. 0 if the agent configured none of them. */
static __always_inline __be32 tc_snat_addr(struct __sk_buff *skb, const struct pkt4 *p, __be32 dst,
					   bool egress_only)
{
	struct bpf_fib_lookup fib = {
		.family = PKT_AF_INET,
		.tos = p->tos,
		.l4_protocol = p->proto,
		.ipv4_src = p->saddr,
		.ipv4_dst = dst,
		.ifindex = skb->ifindex,
	};
	struct tc4_snat_addr *a = NULL;
	__u32 ifindex = skb->ifindex;
	long ret;

	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH)
		a = bpf_map_lookup_elem(&tc4_snat_addrs_v1, &fib.ifindex);
	if (!a && !egress_only)
		a = bpf_map_lookup_elem(&tc4_snat_addrs_v1, &ifindex);
	return a ? a->address : 0;
}

/* tc_source_allowed says whether the client may reach a LoadBalancer IP
 * with loadBalancerSourceRanges (kube-proxy drops the others; NodePorts and
 * ExternalIPs of the same Service are open to all). */
static __always_inline bool tc_source_allowed(const struct lb4_service *svc, const struct pkt4 *p)
{
	struct lb4_src_range_key key = {
		.prefixlen = 64,
		.svc_id = svc->svc_id,
		.address = p->saddr,
	};

	return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key) != NULL;
}

/* tc_select picks the backend of a new flow: the one the ServicePort's
 * Maglev table holds for the flow's hash when it has a table, else one at
 * random. */
static __always_inline struct lb4_backend *tc_select(struct lb4_key *lkey,
						     const struct lb4_service *svc,
						     const struct pkt4 *p, __u32 *backend_id)
{
	__u32 hash = flow_hash(p->saddr, p->daddr, p->sport, p->dport, p->proto);
	__u32 id = lb4_maglev_backend_id(svc->svc_id, hash);

	if (id) {
		struct lb4_backend *be = lb4_member_backend(id, svc->svc_id);

		if (be) {
			*backend_id = id;
			lb_count(LB_M_MAGLEV);
			return be;
		}
	}
	return lb4_select_backend(lkey, svc, backend_id);
}

/* tc_new_flow handles the first packet of a flow: a frontend's verdict, a
 * backend, the flow's two entries and the translation. */
static __always_inline int tc_new_flow(struct __sk_buff *skb, struct pkt4 *p, __u32 now)
{
	struct lb4_key lkey = {
		.address = p->daddr,
		.dport = p->dport,
		.proto = p->proto,
	};
	struct ct4_entry orig = {}, rval = {};
	struct ct4_key okey = {}, rkey = {};
	struct lb4_service *svc;
	struct lb4_backend *be;
	__u32 backend_id = 0;
	__be32 snat_addr = 0;
	int ret;

	svc = lb4_lookup_service(&lkey, LB_SCOPE_EXT);
	if (!svc || !(svc->flags & EXTERNAL_FRONTEND))
		return TC_ACT_UNSPEC;
	if (p->fragment) {
		/* Ports are only in the first fragment: translating it alone
		 * would split the packet. The kernel gets it as it is. */
		lb_count(LB_M_TC_FRAGMENT);
		return TC_ACT_UNSPEC;
	}
	if (svc->flags & SVC_F_DROP) {
		lb_count(LB_M_DROP);
		return TC_ACT_SHOT;
	}
	/* Without endpoints every client is refused, inside the source
	 * ranges or not, as kube-proxy's REJECT comes before its firewall. */
	if ((svc->flags & SVC_F_REJECT) || svc->count == 0) {
		lb_count(LB_M_REJECT);
		ret = pkt4_icmp_port_unreach(skb, p);
		if (ret == TC_ACT_SHOT)
			lb_count(LB_M_TC_ICMP_FAIL);
		return ret;
	}
	if ((svc->flags & SVC_F_SOURCE_RANGES) && !tc_source_allowed(svc, p)) {
		lb_count(LB_M_TC_SOURCE_RANGE);
		return TC_ACT_SHOT;
	}
	if (svc->affinity_timeout) {
		/* External clients are told apart by address, as kube-proxy
		 * does; svc_id is shared with the ClusterIP. */
		struct lb4_affinity_key akey = {
			.client = p->saddr,
			.svc_id = svc->svc_id,
			.client_kind = AFFINITY_CLIENT_ADDR,
		};

		be = lb4_affinity_backend(&akey, svc, bpf_ktime_get_ns(), &backend_id);
		if (!be) {
			be = tc_select(&lkey, svc, p, &backend_id);
			if (be)
				lb4_affinity_record(&akey, bpf_ktime_get_ns(), backend_id);
		}
	} else {
		be = tc_select(&lkey, svc, p, &backend_id);
	}
	if (!be)
		return TC_ACT_SHOT;

	orig.nat_daddr = be->address;
	orig.nat_dport = be->port;
	orig.backend_id = backend_id;
	orig.svc_id = svc->svc_id;
	ct_refresh(&orig, p, now);
	rval.nat_saddr = p->daddr;
	rval.nat_sport = p->dport;
	rval.backend_id = backend_id;
	rval.svc_id = svc->svc_id;
	rval.expires = orig.expires;
	rval.flags = orig.flags;
	rkey.saddr = be->address;
	rkey.sport = be->port;
	rkey.proto = p->proto;
	rkey.dir = CT_DIR_REPLY;

	if (!(be->flags & BE_F_LOCAL)) {
		snat_addr = tc_snat_addr(skb, p, be->address, false);
		if (!snat_addr) {
			lb_count(LB_M_TC_SNAT_NO_ADDR);
			return TC_ACT_SHOT;
		}
	} else if (!(svc->flags & SVC_F_EXT_LOCAL)) {
		/* kube-proxy masquerades externalTrafficPolicy=Cluster traffic
		 * to endpoints on the node too, to the address of the device
		 * toward the pod. Its replies must then meet a program on that
		 * device: only when the agent attached there (its address is
		 * known) does the pod see the node; else it sees the client. */
		snat_addr = tc_snat_addr(skb, p, be->address, true);
	}

	if (!snat_addr) {
		rkey.daddr = p->saddr;
		rkey.dport = p->sport;
		if (bpf_map_update_elem(&tc4_ct_v1, &rkey, &rval, BPF_ANY)) {
			lb_count(LB_M_TC_CT_FULL);
			return TC_ACT_SHOT;
		}
		lb_count(LB_M_TC_NEW_LOCAL);
	} else {
		rkey.daddr = snat_addr;
		rval.nat_daddr = p->saddr;
		rval.nat_dport = p->sport;
		rval.flags |= CT_F_SNAT;
		if (ct_snat_alloc(&rkey, &rval, snat_port_min, snat_port_max, now)) {
			lb_count(LB_M_TC_SNAT_NO_PORT);
			return TC_ACT_SHOT;
		}
		orig.nat_saddr = snat_addr;
		orig.nat_sport = rkey.dport;
		orig.flags |= CT_F_SNAT;
		lb_count(LB_M_TC_NEW_SNAT);
	}
	okey.saddr = p->saddr;
	okey.daddr = p->daddr;
	okey.sport = p->sport;
	okey.dport = p->dport;
	okey.proto = p->proto;
	okey.dir = CT_DIR_ORIG;
	if (bpf_map_update_elem(&tc4_ct_v1, &okey, &orig, BPF_ANY)) {
		bpf_map_delete_elem(&tc4_ct_v1, &rkey);
		lb_count(LB_M_TC_CT_FULL);
		return TC_ACT_SHOT;
	}
	return tc_xlate_orig(skb, p, &orig);
}

/* tc_reply rewrites a backend's reply by its entry e: the source becomes
 * the frontend again, and for a source-NATed flow the destination becomes
 * the client, which the packet is then forwarded to. */
static __always_inline int tc_reply(struct __sk_buff *skb, struct pkt4 *p, struct ct4_entry *e,
				    __u32 now)
{
	__be32 saddr = e->nat_saddr, daddr = e->nat_daddr;
	__be16 sport = e->nat_sport, dport = e->nat_dport;
	bool snat = e->flags & CT_F_SNAT;

	ct_refresh(e, p, now);
	if (pkt4_rewrite(skb, p, true, saddr, sport))
		return TC_ACT_SHOT;
	if (snat && pkt4_rewrite(skb, p, false, daddr, dport))
		return TC_ACT_SHOT;
	lb_count(LB_M_TC_REPLY);
	return tc_send(skb, p, snat);
}

/* tc_icmp_error translates an ICMP error about a tracked flow, so that it
 * reaches the host that sent the quoted packet, quoting that packet as it
 * was sent: what kube-proxy's conntrack does for RELATED traffic, and what
 * path MTU discovery needs.
 *  - At ingress, about a reply we sent to a client (F:fport -> C:cport), for
 *    instance "fragmentation needed" from a router on the way: it goes to
 *    the backend, about its own reply (P:port -> C:cport, or -> S:sport
 *    with source NAT).
 *  - About a packet we sent to a backend (C:cport or S:sport -> P:port),
 *    from the backend's side (at ingress with source NAT, at egress from a
 *    local backend without): it goes to the client, about its own packet
 *    (C:cport -> F:fport), from the frontend when the backend sent it. */
static __always_inline int tc_icmp_error(struct __sk_buff *skb, struct pkt4 *p, bool egress)
{
	struct pkt4_inner in = {};
	struct ct4_key key = {};
	struct ct4_entry *e;
	bool snat;

	if (pkt4_parse_icmp_err(skb, p, &in))
		return TC_ACT_UNSPEC;
	/* The flow of the quoted packet, seen from the other end. */
	key.saddr = in.daddr;
	key.daddr = in.saddr;
	key.sport = in.dport;
	key.dport = in.sport;
	key.proto = in.proto;
	if (!egress) {
		key.dir = CT_DIR_ORIG;
		e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
		if (e && p->daddr == in.saddr) {
			__be32 be_addr = e->nat_daddr, snat_addr = e->nat_saddr;
			__be16 be_port = e->nat_dport, snat_port = e->nat_sport;

			snat = e->flags & CT_F_SNAT;
			if (pkt4_icmp_rewrite_outer(skb, p, false, be_addr) ||
			    pkt4_icmp_rewrite_inner(skb, p, &in, true, be_addr, be_port) ||
			    (snat &&
			     pkt4_icmp_rewrite_inner(skb, p, &in, false, snat_addr, snat_port)))
				return TC_ACT_SHOT;
			lb_count(LB_M_TC_ICMP_XLATE);
			return tc_send(skb, p, snat);
		}
	}
	key.dir = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
	if (!e)
		return TC_ACT_UNSPEC;
	snat = e->flags & CT_F_SNAT;
	/* Source-NATed flows come back at ingress, the others leave at egress. */
	if (snat == egress || p->daddr != in.saddr)
		return TC_ACT_UNSPEC;
	{
		__be32 fe_addr = e->nat_saddr, client = e->nat_daddr;
		__be16 fe_port = e->nat_sport, client_port = e->nat_dport;

		if ((p->saddr == in.daddr && pkt4_icmp_rewrite_outer(skb, p, true, fe_addr)) ||
		    (snat && pkt4_icmp_rewrite_outer(skb, p, false, client)) ||
		    pkt4_icmp_rewrite_inner(skb, p, &in, false, fe_addr, fe_port) ||
		    (snat && pkt4_icmp_rewrite_inner(skb, p, &in, true, client, client_port)))
			return TC_ACT_SHOT;
	}
	lb_count(LB_M_TC_ICMP_XLATE);
	return tc_send(skb, p, snat);
}

/* tc_forget_stale_reply drops the reply entry of an earlier flow that a new
 * connection reuses: a client that reached a local backend through a
 * frontend, and now connects to that backend directly (a pod on another
 * node through the ClusterIP) from the same port, must not have the
 * backend's answers rewritten to come from the frontend. A new SYN is the
 * only packet that can start such a connection. */
static __always_inline void tc_forget_stale_reply(const struct pkt4 *p)
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

/* tc_backend_gone says whether the backend of the tracked TCP flow e was
 * removed: its id is no longer in lb4_backends_v1, or names another endpoint
 * now. internal/maps keeps a terminating endpoint there until its
 * EndpointSlice drops it, so that its flows live on meanwhile. A new SYN on
 * the tuple is a new connection, which selects again. */
static __always_inline bool tc_backend_gone(const struct ct4_entry *e, const struct pkt4 *p,
					    __u32 now)
{
	struct lb4_backend *be;
	__u32 id = e->backend_id;

	if (p->proto != IPPROTO_TCP || ct_expired(e, now) ||
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return false;
	be = bpf_map_lookup_elem(&lb4_backends_v1, &id);
	return !be || be->address != e->nat_daddr || be->port != e->nat_dport ||
	       be->proto != p->proto;
}

/* tc_reset ends the flow of p (its entry e, under okey), whose backend was
 * removed: the client gets a reset from the frontend at its next segment,
 * rather than retransmitting to a pod that is gone until its own timeout
 * (kube-proxy leaves it so), and the flow's entries go, freeing its source
 * NAT port. A reset from the client only ends the flow. */
static __always_inline int tc_reset(struct __sk_buff *skb, const struct pkt4 *p,
				    const struct ct4_key *okey, const struct ct4_entry *e)
{
	struct ct4_key rkey = {};
	struct ct4_entry *r;
	int ret;

	ct_reply_key(&rkey, e, p);
	bpf_map_delete_elem(&tc4_ct_v1, okey);
	r = bpf_map_lookup_elem(&tc4_ct_v1, &rkey);
	/* Only the flow's own: a newer flow may hold its source NAT port. */
	if (r && r->nat_saddr == p->daddr && r->nat_sport == p->dport &&
	    (!(r->flags & CT_F_SNAT) || (r->nat_daddr == p->saddr && r->nat_dport == p->sport)))
		bpf_map_delete_elem(&tc4_ct_v1, &rkey);
	if (p->tcp_flags & TCP_FLAG_RST)
		return TC_ACT_SHOT;
	ret = pkt4_tcp_rst(skb, p);
	lb_count(ret == TC_ACT_SHOT ? LB_M_TC_RESET_FAIL : LB_M_TC_RESET);
	return ret;
}

SEC("tc")
int tc_ingress(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	struct ct4_key key = {};
	struct ct4_entry *e;
	__u16 port;
	__u32 now;

	switch (pkt4_parse(skb, &p)) {
	case PKT_OK:
		break;
	case PKT_ICMP:
		return tc_icmp_error(skb, &p, false);
	default:
		return TC_ACT_UNSPEC;
	}
	now = ct_now();
	key.saddr = p.saddr;
	key.daddr = p.daddr;
	key.sport = p.sport;
	key.dport = p.dport;
	key.proto = p.proto;
	if (!p.fragment) {
		key.dir = CT_DIR_ORIG;
		e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
		if (e && tc_backend_gone(e, &p, now))
			return tc_reset(skb, &p, &key, e);
		if (e && tc_orig_valid(e, &p, now)) {
			ct_refresh(e, &p, now);
			lb_count(LB_M_TC_FWD);
			return tc_xlate_orig(skb, &p, e);
		}
		if (p.proto == IPPROTO_TCP &&
		    (p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
			tc_forget_stale_reply(&p);
		/* Replies to source-NATed flows come back to a port of the
		 * source NAT range: most packets need no second lookup. */
		port = bpf_ntohs(p.dport);
		if (port >= snat_port_min && port <= snat_port_max) {
			key.dir = CT_DIR_REPLY;
			e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
			if (e && (e->flags & CT_F_SNAT))
				return tc_reply(skb, &p, e, now);
		}
	}
	return tc_new_flow(skb, &p, now);
}

SEC("tc")
int tc_egress(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	struct ct4_key key = {};
	struct ct4_entry *e;

	switch (pkt4_parse(skb, &p)) {
	case PKT_OK:
		break;
	case PKT_ICMP:
		return tc_icmp_error(skb, &p, true);
	default:
		return TC_ACT_UNSPEC;
	}
	if (p.fragment)
		return TC_ACT_UNSPEC;
	key.saddr = p.saddr;
	key.daddr = p.daddr;
	key.sport = p.sport;
	key.dport = p.dport;
	key.proto = p.proto;
	key.dir = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(&tc4_ct_v1, &key);
	if (!e || (e->flags & CT_F_SNAT))
		return TC_ACT_UNSPEC;
	return tc_reply(skb, &p, e, ct_now());
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
