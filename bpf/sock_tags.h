/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The source range tags of the socket hooks (part of sock.c, which
 * includes it after its loader-set constants): a connect() or sendmsg() to
 * a LoadBalancer IP with loadBalancerSourceRanges tags the socket with the
 * destination, and the egress program (sock_egress.h) checks its packets,
 * whose source address is known by then, against the ranges. */
#ifndef EBPF_PROXY_SOCK_TAGS_H
#define EBPF_PROXY_SOCK_TAGS_H

/* The source range tags of both families: v6 picks a struct
 * sock6_range_tag (a socket's IPv6 destinations) over a struct
 * sock4_range_tag (its IPv4 ones, also IPv4-mapped ones of an AF_INET6
 * socket, whose packets are IPv4). A dst is a struct sock6_range_dst or a
 * struct sock4_range_dst. */

static __always_inline void *range_tags_map(bool v6)
{
	return v6 ? (void *)&sock6_range_tags_v1 : (void *)&sock4_range_tags_v1;
}

static __always_inline void *range_tag_conn(void *tag, bool v6)
{
	if (v6)
		return &((struct sock6_range_tag *)tag)->conn;
	return &((struct sock4_range_tag *)tag)->conn;
}

static __always_inline void *range_tag_msg(void *tag, bool v6, __u32 i)
{
	if (v6)
		return &((struct sock6_range_tag *)tag)->msg[i];
	return &((struct sock4_range_tag *)tag)->msg[i];
}

static __always_inline __u8 *range_tag_flags(void *tag, bool v6)
{
	if (v6)
		return &((struct sock6_range_tag *)tag)->flags;
	return &((struct sock4_range_tag *)tag)->flags;
}

static __always_inline __u8 *range_tag_next(void *tag, bool v6)
{
	if (v6)
		return &((struct sock6_range_tag *)tag)->next;
	return &((struct sock4_range_tag *)tag)->next;
}

static __always_inline __u32 range_dst_svc(const void *dst, bool v6)
{
	if (v6)
		return ((const struct sock6_range_dst *)dst)->svc_id;
	return ((const struct sock4_range_dst *)dst)->svc_id;
}

static __always_inline __u8 range_dst_flags(const void *dst, bool v6)
{
	if (v6)
		return ((const struct sock6_range_dst *)dst)->flags;
	return ((const struct sock4_range_dst *)dst)->flags;
}

/* range_dst_is says whether dst is the destination ip:port. */
static __always_inline bool range_dst_is(const void *dst, bool v6, const union sock_ip *ip,
					 __be16 port)
{
	union sock_ip backend;

	if (v6) {
		const struct sock6_range_dst *d = dst;

		__builtin_memcpy(backend.v6, d->backend, sizeof(backend.v6));
		return d->port == port && sock_ip_eq(&backend, ip, true);
	}
	backend.v4 = ((const struct sock4_range_dst *)dst)->backend;
	return ((const struct sock4_range_dst *)dst)->port == port &&
	       sock_ip_eq(&backend, ip, false);
}

/* range_dst_admitted says whether saddr is the source address a packet to
 * dst was last admitted from. */
static __always_inline bool range_dst_admitted(const void *dst, bool v6, const union sock_ip *saddr)
{
	union sock_ip allowed;

	if (v6)
		__builtin_memcpy(allowed.v6, ((const struct sock6_range_dst *)dst)->allowed_saddr,
				 sizeof(allowed.v6));
	else
		allowed.v4 = ((const struct sock4_range_dst *)dst)->allowed_saddr;
	return sock_ip_eq(&allowed, saddr, v6);
}

static __always_inline void range_dst_admit(void *dst, bool v6, const union sock_ip *saddr)
{
	if (v6)
		__builtin_memcpy(((struct sock6_range_dst *)dst)->allowed_saddr, saddr->v6,
				 sizeof(saddr->v6));
	else
		((struct sock4_range_dst *)dst)->allowed_saddr = saddr->v4;
}

/* range_dst_set points dst at svc_id and ip:port (svc_id 0: unchecked).
 * The same destination again (a UDP socket's next datagram) keeps the
 * source address admitted already, as a conntrack entry keeps kube-proxy's
 * verdict for a flow. */
static __always_inline void range_dst_set(void *dst, bool v6, __u32 svc_id, const union sock_ip *ip,
					  __be16 port, __u8 flags)
{
	if (range_dst_svc(dst, v6) == svc_id && range_dst_is(dst, v6, ip, port) &&
	    range_dst_flags(dst, v6) == flags)
		return;
	if (v6) {
		struct sock6_range_dst *d = dst;

		__builtin_memset(d, 0, sizeof(*d));
		d->svc_id = svc_id;
		__builtin_memcpy(d->backend, ip->v6, sizeof(d->backend));
		d->port = port;
		d->flags = flags;
	} else {
		struct sock4_range_dst *d = dst;

		d->svc_id = svc_id;
		d->backend = ip->v4;
		d->port = port;
		d->flags = flags;
		d->allowed_saddr = 0;
	}
}

/* range_msg_slot returns the msg slot of tag for ip:port: the one that
 * holds it, else (when create) a free one or the one to reuse, else
 * NULL. */
static __always_inline void *range_msg_slot(void *tag, bool v6, const union sock_ip *ip,
					    __be16 port, bool create)
{
	void *free = NULL;
	__u8 *next;
	__u32 i;

	for (i = 0; i < SOCK4_RANGE_MSG_SLOTS; i++) {
		void *d = range_tag_msg(tag, v6, i);

		if (range_dst_is(d, v6, ip, port))
			return d;
		if (!free && !range_dst_svc(d, v6))
			free = d;
	}
	if (!create)
		return NULL;
	if (free)
		return free;
	next = range_tag_next(tag, v6);
	i = (*next)++ & (SOCK4_RANGE_MSG_SLOTS - 1);
	return range_tag_msg(tag, v6, i);
}

/* sock_src_unset says whether the node's socket of ctx leaves its source
 * address to the kernel: neither bound nor chosen for this datagram (an
 * address the application chose, by bind() or IP_PKTINFO, is the source in
 * kube-proxy too). */
static __always_inline bool sock_src_unset(struct bpf_sock_addr *ctx, struct bpf_sock *sk,
					   bool sendmsg, bool ctx6, bool v6)
{
	union sock_ip src = {};

	if (v6) {
		if (sendmsg) {
			src.v6[0] = ctx->msg_src_ip6[0];
			src.v6[1] = ctx->msg_src_ip6[1];
			src.v6[2] = ctx->msg_src_ip6[2];
			src.v6[3] = ctx->msg_src_ip6[3];
		}
		if (sock_ip_zero(&src, true)) {
			src.v6[0] = sk->src_ip6[0];
			src.v6[1] = sk->src_ip6[1];
			src.v6[2] = sk->src_ip6[2];
			src.v6[3] = sk->src_ip6[3];
		}
		return sock_ip_zero(&src, true);
	}
	if (sendmsg)
		src.v4 = ctx6 ? ctx->msg_src_ip6[3] : ctx->msg_src_ip4;
	if (!src.v4)
		src.v4 = sk->src_ip4;
	return !src.v4;
}

/* sock_range_tag_set tells the egress program that the socket of ctx now
 * sends to ip:port (a backend) through a LoadBalancer IP of the
 * ServicePort svc_id, whose source ranges it must check; svc_id 0 says
 * that packets to ip:port are not checked. connect() sets the socket's
 * connected destination, sendmsg() (unconnected UDP) that of the datagram
 * being sent. Returns false when a needed tag could not be made.
 *
 * A socket never sent through such a LoadBalancer IP has no storage: for it
 * this is one lookup that finds nothing, and nothing is created. */
static __always_inline bool sock_range_tag_set(struct bpf_sock_addr *ctx, bool sendmsg, bool ctx6,
					       bool v6, __u32 svc_id, const union sock_ip *ip,
					       __be16 port)
{
	struct bpf_sock *sk = ctx->sk;
	bool node = false;
	__u8 flags = 0;
	void *tag, *dst;

	if (!sk)
		return !svc_id;
	if (svc_id && node_netns_cookie && bpf_get_netns_cookie(ctx) == node_netns_cookie) {
		node = true;
		if (sock_src_unset(ctx, sk, sendmsg, ctx6, v6))
			flags = RANGE_DST_F_AS_NODE;
	}
	tag = bpf_sk_storage_get(range_tags_map(v6), sk, 0,
				 svc_id ? BPF_SK_STORAGE_GET_F_CREATE : 0);
	if (!tag) {
		if (!svc_id)
			return true;
		lb_count(LB_M_SOCK_RANGE_TAG_ERR);
		return false;
	}
	if (node)
		*range_tag_flags(tag, v6) |= RANGE_TAG_F_NODE;
	if (!sendmsg) {
		range_dst_set(range_tag_conn(tag, v6), v6, svc_id, ip, port, flags);
		return true;
	}
	dst = range_msg_slot(tag, v6, ip, port, svc_id != 0);
	if (!dst)
		return true;
	if (svc_id) {
		range_dst_set(dst, v6, svc_id, ip, port, flags);
	} else {
		/* The same backend by a way without ranges: unchecked. */
		union sock_ip none = {};

		range_dst_set(dst, v6, 0, &none, 0, 0);
	}
	return true;
}

#endif /* EBPF_PROXY_SOCK_TAGS_H */
