// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The XDP fast path for traffic from outside to NodePorts, ExternalIPs and
 * LoadBalancer IPs whose backend is on another node
 * (externalTrafficPolicy=Cluster), IPv4 and IPv6: such packets come in and
 * go straight back out, so they are translated and sent before the kernel
 * builds an skb.
 *  - the client's packets of a source-NATed flow: DNAT to the backend and
 *    SNAT to the node, out of the device the FIB names;
 *  - the backend's replies to a source NAT port: back to the client from the
 *    frontend;
 *  - the first packet of a flow: the verdict, backend and connection
 *    tracking entries of tc.c (lib/nodeport.h), then as above.
 * The TC programs stay attached and do everything else, which this program
 * passes: local backends, policy Local, refusals with an ICMP answer, resets
 * of TCP flows whose backend was removed, ICMP and ICMPv6 (neighbour
 * discovery among it), fragments, IP options and IPv6 extension headers,
 * multi-buffer frames, frames whose next hop needs neighbour resolution or
 * is out of a device without this program.
 * Both share the connection tracking map, so a flow may move between them
 * (XDP detached, or its next packet passed). */

#include "lib/common.h"
#include "lib/nodeport.h"
#include "lib/parse.h"
#include "lib/rewrite.h"

#define XDP4_DEVS_MAX 256

/* The devices this program is attached to, by ifindex: a translated frame
 * of either family is redirected only to those, which take XDP frames; for
 * any other device it is passed to TC. Written by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, XDP4_DEVS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xdp4_devs_v1 SEC(".maps");

/* The flow helpers below take the family as an argument, v6, a constant at
 * every call, as lib/ct.h's do: p is then a struct pkt6 (else a struct
 * pkt4) and e a struct ct6_entry (else a struct ct4_entry). */

/* xdp_next_hop fills fib with the next hop for the packet p whose flow's
 * entry e gives its new tuple: the one e keeps from an earlier lookup of
 * the same second (ct_fib_get), else a FIB lookup's, which e then keeps.
 * Returns false when the FIB cannot resolve it on its own (no neighbour
 * entry, no route, too big for the MTU). */
static __always_inline bool xdp_next_hop(struct xdp_md *ctx, bool v6, const void *p, void *e,
					 __u32 now, struct bpf_fib_lookup *fib)
{
	__u16 len;

	if (v6) {
		const struct pkt6 *p6 = p;
		const struct ct6_entry *e6 = e;

		len = sizeof(struct pkt_ipv6hdr) + p6->payload_len;
		fib->family = PKT_AF_INET6;
		__builtin_memcpy(fib->ipv6_src, e6->nat_saddr, sizeof(fib->ipv6_src));
		__builtin_memcpy(fib->ipv6_dst, e6->nat_daddr, sizeof(fib->ipv6_dst));
	} else {
		const struct pkt4 *p4 = p;
		const struct ct4_entry *e4 = e;

		len = p4->tot_len;
		fib->family = PKT_AF_INET;
		fib->tos = p4->tos;
		fib->ipv4_src = e4->nat_saddr;
		fib->ipv4_dst = e4->nat_daddr;
	}
	if (ct_fib_get(e, v6, now, len, fib))
		return true;
	fib->tot_len = len;
	if (bpf_fib_lookup(ctx, fib, sizeof(*fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return false;
	ct_fib_put(e, v6, now, len, fib);
	return true;
}

/* xdp_send rewrites the frame that p describes to the tuple that the
 * flow's entry e gives its packets (both entries of a source-NATed flow hold
 * all four of it) and sends it to that destination (xdp_next_hop): back out
 * of the device it came in on, or redirected to another device with this
 * program. Anything the FIB cannot resolve on its own and any other egress
 * device is passed untouched, for TC to do or drop as it does. */
static __always_inline int xdp_send(struct xdp_md *ctx, bool v6, const void *p, void *e, __u32 now)
{
	struct bpf_fib_lookup fib = {
		.l4_protocol = PKT_F(p, v6, proto),
		.sport = CT_E(e, v6, nat_sport),
		.dport = CT_E(e, v6, nat_dport),
		.ifindex = ctx->ingress_ifindex,
	};
	__u32 ifindex = ctx->ingress_ifindex;

	if (v6 ? ((const struct pkt6 *)p)->hop_limit <= 1 : ((const struct pkt4 *)p)->ttl <= 1)
		goto pass;
	if (!xdp_next_hop(ctx, v6, p, e, now, &fib))
		goto pass;
	if (fib.ifindex != ifindex && !bpf_map_lookup_elem(&xdp4_devs_v1, &fib.ifindex))
		goto pass;
	if (xdp_pkt_rewrite(ctx, v6, p, e, &fib))
		goto pass;
	if (fib.ifindex == ifindex)
		return XDP_TX;
	return bpf_redirect_map(&xdp4_devs_v1, fib.ifindex, 0);
pass:
	lb_count(LB_M_XDP_TO_TC);
	return XDP_PASS;
}

/* xdp_orig sends a client's packet of a source-NATed flow on as its entry e
 * says. */
static __always_inline int xdp_orig(struct xdp_md *ctx, bool v6, const void *p, void *e,
				    enum lb_metric m, __u32 now)
{
	int ret;

	ret = xdp_send(ctx, v6, p, e, now);
	if (ret != XDP_PASS)
		lb_count(m);
	return ret;
}

/* xdp_reply sends a backend's reply to a source NAT port back to the client
 * as the reply entry e says, from the frontend. */
static __always_inline int xdp_reply(struct xdp_md *ctx, bool v6, const void *p, void *e, __u32 now)
{
	int ret;

	np_reply_seen(e, v6, p);
	ret = xdp_send(ctx, v6, p, e, now);
	if (ret != XDP_PASS) {
		ct_refresh_v(e, v6, PKT_F(p, v6, proto), PKT_F(p, v6, tcp_flags), now, true);
		lb_count(LB_M_XDP_REPLY);
	}
	return ret;
}

/* xdp_record records a new flow p to a backend on another node, chosen in
 * c, and sends it on. */
static __always_inline int xdp_record(struct xdp_md *ctx, bool v6, void *p,
				      const struct np_choice *c, __u32 now)
{
	struct ct4_entry orig = {};
	struct ct6_entry orig6 = {};
	int err;

	err = np_record(ctx, v6, ctx->ingress_ifindex, p, c, now,
			v6 ? (void *)&orig6 : (void *)&orig, false);
	if (err)
		return XDP_DROP;
	/* Recorded: should XDP pass it (no neighbour yet), TC finds the flow
	 * and translates it alike. */
	return xdp_orig(ctx, v6, p, v6 ? (void *)&orig6 : (void *)&orig, LB_M_XDP_NEW_SNAT, now);
}

/* xdp_new_flow decides a flow's first packet as tc.c does. It acts only on
 * drops and on flows source-NATed to another node; the others are TC's. */
static __always_inline int xdp_new_flow(struct xdp_md *ctx, bool v6, void *p, __u32 now)
{
	/* The flow's entries are zeroed only for a flow XDP records. */
	struct np_choice c = {};
	enum np_verdict verdict;

	/* A TCP segment of no tracked flow other than a SYN may be of a
	 * connection the kernel's connection tracking translated before the
	 * agent took over: TC asks it (tc.c tc_new_flow, nfct.h). */
	if (PKT_F(p, v6, proto) == IPPROTO_TCP && !(PKT_F(p, v6, tcp_flags) & TCP_FLAG_SYN)) {
		lb_count(LB_M_XDP_TO_TC);
		return XDP_PASS;
	}
	verdict = np_decide(v6, p, &c, false, false);
	switch (verdict) {
	case NP_DROP:
		lb_count(LB_M_DROP);
		return XDP_DROP;
	case NP_SRC_RANGE:
		lb_count(LB_M_TC_SOURCE_RANGE);
		return XDP_DROP;
	case NP_NO_BACKEND:
		return XDP_DROP;
	case NP_FORWARD:
		break;
	default:
		/* Not ours, a refusal TC answers, policy Local. */
		return XDP_PASS;
	}
	/* A local backend is reached through the kernel's stack, with TC's
	 * translation: it selects again, which keeps Maglev's and session
	 * affinity's choice. */
	if (LB_BE(c.be, v6, flags) & BE_F_LOCAL)
		return XDP_PASS;
	return xdp_record(ctx, v6, p, &c, now);
}

/* XDP_NEW_FLOW is what xdp_flow returns for the first packet of a flow,
 * which the program hands to the family's xdp_new: never an XDP action. */
#define XDP_NEW_FLOW 0x10000

/* xdp_flow handles a frame of family v6 with p, a zeroed struct pkt6 or
 * struct pkt4, to parse it into, unless it begins a flow: then it returns
 * XDP_NEW_FLOW. */
static __always_inline int xdp_flow(struct xdp_md *ctx, bool v6, void *p)
{
	void *e;
	bool reply = false;
	__u32 now;

	switch (xdp_pkt_parse(ctx, v6, p)) {
	case XDP_PKT_OK:
		break;
	case XDP_PKT_MULTIBUF:
		lb_count(LB_M_XDP_MULTIBUF);
		return XDP_PASS;
	default:
		return XDP_PASS;
	}
	if (!np_port_wanted(v6, p))
		return XDP_PASS;
	now = ct_now();
	e = np_lookup_tracked(v6, p, now, &reply, false);
	if (e && reply)
		return xdp_reply(ctx, v6, p, e, now);
	/* A late packet to a reused source NAT port: TC counts it and hands
	 * it to the stack. */
	if (reply)
		return XDP_PASS;
	if (e) {
		/* A flow to a local backend stays with TC. */
		if (!(CT_E(e, v6, flags) & CT_F_SNAT))
			return XDP_PASS;
		/* Its backend removed: TC answers the client with a reset and
		 * ends the flow (tc.c tc_reset). Building the reset here too
		 * would duplicate that for one packet per dead flow; what
		 * matters is that nothing goes on to the dead pod. */
		if (np_backend_gone(e, v6, p, now)) {
			lb_count(LB_M_XDP_TO_TC);
			return XDP_PASS;
		}
		return xdp_orig(ctx, v6, p, e, LB_M_XDP_FWD, now);
	}
	return XDP_NEW_FLOW;
}

/* The program's paths are global functions, one per family for the
 * frames of tracked flows, one per family for the first frame of a flow:
 * the verifier checks each once, on its own, and frees what it learnt of
 * one before it checks the next (see tc.c's tc_ingress). A first frame is
 * parsed twice, once in each. */
__noinline int xdp_tracked4(struct xdp_md *ctx)
{
	struct pkt4 p = {};

	return xdp_flow(ctx, false, &p);
}

__noinline int xdp_tracked6(struct xdp_md *ctx)
{
	struct pkt6 p = {};

	return xdp_flow(ctx, true, &p);
}

__noinline int xdp_new4(struct xdp_md *ctx)
{
	struct pkt4 p = {};

	if (xdp_pkt_parse(ctx, false, &p) != XDP_PKT_OK)
		return XDP_PASS;
	return xdp_new_flow(ctx, false, &p, ct_now());
}

__noinline int xdp_new6(struct xdp_md *ctx)
{
	struct pkt6 p = {};

	if (xdp_pkt_parse(ctx, true, &p) != XDP_PKT_OK)
		return XDP_PASS;
	return xdp_new_flow(ctx, true, &p, ct_now());
}

/* xdp_nodeport_run is the program, in one section per mode. */
static __always_inline int xdp_nodeport_run(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	int ret;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		ret = xdp_tracked6(ctx);
		return ret == XDP_NEW_FLOW ? xdp_new6(ctx) : ret;
	}
	ret = xdp_tracked4(ctx);
	return ret == XDP_NEW_FLOW ? xdp_new4(ctx) : ret;
}

/* For drivers (native mode): multi-buffer aware, so that devices with a
 * jumbo MTU take it; such frames are passed. */
SEC("xdp.frags")
int xdp_nodeport(struct xdp_md *ctx)
{
	return xdp_nodeport_run(ctx);
}

/* For generic mode, without multi-buffer support: with it, even a program
 * that only returns XDP_PASS left TC unable to translate the packets it
 * passed to the node's own addresses (seen on 6.18: the kernel then
 * handles the skb as a multi-buffer frame and copies it). Without it,
 * generic XDP linearizes the skb and hands it on as it was. */
SEC("xdp")
int xdp_nodeport_skb(struct xdp_md *ctx)
{
	return xdp_nodeport_run(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
