/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map definitions shared by every program. Names carry a layout version:
 * a layout change gets a new name so that a pinned map of the old layout is
 * never reinterpreted. Sizes are defaults; the loader patches them.
 *
 * The hash maps only the agent writes (services, backends, reverse NAT,
 * memberships, Maglev fingerprints) are not preallocated: their kernel
 * memory follows what they hold, so a node pays for the Services it has,
 * not for the maps' capacity. The LRU maps the programs write (affinity,
 * connection tracking, socket reverse NAT) are always preallocated by the
 * kernel; the loader sizes them from the node's memory. */
#ifndef EBPF_PROXY_MAPS_H
#define EBPF_PROXY_MAPS_H

#include "structs.h"

#ifndef LB4_SERVICES_MAX
#define LB4_SERVICES_MAX 262144
#endif
#ifndef LB4_BACKENDS_MAX
#define LB4_BACKENDS_MAX 262144
#endif
#ifndef LB4_REVNAT_MAX
#define LB4_REVNAT_MAX 65536
#endif
#ifndef LB4_AFFINITY_MAX
#define LB4_AFFINITY_MAX 262144
#endif
#ifndef LB4_MEMBERS_MAX
#define LB4_MEMBERS_MAX 262144
#endif
#ifndef LB4_SOURCE_RANGES_MAX
#define LB4_SOURCE_RANGES_MAX 65536
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, LB4_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_services_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, LB4_BACKENDS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_backends_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, LB4_REVNAT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_revnat_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb4_affinity);
	__uint(max_entries, LB4_AFFINITY_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_affinity_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_member_key);
	__type(value, __u8);
	__uint(max_entries, LB4_MEMBERS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_members_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_src_range_key);
	__type(value, __u8);
	__uint(max_entries, LB4_SOURCE_RANGES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_source_ranges_v1 SEC(".maps");

/* The IPv6 maps of the socket programs (struct lb6_key and the others in
 * structs.h), sized by the IPv4 maps' limits unless the loader patches
 * them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_key);
	__type(value, struct lb4_service);
	__uint(max_entries, LB4_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_services_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb6_backend);
	__uint(max_entries, LB4_BACKENDS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_backends_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb6_reverse_nat);
	__uint(max_entries, LB4_REVNAT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_revnat_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_affinity_key);
	__type(value, struct lb4_affinity);
	__uint(max_entries, LB4_AFFINITY_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_affinity_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_member_key);
	__type(value, __u8);
	__uint(max_entries, LB4_MEMBERS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_members_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb6_src_range_key);
	__type(value, __u8);
	__uint(max_entries, LB4_SOURCE_RANGES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_source_ranges_v1 SEC(".maps");

/* The ports that external frontends (NodePorts, ExternalIPs, LoadBalancer
 * IPs) of a family use or used, a bit per port (bit port % 32 of word
 * port / 32), so that TC and XDP pass a packet to any other port after one
 * array lookup, before connection tracking. Ports are only ever added: a
 * flow to a frontend lives on after the frontend goes (as conntrack keeps
 * kube-proxy's flows), so its port stays. The Writer adds a frontend's port
 * before it writes the frontend; the agent adds the ports of the flows
 * connection tracking holds before it attaches the programs. */
#define LB_PORT_WORDS (65536 / 32)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, LB_PORT_WORDS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_ext_ports_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, LB_PORT_WORDS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_ext_ports_v1 SEC(".maps");

/* The second (of CLOCK_MONOTONIC_COARSE, ct.h ct_now's clock) in which the
 * Writer last deleted a backend or a backend's membership of a ServicePort,
 * by family (LB_REMOVED_AT_IPV4, _IPV6): a check of a tracked flow made
 * before a removal says nothing after it, so the TC and XDP programs check
 * every flow's packets in full in that second (nodeport.h np_orig_fresh). */
enum {
	LB_REMOVED_AT_IPV4 = 0,
	LB_REMOVED_AT_IPV6 = 1,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_removed_at_v1 SEC(".maps");

#define LB_METRICS_SLOTS 128
_Static_assert(LB_M_MAX <= LB_METRICS_SLOTS, "lb_metrics_v1 has no room for every counter");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, enum lb_metric); /* also puts the enum in BTF for bpf2go */
	__type(value, __u64);
	/* Room for counters added later: a new counter must not change the
	 * map's size, or a pinned map would no longer fit the new programs. */
	__uint(max_entries, LB_METRICS_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_metrics_v1 SEC(".maps");

static __always_inline void lb_count(enum lb_metric m)
{
	__u32 key = m;
	__u64 *v = bpf_map_lookup_elem(&lb_metrics_v1, &key);

	if (v)
		*v += 1;
}

#endif /* EBPF_PROXY_MAPS_H */
