// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket load balancing at the cgroup hooks: a connect() or sendmsg() to a
 * Service frontend is rewritten to a backend before any packet exists, and
 * recvmsg() and getpeername() show the frontend again, so that applications
 * never see the backend address. Nothing but Service frontends is touched. */

#include "lib/common.h"
#include "lib/lb.h"
#include "lib/sockmaps.h"
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

/* Set by the loader when the agent translates only the node's own sockets
 * (node_netns_cookie's): pods' sockets are left as they are, and their
 * packets are translated at their devices on the node (tc.c
 * tc_pod_ingress), so that a proxy inside a pod (a service mesh's sidecar)
 * sees the Service address its pod connected to. */
volatile const __u8 node_sockets_only = 0;

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

/* sock_netns_per_packet says whether ctx's socket is in a network namespace
 * (a pod's) whose Service traffic is translated per packet at its device
 * instead (sock_netns_packet_v1). */
static __always_inline bool sock_netns_per_packet(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_netns_cookie(ctx);

	return bpf_map_lookup_elem(&sock_netns_packet_v1, &cookie) != NULL;
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

#include "sock_tags.h"

/* The socket programs handle both families with one translation: v6 says
 * that an address is IPv6 and goes through the lb6 maps, otherwise it is
 * IPv4 and goes through the lb4 maps; ctx6 says that the hook is an
 * AF_INET6 one, whose IPv4 destinations are IPv4-mapped (::ffff:a.b.c.d).
 * Both are constants at every call. */

union sock_lb_key {
	struct lb4_key k4;
	struct lb6_key k6;
};

/* ctx_v4mapped says whether the address of an AF_INET6 hook is an IPv4-mapped
 * one. */
static __always_inline bool ctx_v4mapped(const struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void ctx_get_ip(const struct bpf_sock_addr *ctx, bool ctx6, bool v6,
				       union sock_ip *ip)
{
	if (v6) {
		ip->v6[0] = ctx->user_ip6[0];
		ip->v6[1] = ctx->user_ip6[1];
		ip->v6[2] = ctx->user_ip6[2];
		ip->v6[3] = ctx->user_ip6[3];
	} else if (ctx6) {
		ip->v4 = ctx->user_ip6[3];
	} else {
		ip->v4 = ctx->user_ip4;
	}
}

/* ctx_set rewrites the address and port of ctx; an IPv4 address of an
 * AF_INET6 hook stays IPv4-mapped. The values come from maps, in
 * registers: the 6.1 verifier refuses an immediate stored into the
 * context. */
static __always_inline void ctx_set(struct bpf_sock_addr *ctx, bool ctx6, bool v6,
				    const union sock_ip *ip, __be16 port)
{
	if (v6) {
		ctx->user_ip6[0] = ip->v6[0];
		ctx->user_ip6[1] = ip->v6[1];
		ctx->user_ip6[2] = ip->v6[2];
		ctx->user_ip6[3] = ip->v6[3];
	} else if (ctx6) {
		ctx->user_ip6[3] = ip->v4;
	} else {
		ctx->user_ip4 = ip->v4;
	}
	ctx->user_port = (__u32)port;
}

static __always_inline void sock_lb_key_init(union sock_lb_key *key, bool v6,
					     const union sock_ip *ip, __be16 port, __u8 proto)
{
	__builtin_memset(key, 0, sizeof(*key));
	if (v6) {
		__builtin_memcpy(key->k6.address, ip->v6, sizeof(ip->v6));
		key->k6.dport = port;
		key->k6.proto = proto;
	} else {
		key->k4.address = ip->v4;
		key->k4.dport = port;
		key->k4.proto = proto;
	}
}

/* sock_backend_addr reads the address and port of be, a backend of family
 * v6. */
static __always_inline void sock_backend_addr(const void *be, bool v6, union sock_ip *ip,
					      __be16 *port)
{
	if (v6) {
		const struct lb6_backend *b = be;

		__builtin_memcpy(ip->v6, b->address, sizeof(ip->v6));
		*port = b->port;
	} else {
		const struct lb4_backend *b = be;

		ip->v4 = b->address;
		*port = b->port;
	}
}

/* Key of sock4_revnat or sock6_revnat, and of sock4_udp_fwd or
 * sock6_udp_fwd (the same layouts): a socket and an address and port. */
union sock_cookie_key {
	struct sock4_revnat_key k4;
	struct sock6_revnat_key k6;
};

static __always_inline void sock_cookie_key_init(union sock_cookie_key *key, bool v6, __u64 cookie,
						 const union sock_ip *ip, __be16 port)
{
	__builtin_memset(key, 0, sizeof(*key));
	if (v6) {
		key->k6.cookie = cookie;
		__builtin_memcpy(key->k6.address, ip->v6, sizeof(ip->v6));
		key->k6.port = port;
	} else {
		key->k4.cookie = cookie;
		key->k4.address = ip->v4;
		key->k4.port = port;
	}
}

/* The frontend a socket's reverse entry names. */
struct sock_revnat_fe {
	union sock_ip ip;
	__be16 port;
	__u32 rev_nat_id;
};

static __always_inline void sock_revnat_read(const void *val, bool v6, struct sock_revnat_fe *fe)
{
	if (v6) {
		const struct sock6_revnat *r = val;

		__builtin_memcpy(fe->ip.v6, r->address, sizeof(fe->ip.v6));
		fe->port = r->port;
		fe->rev_nat_id = r->rev_nat_id;
	} else {
		const struct sock4_revnat *r = val;

		fe->ip.v4 = r->address;
		fe->port = r->port;
		fe->rev_nat_id = r->rev_nat_id;
	}
}

/* sock_record_revnat remembers, for the socket of ctx sent to the backend
 * be_ip:be_port, the frontend fe its replies and its peer must show. */
static __always_inline void sock_record_revnat(struct bpf_sock_addr *ctx, bool v6,
					       const union sock_ip *be_ip, __be16 be_port,
					       const struct sock_revnat_fe *fe)
{
	void *map = v6 ? (void *)&sock6_revnat_v1 : (void *)&sock4_revnat_v1;
	union sock_cookie_key rkey;
	struct sock_revnat_fe had;
	struct sock4_revnat rval4 = {
		.address = fe->ip.v4,
		.port = fe->port,
		.rev_nat_id = fe->rev_nat_id,
	};
	struct sock6_revnat rval6 = {
		.port = fe->port,
		.rev_nat_id = fe->rev_nat_id,
	};
	void *old;

	sock_cookie_key_init(&rkey, v6, bpf_get_socket_cookie(ctx), be_ip, be_port);
	if (v6)
		__builtin_memcpy(rval6.address, fe->ip.v6, sizeof(rval6.address));
	old = bpf_map_lookup_elem(map, &rkey);
	/* Most sends of a UDP socket hit an existing entry: skip the write. */
	if (old) {
		sock_revnat_read(old, v6, &had);
		if (sock_ip_eq(&had.ip, &fe->ip, v6) && had.port == fe->port &&
		    had.rev_nat_id == fe->rev_nat_id)
			return;
	}
	if (bpf_map_update_elem(map, &rkey, v6 ? (void *)&rval6 : (void *)&rval4, BPF_ANY))
		lb_count(LB_M_REVNAT_UPDATE_ERR);
}

/* sock_forget_revnat drops the reverse entry the socket of ctx holds for
 * ip:port, of an earlier connect through a frontend to that backend: a UDP
 * socket connected again, now straight to the backend, must see it as
 * itself, as with kube-proxy, where nothing of the earlier connect
 * outlives it. */
static __always_inline void sock_forget_revnat(struct bpf_sock_addr *ctx, bool v6,
					       const union sock_ip *ip, __be16 port)
{
	void *map = v6 ? (void *)&sock6_revnat_v1 : (void *)&sock4_revnat_v1;
	union sock_cookie_key rkey;

	sock_cookie_key_init(&rkey, v6, bpf_get_socket_cookie(ctx), ip, port);
	/* Look first: a delete takes the bucket's lock even when it finds
	 * nothing, and most sockets have no entry. */
	if (bpf_map_lookup_elem(map, &rkey))
		bpf_map_delete_elem(map, &rkey);
}

/* sock_udp_backend keeps the datagrams an unconnected UDP socket sends to
 * a frontend on one backend, as long as the ServicePort may choose it: what
 * a conntrack entry does for a flow in kube-proxy. */
static __always_inline void *sock_udp_backend(struct bpf_sock_addr *ctx, bool v6,
					      union sock_lb_key *key, const union sock_ip *ip,
					      __be16 port, const struct lb4_service *svc,
					      __u32 *backend_id)
{
	void *map = v6 ? (void *)&sock6_udp_fwd_v1 : (void *)&sock4_udp_fwd_v1;
	union sock_cookie_key ukey;
	struct sock4_udp *prev, val = {};
	void *be;

	sock_cookie_key_init(&ukey, v6, bpf_get_socket_cookie(ctx), ip, port);
	prev = bpf_map_lookup_elem(map, &ukey);
	if (prev && prev->svc_id == svc->svc_id) {
		be = lb_member_backend(v6, prev->backend_id, svc->svc_id);
		if (be) {
			*backend_id = prev->backend_id;
			lb_count(LB_M_UDP_STICKY);
			return be;
		}
	}
	be = lb_random_backend(key, v6, svc, backend_id);
	if (be) {
		val.backend_id = *backend_id;
		val.svc_id = svc->svc_id;
		bpf_map_update_elem(map, &ukey, &val, BPF_ANY);
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
 * when key is not to be looked up; any other destination is left as it is.
 * IPv6 has no localhost NodePorts, as in kube-proxy. */
static __always_inline bool sock4_loopback_frontend(struct bpf_sock_addr *ctx, struct lb4_key *key)
{
	if (!is_loopback4(key->address))
		return true;
	if (!node_netns_cookie || bpf_get_netns_cookie(ctx) != node_netns_cookie)
		return false;
	key->address = LOCALHOST4;
	return true;
}

/* sock_xlate_fwd rewrites the destination of ctx when it is a Service
 * frontend; sendmsg says the call comes from sendmsg() on an unconnected
 * UDP socket. Returns the value the hook must return. */
static __always_inline int sock_xlate_fwd(struct bpf_sock_addr *ctx, bool sendmsg, bool ctx6,
					  bool v6)
{
	__u8 proto = (__u8)ctx->protocol;
	union sock_ip ip, be_ip;
	struct sock_revnat_fe fe;
	union sock_lb_key key;
	struct lb4_service *svc;
	__u32 backend_id = 0;
	__be16 be_port;
	void *be;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	if (node_sockets_only ? bpf_get_netns_cookie(ctx) != node_netns_cookie
			      : sock_netns_per_packet(ctx))
		return SYS_PROCEED;
	ctx_get_ip(ctx, ctx6, v6, &ip);
	sock_lb_key_init(&key, v6, &ip, ctx_port(ctx), proto);
	if (!v6 && !sock4_loopback_frontend(ctx, &key.k4))
		return SYS_PROCEED;
	/* Sockets here belong to the node or its pods: the inside scope. */
	svc = lb_lookup_service(&key, v6, LB_SCOPE_INT);
	if (!svc) {
		/* A UDP socket may have been sent through a LoadBalancer IP
		 * with source ranges before, or connected through a frontend
		 * to this very address; this destination is neither. A TCP
		 * socket connects once. */
		if (proto == IPPROTO_UDP) {
			sock_range_tag_set(ctx, sendmsg, ctx6, v6, 0, &ip, ctx_port(ctx));
			if (!sendmsg)
				sock_forget_revnat(ctx, v6, &ip, ctx_port(ctx));
		}
		return SYS_PROCEED;
	}
	if (svc->flags & SVC_F_DROP) {
		lb_count(LB_M_DROP);
		return sock_refuse(sock_udp_from_node(ctx, proto, svc) ? EPERM : DROP_ERRNO);
	}
	if ((svc->flags & SVC_F_REJECT) || svc->count == 0) {
		lb_count(LB_M_REJECT);
		return sock_refuse(sock_udp_from_node(ctx, proto, svc) ? EPERM : REJECT_ERRNO);
	}
	fe.rev_nat_id = svc->rev_nat_id;
	if (sendmsg && !svc->affinity_timeout) {
		be = sock_udp_backend(ctx, v6, &key, &ip, ctx_port(ctx), svc, &backend_id);
	} else {
		/* The client is the socket's network namespace: two pods on one
		 * node are two clients, as their two IPs are to kube-proxy.
		 * Sockets choose at random, without Maglev: its tables make
		 * every node pick the same backend for a flow that a router
		 * may send to any of them, and a socket's flow starts here. */
		be = lb_choose_backend(&key, v6, svc, bpf_get_netns_cookie(ctx),
				       AFFINITY_CLIENT_NETNS, 0, &backend_id);
	}
	if (!be)
		return sock_refuse(EHOSTUNREACH);
	sock_backend_addr(be, v6, &be_ip, &be_port);
	/* kube-proxy checks the ranges before it translates, and after its
	 * refusals: the egress program checks this socket's packets. */
	if (svc->flags & SVC_F_SOURCE_RANGES) {
		if (!sock_range_tag_set(ctx, sendmsg, ctx6, v6, svc->svc_id, &be_ip, be_port))
			return sock_refuse(TAG_ERRNO);
	} else if (proto == IPPROTO_UDP) {
		sock_range_tag_set(ctx, sendmsg, ctx6, v6, 0, &be_ip, be_port);
	}
	/* The peer a socket sees is the address it asked for, also when
	 * that was 127.0.0.1's alias 127.x.y.z. */
	fe.ip = ip;
	fe.port = ctx_port(ctx);
	sock_record_revnat(ctx, v6, &be_ip, be_port, &fe);
	ctx_set(ctx, ctx6, v6, &be_ip, be_port);
	lb_count(proto == IPPROTO_TCP ? LB_M_XLATE_TCP : LB_M_XLATE_UDP);
	return SYS_PROCEED;
}

/* lb_revnat_holds says whether the reverse NAT entry id of family v6 still
 * names the frontend fe (seen by a socket as fe->ip: an IPv4 loopback
 * frontend is 127.0.0.1 in the map). */
static __always_inline bool lb_revnat_holds(bool v6, __u32 id, const struct sock_revnat_fe *fe)
{
	void *rn = bpf_map_lookup_elem(v6 ? (void *)&lb6_revnat_v1 : (void *)&lb4_revnat_v1, &id);
	union sock_ip want = fe->ip, got;
	__be16 port;

	if (!rn)
		return false;
	if (v6) {
		const struct lb6_reverse_nat *r = rn;

		__builtin_memcpy(got.v6, r->address, sizeof(got.v6));
		port = r->port;
	} else {
		const struct lb4_reverse_nat *r = rn;

		got.v4 = r->address;
		port = r->port;
		if (is_loopback4(want.v4))
			want.v4 = LOCALHOST4;
	}
	return port == fe->port && sock_ip_eq(&got, &want, v6);
}

/* sock_xlate_rev makes a backend address that a socket sees (as the source
 * of a datagram, or as its peer when peer is set) appear as the frontend it
 * was sent to.
 *
 * A datagram's source is checked against the frontend as it is now: once
 * the frontend is deleted or renumbered, replies show the backend, as they
 * do with kube-proxy once it has cleared the Service's UDP conntrack
 * entries. A socket's peer is not: with kube-proxy a socket's peer is the
 * address it connected to, which no later change of the Service alters
 * (its conntrack entry keeps translating a TCP connection), so getpeername
 * shows the frontend the socket was connected to for as long as its entry
 * lives, without a look-up in the frontends' reverse map. */
static __always_inline void sock_xlate_rev(struct bpf_sock_addr *ctx, bool ctx6, bool v6, bool peer)
{
	void *map = v6 ? (void *)&sock6_revnat_v1 : (void *)&sock4_revnat_v1;
	union sock_cookie_key rkey;
	struct sock_revnat_fe fe;
	union sock_ip ip;
	void *val;

	ctx_get_ip(ctx, ctx6, v6, &ip);
	sock_cookie_key_init(&rkey, v6, bpf_get_socket_cookie(ctx), &ip, ctx_port(ctx));
	val = bpf_map_lookup_elem(map, &rkey);
	if (!val)
		return;
	sock_revnat_read(val, v6, &fe);
	/* The frontend was deleted or renumbered since: show the real source. */
	if (!peer && !lb_revnat_holds(v6, fe.rev_nat_id, &fe)) {
		lb_count(LB_M_REVNAT_STALE);
		bpf_map_delete_elem(map, &rkey);
		return;
	}
	ctx_set(ctx, ctx6, v6, &fe.ip, fe.port);
	lb_count(LB_M_REVNAT_HIT);
}

SEC("cgroup/connect4")
int cg_connect4(struct bpf_sock_addr *ctx)
{
	return sock_xlate_fwd(ctx, false, false, false);
}

SEC("cgroup/sendmsg4")
int cg_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_xlate_fwd(ctx, true, false, false);
}

SEC("cgroup/recvmsg4")
int cg_recvmsg4(struct bpf_sock_addr *ctx)
{
	sock_xlate_rev(ctx, false, false, false);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int cg_getpeername4(struct bpf_sock_addr *ctx)
{
	sock_xlate_rev(ctx, false, false, true);
	return SYS_PROCEED;
}

/* The AF_INET6 hooks. An IPv4-mapped destination is translated through the
 * IPv4 maps, as an AF_INET socket's, and stays IPv4-mapped: dual-stack
 * clients (Java's, for one) reach IPv4 Services that way. The kernel sends
 * such a socket's IPv4 traffic through the IPv4 stack without the AF_INET
 * hooks, except an unconnected UDP datagram, which meets sendmsg4. */

SEC("cgroup/connect6")
int cg_connect6(struct bpf_sock_addr *ctx)
{
	if (ctx_v4mapped(ctx))
		return sock_xlate_fwd(ctx, false, true, false);
	return sock_xlate_fwd(ctx, false, true, true);
}

SEC("cgroup/sendmsg6")
int cg_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (ctx_v4mapped(ctx))
		return sock_xlate_fwd(ctx, true, true, false);
	return sock_xlate_fwd(ctx, true, true, true);
}

SEC("cgroup/recvmsg6")
int cg_recvmsg6(struct bpf_sock_addr *ctx)
{
	if (ctx_v4mapped(ctx))
		sock_xlate_rev(ctx, true, false, false);
	else
		sock_xlate_rev(ctx, true, true, false);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername6")
int cg_getpeername6(struct bpf_sock_addr *ctx)
{
	if (ctx_v4mapped(ctx))
		sock_xlate_rev(ctx, true, false, true);
	else
		sock_xlate_rev(ctx, true, true, true);
	return SYS_PROCEED;
}

#include "sock_egress.h"
