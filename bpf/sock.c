// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket load balancing at the cgroup hooks: a connect() or sendmsg() to a
 * Service frontend is rewritten to a backend before any packet exists, and
 * recvmsg() and getpeername() show the frontend again, so that applications
 * never see the backend address. Nothing but Service frontends is touched. */

#include "lib/common.h"
#include "lib/lb.h"
#include "lib/srcrange.h"
#include <linux/if_ether.h>
#include <linux/ip.h>

/* Set by the loader from a feature probe. Without bpf_set_retval a refused
 * connect() reports EPERM instead of the errno below. */
volatile const __u8 have_set_retval = 1;

/* The network namespace cookie of the node itself, set by the loader; 0
 * when unknown. kube-proxy refuses the node's own datagrams to a Service
 * that rejects or drops in the OUTPUT path, where netfilter's verdict makes
 * the send fail with EPERM; a pod's datagrams are refused on the forward
 * path instead, which the pod sees as ECONNREFUSED or a timeout. */
volatile const __u64 node_netns_cookie = 0;

/* A Service without usable endpoints refuses at once, as kube-proxy's
 * REJECT does with an ICMP port unreachable. */
#define REJECT_ERRNO ECONNREFUSED
/* Traffic policy Local without a local endpoint is kube-proxy's DROP, which
 * a client experiences as a timeout; we report the timeout at once rather
 * than letting the socket wait for it. */
#define DROP_ERRNO ETIMEDOUT
/* A socket that cannot be tagged for the source range check is refused
 * rather than let through unchecked. */
#define TAG_ERRNO ENOMEM

/* sock_udp_from_node says whether ctx is a UDP socket of the node's own
 * network namespace sending to svc, whose refusal kube-proxy reports as
 * EPERM: its REJECT and DROP rules for Service IPs are in the OUTPUT path.
 * Those for NodePorts are in the INPUT path only, which the node's datagram
 * reaches through loopback: refused there, it gets ECONNREFUSED like a
 * pod's. */
static __always_inline bool sock_udp_from_node(struct bpf_sock_addr *ctx, __u8 proto,
					       const struct lb4_service *svc)
{
	return proto == IPPROTO_UDP && !(svc->flags & (SVC_F_NODE_PORT | SVC_F_LOCALHOST)) &&
	       node_netns_cookie && bpf_get_netns_cookie(ctx) == node_netns_cookie;
}

static __always_inline __be16 ctx_port(const struct bpf_sock_addr *ctx)
{
	return (__be16)ctx->user_port;
}

static __always_inline int sock_refuse(int err)
{
	if (have_set_retval)
		bpf_set_retval(-err);
	return SYS_REJECT;
}

static __always_inline void sock4_record_revnat(struct bpf_sock_addr *ctx,
						const struct lb4_backend *be,
						const struct lb4_key *key, __u32 rev_nat_id)
{
	struct sock4_revnat_key rkey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.address = be->address,
		.port = be->port,
	};
	struct sock4_revnat rval = {
		.address = key->address,
		.port = key->dport,
		.rev_nat_id = rev_nat_id,
	};
	struct sock4_revnat *old = bpf_map_lookup_elem(&sock4_revnat_v1, &rkey);

	/* Most sends of a UDP socket hit an existing entry: skip the write. */
	if (old && old->address == rval.address && old->port == rval.port &&
	    old->rev_nat_id == rval.rev_nat_id)
		return;
	if (bpf_map_update_elem(&sock4_revnat_v1, &rkey, &rval, BPF_ANY))
		lb_count(LB_M_REVNAT_UPDATE_ERR);
}

/* sock4_range_dst_set points dst at svc_id and addr:port. The same
 * destination again (a UDP socket's next datagram) keeps the source address
 * admitted already, as a conntrack entry keeps kube-proxy's verdict for a
 * flow. */
static __always_inline void sock4_range_dst_set(struct sock4_range_dst *dst, __u32 svc_id,
						__be32 addr, __be16 port, __u8 flags)
{
	if (dst->svc_id == svc_id && dst->backend == addr && dst->port == port &&
	    dst->flags == flags)
		return;
	dst->svc_id = svc_id;
	dst->backend = addr;
	dst->port = port;
	dst->flags = flags;
	dst->allowed_saddr = 0;
}

/* sock4_range_msg_slot returns the msg slot of tag for addr:port: the one
 * that holds it, else (when create) a free one or the one to reuse, else
 * NULL. */
static __always_inline struct sock4_range_dst *
sock4_range_msg_slot(struct sock4_range_tag *tag, __be32 addr, __be16 port, bool create)
{
	struct sock4_range_dst *free = NULL;
	__u32 i;

	for (i = 0; i < SOCK4_RANGE_MSG_SLOTS; i++) {
		struct sock4_range_dst *d = &tag->msg[i];

		if (d->backend == addr && d->port == port)
			return d;
		if (!free && !d->svc_id)
			free = d;
	}
	if (!create)
		return NULL;
	if (free)
		return free;
	i = tag->next++ & (SOCK4_RANGE_MSG_SLOTS - 1);
	return &tag->msg[i];
}

/* sock4_range_tag_set tells the egress program that the socket of ctx now
 * sends to addr:port (a backend) through a LoadBalancer IP of the
 * ServicePort svc_id, whose source ranges it must check; svc_id 0 says
 * that packets to addr:port are not checked. connect() sets the socket's
 * connected destination, sendmsg() (unconnected UDP) that of the datagram
 * being sent. Returns false when a needed tag could not be made.
 *
 * A socket never sent through such a LoadBalancer IP has no storage: for it
 * this is one lookup that finds nothing, and nothing is created. */
static __always_inline bool sock4_range_tag_set(struct bpf_sock_addr *ctx, bool sendmsg,
						__u32 svc_id, __be32 addr, __be16 port)
{
	struct bpf_sock *sk = ctx->sk;
	struct sock4_range_tag *tag;
	struct sock4_range_dst *dst;
	bool node = false;
	__u8 flags = 0;
	__be32 src = 0;

	if (!sk)
		return !svc_id;
	if (svc_id && node_netns_cookie && bpf_get_netns_cookie(ctx) == node_netns_cookie) {
		node = true;
		/* An address the application chose (bind(), or IP_PKTINFO
		 * for one datagram) is the source in kube-proxy too. */
		if (sendmsg)
			src = ctx->msg_src_ip4;
		if (!src)
			src = sk->src_ip4;
		if (!src)
			flags = RANGE_DST_F_AS_NODE;
	}
	tag = bpf_sk_storage_get(&sock4_range_tags_v1, sk, 0,
				 svc_id ? BPF_SK_STORAGE_GET_F_CREATE : 0);
	if (!tag) {
		if (!svc_id)
			return true;
		lb_count(LB_M_SOCK_RANGE_TAG_ERR);
		return false;
	}
	if (node)
		tag->flags |= RANGE_TAG_F_NODE;
	if (!sendmsg) {
		sock4_range_dst_set(&tag->conn, svc_id, addr, port, flags);
		return true;
	}
	dst = sock4_range_msg_slot(tag, addr, port, svc_id != 0);
	if (!dst)
		return true;
	if (svc_id) {
		sock4_range_dst_set(dst, svc_id, addr, port, flags);
	} else {
		/* The same backend by a way without ranges: unchecked. */
		dst->svc_id = 0;
		dst->backend = 0;
		dst->port = 0;
	}
	return true;
}

/* sock4_udp_backend keeps the datagrams an unconnected UDP socket sends to
 * a frontend on one backend, as long as the ServicePort may choose it: what
 * a conntrack entry does for a flow in kube-proxy. */
static __always_inline struct lb4_backend *sock4_udp_backend(struct bpf_sock_addr *ctx,
							     struct lb4_key *key,
							     const struct lb4_service *svc,
							     __u32 *backend_id)
{
	struct sock4_udp_key ukey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.address = key->address,
		.port = key->dport,
	};
	struct sock4_udp *prev, val = {};
	struct lb4_backend *be;

	prev = bpf_map_lookup_elem(&sock4_udp_fwd_v1, &ukey);
	if (prev && prev->svc_id == svc->svc_id) {
		be = lb4_member_backend(prev->backend_id, svc->svc_id);
		if (be) {
			*backend_id = prev->backend_id;
			lb_count(LB_M_UDP_STICKY);
			return be;
		}
	}
	be = lb4_random_backend(key, svc, backend_id);
	if (be) {
		val.backend_id = *backend_id;
		val.svc_id = svc->svc_id;
		bpf_map_update_elem(&sock4_udp_fwd_v1, &ukey, &val, BPF_ANY);
	}
	return be;
}

/* 127.0.0.1: the frontend of localhost NodePorts for all of 127.0.0.0/8. */
#define LOCALHOST4 bpf_htonl(0x7f000001)

static __always_inline bool is_loopback4(__be32 addr)
{
	return (addr & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
}

/* sock4_loopback_frontend decides a destination in 127.0.0.0/8. Only the
 * node's own sockets reach NodePorts there (kube-proxy's localhost NodePorts,
 * which it serves in its nat OUTPUT chain, so never to pods, whose loopback
 * is their own), all of 127.0.0.0/8 as 127.0.0.1, whose frontends the agent
 * writes only when --iptables-localhost-nodeports allows them. Returns false
 * when key is not to be looked up; any other destination is left as it is. */
static __always_inline bool sock4_loopback_frontend(struct bpf_sock_addr *ctx, struct lb4_key *key)
{
	if (!is_loopback4(key->address))
		return true;
	if (!node_netns_cookie || bpf_get_netns_cookie(ctx) != node_netns_cookie)
		return false;
	key->address = LOCALHOST4;
	return true;
}

/* sock4_xlate_fwd rewrites the destination of ctx when it is a Service
 * frontend; sendmsg says the call comes from sendmsg() on an unconnected
 * UDP socket. Returns the value the hook must return. */
static __always_inline int sock4_xlate_fwd(struct bpf_sock_addr *ctx, bool sendmsg)
{
	struct lb4_key key = {
		.address = ctx->user_ip4,
		.dport = ctx_port(ctx),
		.proto = (__u8)ctx->protocol,
	};
	struct lb4_service *svc;
	struct lb4_backend *be;
	__u32 backend_id = 0;
	__u32 rev_nat_id;
	__be32 addr;
	__be16 port;

	if (key.proto != IPPROTO_TCP && key.proto != IPPROTO_UDP)
		return SYS_PROCEED;
	if (!sock4_loopback_frontend(ctx, &key))
		return SYS_PROCEED;
	/* Sockets here belong to the node or its pods: the inside scope. */
	svc = lb4_lookup_service(&key, LB_SCOPE_INT);
	if (!svc) {
		/* A UDP socket may have been sent through a LoadBalancer IP
		 * with source ranges before; this destination is not. A TCP
		 * socket connects once. */
		if (key.proto == IPPROTO_UDP)
			sock4_range_tag_set(ctx, sendmsg, 0, key.address, key.dport);
		return SYS_PROCEED;
	}
	if (svc->flags & SVC_F_DROP) {
		lb_count(LB_M_DROP);
		return sock_refuse(sock_udp_from_node(ctx, key.proto, svc) ? EPERM : DROP_ERRNO);
	}
	if ((svc->flags & SVC_F_REJECT) || svc->count == 0) {
		lb_count(LB_M_REJECT);
		return sock_refuse(sock_udp_from_node(ctx, key.proto, svc) ? EPERM : REJECT_ERRNO);
	}
	rev_nat_id = svc->rev_nat_id;
	if (sendmsg && !svc->affinity_timeout) {
		be = sock4_udp_backend(ctx, &key, svc, &backend_id);
	} else {
		/* The client is the socket's network namespace: two pods on one
		 * node are two clients, as their two IPs are to kube-proxy.
		 * Sockets choose at random, without Maglev: its tables make
		 * every node pick the same backend for a flow that a router
		 * may send to any of them, and a socket's flow starts here. */
		be = lb4_choose_backend(&key, svc, bpf_get_netns_cookie(ctx), AFFINITY_CLIENT_NETNS,
					0, &backend_id);
	}
	if (!be)
		return sock_refuse(EHOSTUNREACH);
	addr = be->address;
	port = be->port;
	/* kube-proxy checks the ranges before it translates, and after its
	 * refusals: the egress program checks this socket's packets. */
	if (svc->flags & SVC_F_SOURCE_RANGES) {
		if (!sock4_range_tag_set(ctx, sendmsg, svc->svc_id, addr, port))
			return sock_refuse(TAG_ERRNO);
	} else if (key.proto == IPPROTO_UDP) {
		sock4_range_tag_set(ctx, sendmsg, 0, addr, port);
	}
	/* The peer a socket sees is the address it asked for, also when
	 * that was 127.0.0.1's alias 127.x.y.z. */
	key.address = ctx->user_ip4;
	sock4_record_revnat(ctx, be, &key, rev_nat_id);
	ctx->user_ip4 = addr;
	ctx->user_port = (__u32)port;
	lb_count(key.proto == IPPROTO_TCP ? LB_M_XLATE_TCP : LB_M_XLATE_UDP);
	return SYS_PROCEED;
}

/* sock4_xlate_rev makes a backend address that a socket sees (as the source
 * of a datagram, or as its peer) appear as the frontend it connected to. */
static __always_inline void sock4_xlate_rev(struct bpf_sock_addr *ctx)
{
	struct sock4_revnat_key rkey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.address = ctx->user_ip4,
		.port = ctx_port(ctx),
	};
	struct sock4_revnat *val;
	struct lb4_reverse_nat *rn;
	__u32 id;

	val = bpf_map_lookup_elem(&sock4_revnat_v1, &rkey);
	if (!val)
		return;
	id = val->rev_nat_id;
	rn = bpf_map_lookup_elem(&lb4_revnat_v1, &id);
	/* The frontend was deleted or renumbered since: show the real peer. */
	if (!rn || rn->address != (is_loopback4(val->address) ? LOCALHOST4 : val->address) ||
	    rn->port != val->port) {
		lb_count(LB_M_REVNAT_STALE);
		bpf_map_delete_elem(&sock4_revnat_v1, &rkey);
		return;
	}
	ctx->user_ip4 = val->address;
	ctx->user_port = (__u32)val->port;
	lb_count(LB_M_REVNAT_HIT);
}

SEC("cgroup/connect4")
int cg_connect4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, false);
}

SEC("cgroup/sendmsg4")
int cg_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock4_xlate_fwd(ctx, true);
}

SEC("cgroup/recvmsg4")
int cg_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int cg_getpeername4(struct bpf_sock_addr *ctx)
{
	sock4_xlate_rev(ctx);
	return SYS_PROCEED;
}

/* Return values of cgroup_skb egress programs: bit 0 passes the packet,
 * bit 1 reports congestion, which a UDP sendmsg() treats as a silent drop
 * (without IP_RECVERR) where a plain drop fails it with EPERM. */
#define SKB_DROP    0
#define SKB_PASS    1
#define SKB_DROP_CN 2

/* cg_egress4 drops a packet that a socket tagged by sock4_range_tag_set
 * sends to its backend from a source address outside the ServicePort's
 * loadBalancerSourceRanges, as kube-proxy's firewall chain does.
 *
 * What the sender sees is kube-proxy's: a TCP connect() retransmits its SYN
 * until it times out; a pod's UDP datagram is lost without an error (kube-
 * proxy drops it in the node's PREROUTING); the node's own UDP send() fails
 * with EPERM (kube-proxy drops it in OUTPUT, which fails the send). A
 * source address admitted once is remembered for the destination, so later
 * packets pay one comparison; a refused one is checked again, as a dropped
 * packet leaves no conntrack entry in kube-proxy. */
SEC("cgroup_skb/egress")
int cg_egress4(struct __sk_buff *skb)
{
	struct sock4_range_tag *tag;
	struct sock4_range_dst *dst;
	struct bpf_sock *sk;
	struct iphdr ip;
	__be16 ports[2];

	sk = skb->sk;
	if (!sk)
		return SKB_PASS;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return SKB_PASS;
	tag = bpf_sk_storage_get(&sock4_range_tags_v1, sk, 0, 0);
	if (!tag)
		return SKB_PASS;
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return SKB_PASS;
	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)))
		return SKB_PASS;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return SKB_PASS;
	/* The egress hook runs before fragmentation: a packet with an
	 * offset is not one of ours. */
	if (ip.frag_off & bpf_htons(0x1fff))
		return SKB_PASS;
	if (bpf_skb_load_bytes(skb, ip.ihl * 4, ports, sizeof(ports)))
		return SKB_PASS;
	dst = sock4_range_msg_slot(tag, ip.daddr, ports[1], false);
	if (!dst) {
		if (tag->conn.backend != ip.daddr || tag->conn.port != ports[1])
			return SKB_PASS;
		dst = &tag->conn;
	}
	if (!dst->svc_id || dst->allowed_saddr == ip.saddr)
		return SKB_PASS;
	if ((dst->flags & RANGE_DST_F_AS_NODE) ? range_node_allowed(dst->svc_id)
					       : range_allowed(dst->svc_id, ip.saddr)) {
		dst->allowed_saddr = ip.saddr;
		return SKB_PASS;
	}
	lb_count(LB_M_SOCK_SOURCE_RANGE);
	if (ip.protocol == IPPROTO_UDP && !(tag->flags & RANGE_TAG_F_NODE))
		return SKB_DROP_CN;
	return SKB_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
