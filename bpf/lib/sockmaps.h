/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The maps of the socket hooks alone (sock.c): which backend each socket
 * was sent to, for the reverse translation and the ending of its sockets,
 * and the backend of each unconnected UDP socket's destination. The TC and
 * XDP objects do not carry them. */
#ifndef EBPF_PROXY_SOCKMAPS_H
#define EBPF_PROXY_SOCKMAPS_H

#include "maps.h"

#ifndef SOCK4_REVNAT_MAX
#define SOCK4_REVNAT_MAX 262144
#endif

/* Pods on a node: Kubernetes' default is 110, its documented ceiling per
 * node 250; a node's network namespaces stay far below this. */
#define SOCK_NETNS_PACKET_MAX 4096

/* The network namespaces, by cookie, whose sockets the hooks leave as they
 * are when every socket is translated (node_sockets_only unset): pods that
 * asked for their Service traffic to be translated per packet at their
 * devices instead (the agent's opt-out annotation), so that a proxy inside
 * them (a service mesh's sidecar) sees the Service address. The agent
 * writes it; the value is unused. Allocated as entries come. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u8);
	__uint(max_entries, SOCK_NETNS_PACKET_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock_netns_packet_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock4_revnat_key);
	__type(value, struct sock4_revnat);
	__uint(max_entries, SOCK4_REVNAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock4_revnat_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock4_udp_key);
	__type(value, struct sock4_udp);
	__uint(max_entries, SOCK4_REVNAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock4_udp_fwd_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock6_revnat_key);
	__type(value, struct sock6_revnat);
	__uint(max_entries, SOCK4_REVNAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock6_revnat_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock6_udp_key);
	__type(value, struct sock4_udp);
	__uint(max_entries, SOCK4_REVNAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock6_udp_fwd_v1 SEC(".maps");

#endif /* EBPF_PROXY_SOCKMAPS_H */
