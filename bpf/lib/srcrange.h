/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* loadBalancerSourceRanges for the node's own sockets. kube-proxy checks a
 * pod's or the node's packet to a LoadBalancer IP against the ranges before
 * it translates it (its firewall chain runs in PREROUTING and OUTPUT). The
 * socket hooks translate at connect() or sendmsg(), when the socket's source
 * address is usually not chosen yet; so they tag the socket, and a
 * cgroup_skb egress program checks its packets, whose source is known.
 *
 * Only sock.c includes this file: the TC programs have no use for the map. */
#ifndef EBPF_PROXY_SRCRANGE_H
#define EBPF_PROXY_SRCRANGE_H

#include "maps.h"

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock4_range_tag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock4_range_tags_v1 SEC(".maps");

/* The tags of a socket's IPv6 destinations; its IPv4 ones (also
 * IPv4-mapped ones of an AF_INET6 socket, whose packets are IPv4) are in
 * sock4_range_tags. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock6_range_tag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock6_range_tags_v1 SEC(".maps");

/* An address the socket programs handle: IPv4 in v4, or IPv6 (v6 says
 * which, as in lb.h). */
union sock_ip {
	__be32 v4;
	__be32 v6[4];
};

static __always_inline bool sock_ip_eq(const union sock_ip *a, const union sock_ip *b, bool v6)
{
	if (!v6)
		return a->v4 == b->v4;
	return a->v6[0] == b->v6[0] && a->v6[1] == b->v6[1] && a->v6[2] == b->v6[2] &&
	       a->v6[3] == b->v6[3];
}

static __always_inline bool sock_ip_zero(const union sock_ip *a, bool v6)
{
	if (!v6)
		return !a->v4;
	return !(a->v6[0] | a->v6[1] | a->v6[2] | a->v6[3]);
}

/* range_allowed says whether saddr may reach the LoadBalancer IPs of the
 * ServicePort svc_id. The writer puts the LoadBalancer IPs themselves in
 * the trie when the ranges hold a node address, as kube-proxy admits them
 * as a source then. */
static __always_inline bool range_allowed(bool v6, __u32 svc_id, const union sock_ip *saddr)
{
	struct lb4_src_range_key key4 = {
		.prefixlen = 64,
		.svc_id = svc_id,
		.address = saddr->v4,
	};
	struct lb6_src_range_key key6 = {
		.prefixlen = 160,
		.svc_id = svc_id,
	};

	if (!v6)
		return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key4) != NULL;
	__builtin_memcpy(key6.address, saddr->v6, sizeof(key6.address));
	return bpf_map_lookup_elem(&lb6_source_ranges_v1, &key6) != NULL;
}

/* range_node_allowed says whether the ranges of svc_id hold an address of
 * the node. */
static __always_inline bool range_node_allowed(bool v6, __u32 svc_id)
{
	struct lb4_src_range_key key4 = {
		.prefixlen = 64,
		.svc_id = svc_id | SRC_RANGE_NODE,
	};
	struct lb6_src_range_key key6 = {
		.prefixlen = 160,
		.svc_id = svc_id | SRC_RANGE_NODE,
	};

	if (!v6)
		return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key4) != NULL;
	return bpf_map_lookup_elem(&lb6_source_ranges_v1, &key6) != NULL;
}

#endif /* EBPF_PROXY_SRCRANGE_H */
