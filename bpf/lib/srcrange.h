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

/* range_allowed says whether saddr may reach the LoadBalancer IPs of the
 * ServicePort svc_id. The writer puts the LoadBalancer IPs themselves in
 * the trie when the ranges hold a node address, as kube-proxy admits them
 * as a source then. */
static __always_inline bool range_allowed(__u32 svc_id, __be32 saddr)
{
	struct lb4_src_range_key key = {
		.prefixlen = 64,
		.svc_id = svc_id,
		.address = saddr,
	};

	return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key) != NULL;
}

/* range_node_allowed says whether the ranges of svc_id hold an address of
 * the node. */
static __always_inline bool range_node_allowed(__u32 svc_id)
{
	struct lb4_src_range_key key = {
		.prefixlen = 64,
		.svc_id = svc_id | SRC_RANGE_NODE,
	};

	return bpf_map_lookup_elem(&lb4_source_ranges_v1, &key) != NULL;
}

#endif /* EBPF_PROXY_SRCRANGE_H */
