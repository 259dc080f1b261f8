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
