// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The XDP fast path for traffic from outside to NodePorts, ExternalIPs and
 * LoadBalancer IPs whose backend is on another node
 * (externalTrafficPolicy=Cluster): such packets come in and go straight back
 * out, so they are translated and sent before the kernel builds an skb.
 *  - the client's packets of a source-NATed flow: DNAT to the backend and
 *    SNAT to the node, out of the device the FIB names;
 *  - the backend's replies to a source NAT port: back to the client from the
 *    frontend;
 *  - the first packet of a flow: the verdict, backend and connection
 *    tracking entries of tc.c (lib/nodeport.h), then as above.
 * The TC programs stay attached and do everything else, which this program
 * passes: local backends, policy Local, refusals with an ICMP answer, resets
 * of TCP flows whose backend was removed, ICMP errors, fragments, IP
 * options, multi-buffer frames, frames whose next hop needs neighbour
 * resolution or is out of a device without this program.
 * Both share the connection tracking map, so a flow may move between them
 * (XDP detached, or its next packet passed). */

#include "lib/common.h"
#include "lib/nodeport.h"
#include "lib/parse.h"
#include "lib/rewrite.h"

#define XDP4_DEVS_MAX 256

/* The devices this program is attached to, by ifindex: a translated frame
 * is redirected only to those, which take XDP frames; for any other device
 * it is passed to TC. Written by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, XDP4_DEVS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xdp4_devs_v1 SEC(".maps");

/* xdp_send rewrites the frame that p describes to the tuple that the
 * flow's entry e gives its packets (both entries of a source-NATed flow hold
 * all four of it) and sends it to that destination: back out of the device
 * it came in on, or redirected to another device with this program.
 * Anything the FIB cannot resolve on its own (no neighbour entry, no route,
 * too big for the MTU) and any other egress device is passed untouched, for
 * TC to do or drop as it does. */
static __always_inline int xdp_send(struct xdp_md *ctx, const struct pkt4 *p,
				    const struct ct4_entry *e)
{
	struct bpf_fib_lookup fib = {
		.family = PKT_AF_INET,
		.tos = p->tos,
		.l4_protocol = p->proto,
		.sport = e->nat_sport,
		.dport = e->nat_dport,
		.tot_len = p->tot_len,
		.ipv4_src = e->nat_saddr,
		.ipv4_dst = e->nat_daddr,
		.ifindex = ctx->ingress_ifindex,
	};
	struct pkt4 n = *p;
	__u32 ifindex = ctx->ingress_ifindex;
	long ret;

	n.saddr = e->nat_saddr;
	n.sport = e->nat_sport;
	n.daddr = e->nat_daddr;
	n.dport = e->nat_dport;
	if (p->ttl <= 1)
		goto pass;
	ret = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	if (ret != BPF_FIB_LKUP_RET_SUCCESS)
		goto pass;
	if (fib.ifindex != ifindex && !bpf_map_lookup_elem(&xdp4_devs_v1, &fib.ifindex))
		goto pass;
	if (xdp_pkt4_rewrite(ctx, p, &n, &fib))
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
static __always_inline int xdp_orig(struct xdp_md *ctx, const struct pkt4 *p,
				    const struct ct4_entry *e, enum lb_metric m)
{
	int ret;

	ret = xdp_send(ctx, p, e);
	if (ret != XDP_PASS)
		lb_count(m);
	return ret;
}

/* xdp_reply sends a backend's reply to a source NAT port back to the client
 * as the reply entry e says, from the frontend. */
static __always_inline int xdp_reply(struct xdp_md *ctx, const struct pkt4 *p, struct ct4_entry *e,
				     __u32 now)
{
	int ret;

	ret = xdp_send(ctx, p, e);
	if (ret != XDP_PASS) {
		ct_refresh_dir(e, p, now, true);
		lb_count(LB_M_XDP_REPLY);
	}
	return ret;
}

/* xdp_new_flow decides a flow's first packet as tc.c does. It acts only on
 * drops and on flows source-NATed to another node; the others are TC's. */
static __always_inline int xdp_new_flow(struct xdp_md *ctx, struct pkt4 *p, __u32 now)
{
	struct ct4_entry orig = {};
	struct np_choice c = {};

	switch (np_decide(p, &c, false)) {
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
	if (c.be->flags & BE_F_LOCAL)
		return XDP_PASS;
	if (np_record(ctx, ctx->ingress_ifindex, p, &c, now, &orig))
		return XDP_DROP;
	/* Recorded: should XDP pass it (no neighbour yet), TC finds the flow
	 * and translates it alike. */
	return xdp_orig(ctx, p, &orig, LB_M_XDP_NEW_SNAT);
}

/* xdp_nodeport_run is the program, in one section per mode. */
static __always_inline int xdp_nodeport_run(struct xdp_md *ctx)
{
	struct pkt4 p = {};
	struct ct4_entry *e;
	bool reply = false;
	__u32 now;

	switch (xdp_pkt4_parse(ctx, &p)) {
	case XDP_PKT_OK:
		break;
	case XDP_PKT_MULTIBUF:
		lb_count(LB_M_XDP_MULTIBUF);
		return XDP_PASS;
	default:
		return XDP_PASS;
	}
	now = ct_now();
	e = np_lookup_tracked(&p, now, &reply);
	if (e && reply)
		return xdp_reply(ctx, &p, e, now);
	/* A late packet to a reused source NAT port: TC counts it and hands
	 * it to the stack. */
	if (reply)
		return XDP_PASS;
	if (e) {
		/* A flow to a local backend stays with TC. */
		if (!(e->flags & CT_F_SNAT))
			return XDP_PASS;
		/* Its backend removed: TC answers the client with a reset and
		 * ends the flow (tc.c tc_reset). Building the reset here too
		 * would duplicate that for one packet per dead flow; what
		 * matters is that nothing goes on to the dead pod. */
		if (np_backend_gone(e, &p)) {
			lb_count(LB_M_XDP_TO_TC);
			return XDP_PASS;
		}
		return xdp_orig(ctx, &p, e, LB_M_XDP_FWD);
	}
	return xdp_new_flow(ctx, &p, now);
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
