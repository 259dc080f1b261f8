// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* NodePort, ExternalIP and LoadBalancer-IP translation on the node's devices,
 * for traffic from outside the node, which never passes a socket hook; and
 * per-packet Service translation for pods whose sockets the socket hooks
 * leave alone (tc_pod_ingress).
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
 * A TCP flow whose backend was removed gets a reset from the frontend at
 * the client's next segment. Everything else passes untouched. */

#include "lib/common.h"
#include "lib/fwd.h"
#include "lib/nfct.h"
#include "lib/nodeport.h"
#include "lib/parse.h"
#include "lib/reset.h"
#include "lib/rewrite.h"
#include "lib/unreach.h"

/* tc_send sends a translated packet on (p a struct pkt6 when v6, else a
 * struct pkt4): a source-NATed one (or a reply to a client outside)
 * straight out through the FIB, anything else to the kernel. e, if not
 * NULL, is the entry the packet was translated by, which keeps the FIB's
 * answer for the flow's next packets of second now (fwd.h).
 *
 * direct lets the rewrite store in place (rewrite.h): the ingress program
 * does, where every packet the node receives passes; the egress program
 * does not, as it would make the kernel unclone every cloned skb the node
 * sends (TCP keeps a clone of each segment) before the program runs. */
static __always_inline int tc_send(struct __sk_buff *skb, bool direct, bool v6, const void *p,
				   bool fib, void *e, __u32 now)
{
	bool no_route = false;
	int ret;

	if (!fib)
		return TC_ACT_OK;
	ret = pkt_forward(skb, direct, v6, p, e, now, &no_route);
	if (no_route)
		lb_count(LB_M_TC_NO_ROUTE);
	return ret;
}

/* tc_xlate rewrites p, a packet of family v6, by its flow's entry and
 * sends it on: the destination (reply false: a client's packet) or the
 * source (a backend's reply) from the entry's nat_d* or nat_s*, and with
 * source NAT the other side too. The entry is tracked (the map's) or, for
 * a new flow, orig (its copy, which keeps the route that chose its source
 * NAT address, np_snat_addr). Either stays valid across the helpers that
 * change the packet. */
static __always_inline int tc_xlate(struct __sk_buff *skb, bool direct, bool v6, void *p,
				    void *tracked, void *orig, bool reply, __u32 now)
{
	void *e = tracked ? tracked : orig;
	bool snat = CT_E(e, v6, flags) & CT_F_SNAT;
	int err;

	if (v6) {
		struct ct6_entry *e6 = e;

		if (snat)
			err = pkt6_rewrite_both(skb, direct, p, e6->nat_saddr, e6->nat_sport,
						e6->nat_daddr, e6->nat_dport);
		else if (reply)
			err = pkt6_rewrite(skb, direct, p, true, e6->nat_saddr, e6->nat_sport);
		else
			err = pkt6_rewrite(skb, direct, p, false, e6->nat_daddr, e6->nat_dport);
	} else {
		struct ct4_entry *e4 = e;
		__be32 saddr = e4->nat_saddr, daddr = e4->nat_daddr;
		__be16 sport = e4->nat_sport, dport = e4->nat_dport;

		if (snat)
			err = pkt4_rewrite_both(skb, direct, p, saddr, sport, daddr, dport);
		else if (reply)
			err = pkt4_rewrite(skb, direct, p, true, saddr, sport);
		else
			err = pkt4_rewrite(skb, direct, p, false, daddr, dport);
	}
	if (err)
		return TC_ACT_SHOT;
	if (reply)
		lb_count(LB_M_TC_REPLY);
	/* At egress (direct false) the packet already leaves by the device
	 * its route names: a port-only source NAT's reply (tc_egress_flow). */
	return tc_send(skb, direct, v6, p, snat && direct, e, now);
}

/* tc_reply rewrites a backend's reply p, of family v6, that a device
 * received, by its entry e: the source becomes the frontend again, and for
 * a source-NATed flow the destination becomes the client, which the packet
 * is then forwarded to. (A local backend's reply, at egress, is never
 * source-NATed: tc_egress refreshes its entry and translates it.) */
static __always_inline int tc_reply(struct __sk_buff *skb, bool v6, void *p, void *e, __u32 now)
{
	np_reply_seen(e, v6, p);
	ct_refresh_v(e, v6, PKT_F(p, v6, proto), PKT_F(p, v6, tcp_flags), now, true);
	return tc_xlate(skb, true, v6, p, e, NULL, true, now);
}

/* tc_icmp_error translates an ICMP error about a tracked flow, so that it
 * reaches the host that sent the quoted packet, quoting that packet as it
 * was sent: what kube-proxy's conntrack does for RELATED traffic, and what
 * path MTU discovery needs.
 *  - At ingress, about a reply we sent to a client (F:fport -> C:cport), for
 *    instance "fragmentation needed" (ICMPv6: packet too big) from a router
 *    on the way: it goes to the backend, about its own reply (P:port ->
 *    C:cport, or -> S:sport with source NAT).
 *  - About a packet we sent to a backend (C:cport or S:sport -> P:port),
 *    from the backend's side (at ingress with source NAT, at egress from a
 *    local backend without): it goes to the client, about its own packet
 *    (C:cport -> F:fport), from the frontend when the backend sent it.
 * Written once for ICMP and ICMPv6: v6 says whether p is a struct pkt6 (an
 * ICMPv6 message, with tc6_ct_v1's flows) or a struct pkt4. */
static __always_inline int tc_icmp_error(struct __sk_buff *skb, bool v6, void *p, bool egress)
{
	struct pkt4_inner in4 = {};
	struct pkt6_inner in6 = {};
	struct ct4_key key4 = {};
	struct ct6_key key6 = {};
	struct pkt_inner *in = v6 ? &in6.q : &in4.q;
	void *key = v6 ? (void *)&key6 : (void *)&key4;
	__u32 icmp_csum = PKT_F(p, v6, csum_off);
	void *e;
	bool snat;

	if (pkt_parse_icmp_err(skb, v6, p, in))
		return TC_ACT_UNSPEC;
	/* The flow of the quoted packet, seen from the other end. */
	pkt_addr_copy(v6, CT_K_ADDR(key, v6, saddr), PKT_IN_ADDR(in, v6, daddr));
	pkt_addr_copy(v6, CT_K_ADDR(key, v6, daddr), PKT_IN_ADDR(in, v6, saddr));
	CT_K(key, v6, sport) = in->dport;
	CT_K(key, v6, dport) = in->sport;
	CT_K(key, v6, proto) = in->proto;
	if (!egress) {
		CT_K(key, v6, dir) = CT_DIR_ORIG;
		e = bpf_map_lookup_elem(ct_map(v6), key);
		/* e stays valid across the helpers that change the packet. */
		if (e && pkt_addr_eq(v6, PKT_ADDR(p, v6, daddr), PKT_IN_ADDR(in, v6, saddr))) {
			snat = CT_E(e, v6, flags) & CT_F_SNAT;
			if (pkt_icmp_rewrite_outer(skb, v6, p, false,
						   CT_E_ADDR(e, v6, nat_daddr)) ||
			    pkt_icmp_rewrite_inner(skb, v6, icmp_csum, in, true,
						   CT_E_ADDR(e, v6, nat_daddr),
						   CT_E(e, v6, nat_dport)) ||
			    (snat && pkt_icmp_rewrite_inner(skb, v6, icmp_csum, in, false,
							    CT_E_ADDR(e, v6, nat_saddr),
							    CT_E(e, v6, nat_sport))))
				return TC_ACT_SHOT;
			goto send;
		}
	}
	CT_K(key, v6, dir) = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(ct_map(v6), key);
	if (!e)
		return TC_ACT_UNSPEC;
	snat = CT_E(e, v6, flags) & CT_F_SNAT;
	/* Source-NATed flows come back at ingress, the others leave at
	 * egress; a flow whose source NAT kept the client's address (a port
	 * clash, np_record) may do either (tc_egress_flow). */
	if (!pkt_addr_eq(v6, PKT_ADDR(p, v6, daddr), PKT_IN_ADDR(in, v6, saddr)) ||
	    (snat == egress &&
	     !(snat && pkt_addr_eq(v6, CT_E_ADDR(e, v6, nat_daddr), PKT_IN_ADDR(in, v6, saddr)))))
		return TC_ACT_UNSPEC;
	/* The frontend is e's nat_s*, the client its nat_d*. */
	if ((pkt_addr_eq(v6, PKT_ADDR(p, v6, saddr), PKT_IN_ADDR(in, v6, daddr)) &&
	     pkt_icmp_rewrite_outer(skb, v6, p, true, CT_E_ADDR(e, v6, nat_saddr))) ||
	    (snat && pkt_icmp_rewrite_outer(skb, v6, p, false, CT_E_ADDR(e, v6, nat_daddr))) ||
	    pkt_icmp_rewrite_inner(skb, v6, icmp_csum, in, false, CT_E_ADDR(e, v6, nat_saddr),
				   CT_E(e, v6, nat_sport)) ||
	    (snat && pkt_icmp_rewrite_inner(skb, v6, icmp_csum, in, true,
					    CT_E_ADDR(e, v6, nat_daddr), CT_E(e, v6, nat_dport))))
		return TC_ACT_SHOT;
send:
	lb_count(LB_M_TC_ICMP_XLATE);
	return tc_send(skb, false, v6, p, snat && !egress, NULL, 0);
}

/* tc_reset ends the tracked flow of p, a packet of family v6 (its
 * client-side entry e), whose backend was removed (np_backend_gone): the
 * client gets a reset from the frontend at its next segment, rather than
 * retransmitting to a pod that is gone until its own timeout (kube-proxy
 * leaves it so), and the flow's entries go, freeing its source NAT port. A
 * reset from the client only ends the flow. */
static __always_inline int tc_reset(struct __sk_buff *skb, bool v6, const void *p, const void *e)
{
	union {
		struct ct4_key k4;
		struct ct6_key k6;
	} okey, rkey;
	void *map = ct_map(v6);
	void *r;
	int ret;

	ct_orig_key(&okey, v6, p);
	ct_reply_key(&rkey, v6, e, p);
	bpf_map_delete_elem(map, &okey);
	r = bpf_map_lookup_elem(map, &rkey);
	/* Only the flow's own: a newer flow may hold its source NAT port. */
	if (r && pkt_addr_eq(v6, CT_E_ADDR(r, v6, nat_saddr), PKT_ADDR(p, v6, daddr)) &&
	    CT_E(r, v6, nat_sport) == PKT_F(p, v6, dport) &&
	    (!(CT_E(r, v6, flags) & CT_F_SNAT) ||
	     (pkt_addr_eq(v6, CT_E_ADDR(r, v6, nat_daddr), PKT_ADDR(p, v6, saddr)) &&
	      CT_E(r, v6, nat_dport) == PKT_F(p, v6, sport))))
		bpf_map_delete_elem(map, &rkey);
	if (PKT_F(p, v6, tcp_flags) & TCP_FLAG_RST)
		return TC_ACT_SHOT;
	ret = pkt_tcp_rst(skb, v6, p);
	lb_count(ret == TC_ACT_SHOT ? LB_M_TC_RESET_FAIL : LB_M_TC_RESET);
	return ret;
}

/* tc_record records a new flow p of family v6 to the backend of c (a
 * struct np_choice) and translates it; pod as np_decide's.
 * Its entry is zeroed here, not in tc_new_flow: the verdicts that stop
 * there (drops, refusals, packets to no frontend) skip that cost. Of the
 * family's pair of entries, the other is never used: the compiler drops
 * it. */
static __always_inline int tc_record(struct __sk_buff *skb, bool v6, void *p,
				     const struct np_choice *c, __u32 now, bool pod)
{
	struct ct4_entry orig = {};
	struct ct6_entry orig6 = {};
	void *o;
	bool snat;
	int err;

	err = np_record(skb, v6, skb->ifindex, p, c, now, v6 ? (void *)&orig6 : (void *)&orig, pod);
	if (err)
		return TC_ACT_SHOT;
	/* Counted as a flow that keeps its client's address when only its
	 * source port changed (a clash, np_record): np_record counted that. */
	o = v6 ? (void *)&orig6 : (void *)&orig;
	snat = (CT_E(o, v6, flags) & CT_F_SNAT) &&
	       !pkt_addr_eq(v6, CT_E_ADDR(o, v6, nat_saddr), PKT_ADDR(p, v6, saddr));
	if (pod)
		lb_count(snat ? LB_M_TC_POD_SNAT : LB_M_TC_POD_NEW);
	else
		lb_count(snat ? LB_M_TC_NEW_SNAT : LB_M_TC_NEW_LOCAL);
	return tc_xlate(skb, true, v6, p, NULL, o, false, now);
}

/* tc_new_flow handles the first packet of a flow of family v6: a
 * frontend's verdict, a backend, the flow's two entries and the
 * translation (nodeport.h); pod says p comes from a pod, translated per
 * packet (np_decide). */
static __always_inline int tc_new_flow(struct __sk_buff *skb, bool v6, void *p, __u32 now, bool pod)
{
	struct np_choice c = {};
	enum np_verdict verdict;
	int ret;

	verdict = np_decide(v6, p, &c, true, pod);
	switch (verdict) {
	case NP_NOT_OURS:
		return TC_ACT_UNSPEC;
	case NP_FRAGMENT:
		lb_count(LB_M_TC_FRAGMENT);
		return TC_ACT_UNSPEC;
	default:
		break;
	}
	/* A TCP segment other than a SYN begins no connection: of a flow the
	 * kernel's connection tracking translated before the agent took the
	 * frontend over, it stays the kernel's (nfct.h), whatever the
	 * frontend's verdict now, as kube-proxy's rules judge new connections
	 * only. */
	if (PKT_F(p, v6, proto) == IPPROTO_TCP && !(PKT_F(p, v6, tcp_flags) & TCP_FLAG_SYN) &&
	    nfct_tracks(skb, v6, p)) {
		lb_count(LB_M_TC_NF_TRACKED);
		return TC_ACT_UNSPEC;
	}
	switch (verdict) {
	case NP_DROP:
		lb_count(LB_M_DROP);
		return TC_ACT_SHOT;
	case NP_REJECT:
		lb_count(LB_M_REJECT);
		ret = pkt_icmp_port_unreach(skb, v6, p);
		if (ret == TC_ACT_SHOT)
			lb_count(LB_M_TC_ICMP_FAIL);
		return ret;
	case NP_SRC_RANGE:
		lb_count(LB_M_TC_SOURCE_RANGE);
		return TC_ACT_SHOT;
	case NP_FORWARD:
		break;
	default:
		return TC_ACT_SHOT;
	}
	return tc_record(skb, v6, p, &c, now, pod);
}

/* TC_NEW_FLOW is what tc_ingress_flow returns for the first packet of a
 * flow, which tc_ingress hands to the family's tc_new_flow: never a TC
 * action. */
#define TC_NEW_FLOW 0x10000

/* tc_ingress_flow handles p, a TCP or UDP packet of family v6 that a
 * device received (IPv4 fragments included: a fragment is never tracked,
 * and its frontend decides it), unless it begins a flow: then it returns
 * TC_NEW_FLOW. pod says the device is a pod's: every port may be a
 * frontend's, ClusterIPs' too. */
static __always_inline int tc_ingress_flow(struct __sk_buff *skb, bool v6, void *p, bool pod)
{
	bool reply = false;
	void *e;
	__u32 now;

	/* A fragment without ports (not the first) is passed here too: its
	 * port is 0, no frontend's. */
	if (!pod && !np_port_wanted(v6, p))
		return TC_ACT_UNSPEC;
	now = ct_now();
	if (v6 || !((struct pkt4 *)p)->fragment) {
		e = np_lookup_tracked(v6, p, now, &reply, pod);
		if (e && reply)
			return tc_reply(skb, v6, p, e, now);
		if (reply) {
			lb_count(LB_M_TC_SNAT_LATE);
			return TC_ACT_UNSPEC;
		}
		if (e && np_backend_gone(e, v6, p, now))
			return tc_reset(skb, v6, p, e);
		if (e) {
			np_checked(e, v6, now);
			if (pod && PKT_F(p, v6, proto) == IPPROTO_UDP)
				np_reply_restore(e, v6, p);
			lb_count(LB_M_TC_FWD);
			return tc_xlate(skb, true, v6, p, e, NULL, false, now);
		}
		/* A pod's datagram of no tracked flow may go straight to the
		 * backend an earlier flow from its port reached through a
		 * frontend (a UDP socket connected again): the backend's
		 * answers are its own now, not the frontend's, as TCP's are
		 * after a new SYN (np_lookup_tracked). */
		if (pod && PKT_F(p, v6, proto) == IPPROTO_UDP)
			np_forget_stale_reply(v6, p, true);
	}
	return TC_NEW_FLOW;
}

/* tc_egress_flow handles p, a TCP or UDP packet of family v6 that the node
 * sends: a local backend's reply to a client from outside, or to a pod
 * translated per packet, which its flow's reply entry translates. A
 * source-NATed flow's replies come in at ingress, but for those of a flow
 * that kept its client's address on another port (a source port clash,
 * np_record): where the backend's device has no program, they meet one
 * only here, at the egress of the device toward the client. */
static __always_inline int tc_egress_flow(struct __sk_buff *skb, bool v6, void *p)
{
	struct ct4_key key4 = {};
	struct ct6_key key6 = {};
	void *key = v6 ? (void *)&key6 : (void *)&key4;
	void *e;
	__u32 now;

	ct_orig_key(key, v6, p);
	CT_K(key, v6, dir) = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(ct_map(v6), key);
	if (!e)
		return TC_ACT_UNSPEC;
	if (CT_E(e, v6, flags) & CT_F_SNAT) {
		if (!pkt_addr_eq(v6, CT_E_ADDR(e, v6, nat_daddr), PKT_ADDR(p, v6, daddr)))
			return TC_ACT_UNSPEC;
		np_reply_seen(e, v6, p);
	}
	now = ct_now();
	ct_refresh_v(e, v6, PKT_F(p, v6, proto), PKT_F(p, v6, tcp_flags), now, true);
	return tc_xlate(skb, false, v6, p, e, NULL, true, now);
}

/* The programs parse a packet by its family and hand it on; ICMP errors
 * go to tc_icmp_error. IPv6 packets with extension headers (fragments
 * among them) and ICMPv6 other than errors about tracked flows (neighbour
 * discovery, echo) pass untouched.
 *
 * tc_ingress's paths are global functions, one per family for the packets
 * of tracked flows and ICMP errors, one per family for the first packet of
 * a flow: the verifier checks each once, on its own, and frees what it
 * learnt of one before it checks the next. Inlined in one program, every
 * path's states were held at once: 45 MiB charged to the agent's memory
 * cgroup while it loads, on kernels that charge the verifier's memory. A
 * first packet is parsed twice, once in each function, since the frames
 * of a program and the functions it calls share the verifier's 512 bytes
 * of stack. A global function's context argument is never null, as far as
 * the verifier knows too: no check. */
static __always_inline int tc_tracked4(struct __sk_buff *skb, bool pod)
{
	struct pkt4 p = {};

	switch (pkt4_parse(skb, &p)) {
	case PKT_OK:
		return tc_ingress_flow(skb, false, &p, pod);
	case PKT_ICMP:
		return tc_icmp_error(skb, false, &p, false);
	default:
		return TC_ACT_UNSPEC;
	}
}

static __always_inline int tc_tracked6(struct __sk_buff *skb, bool pod)
{
	struct pkt6 p = {};

	switch (pkt6_parse(skb, &p)) {
	case PKT_OK:
		return tc_ingress_flow(skb, true, &p, pod);
	case PKT_ICMP:
		return tc_icmp_error(skb, true, &p, false);
	default:
		return TC_ACT_UNSPEC;
	}
}

static __always_inline int tc_new4(struct __sk_buff *skb, bool pod)
{
	struct pkt4 p = {};

	if (pkt4_parse(skb, &p) != PKT_OK)
		return TC_ACT_SHOT;
	return tc_new_flow(skb, false, &p, ct_now(), pod);
}

static __always_inline int tc_new6(struct __sk_buff *skb, bool pod)
{
	struct pkt6 p = {};

	if (pkt6_parse(skb, &p) != PKT_OK)
		return TC_ACT_SHOT;
	return tc_new_flow(skb, true, &p, ct_now(), pod);
}

__noinline int tc_ingress4(struct __sk_buff *skb)
{
	return tc_tracked4(skb, false);
}
__noinline int tc_ingress6(struct __sk_buff *skb)
{
	return tc_tracked6(skb, false);
}
__noinline int tc_new_flow4(struct __sk_buff *skb)
{
	return tc_new4(skb, false);
}
__noinline int tc_new_flow6(struct __sk_buff *skb)
{
	return tc_new6(skb, false);
}

SEC("tc")
int tc_ingress(struct __sk_buff *skb)
{
	int ret;

	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		ret = tc_ingress6(skb);
		return ret == TC_NEW_FLOW ? tc_new_flow6(skb) : ret;
	}
	ret = tc_ingress4(skb);
	return ret == TC_NEW_FLOW ? tc_new_flow4(skb) : ret;
}

/* Per-packet translation for pods, at the ingress of a pod's device on the
 * node (the host side of its veth): what its sockets would get from the
 * socket programs, for pods those leave alone (a service mesh's sidecar
 * must see the ClusterIP its pod connected to). The pod's replies from a
 * backend are translated back at that device's egress by tc_egress, the
 * replies of a hairpin here. The same paths as tc_ingress's, with every
 * port a frontend's and the inside verdicts (np_decide). */
__noinline int tc_pod_tracked4(struct __sk_buff *skb)
{
	return tc_tracked4(skb, true);
}
__noinline int tc_pod_tracked6(struct __sk_buff *skb)
{
	return tc_tracked6(skb, true);
}
__noinline int tc_pod_new_flow4(struct __sk_buff *skb)
{
	return tc_new4(skb, true);
}
__noinline int tc_pod_new_flow6(struct __sk_buff *skb)
{
	return tc_new6(skb, true);
}

SEC("tc")
int tc_pod_ingress(struct __sk_buff *skb)
{
	int ret;

	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		ret = tc_pod_tracked6(skb);
		return ret == TC_NEW_FLOW ? tc_pod_new_flow6(skb) : ret;
	}
	ret = tc_pod_tracked4(skb);
	return ret == TC_NEW_FLOW ? tc_pod_new_flow4(skb) : ret;
}

SEC("tc")
int tc_egress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct pkt6 p = {};

		switch (pkt6_parse(skb, &p)) {
		case PKT_OK:
			return tc_egress_flow(skb, true, &p);
		case PKT_ICMP:
			return tc_icmp_error(skb, true, &p, true);
		default:
			return TC_ACT_UNSPEC;
		}
	}
	struct pkt4 p = {};

	switch (pkt4_parse(skb, &p)) {
	case PKT_OK:
		if (p.fragment)
			return TC_ACT_UNSPEC;
		return tc_egress_flow(skb, false, &p);
	case PKT_ICMP:
		return tc_icmp_error(skb, false, &p, true);
	default:
		return TC_ACT_UNSPEC;
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
