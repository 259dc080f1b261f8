/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maglev consistent hashing for traffic from outside the node. A
 * ServicePort that uses it has a table of MAGLEV_TABLE_SIZE backend ids,
 * built by the agent (internal/maglev) from its external endpoints; a new
 * flow takes the backend at the entry its hash selects. Every node builds
 * the same table for the same endpoints and hashes a flow the same way, so a
 * flow that a router moves to another node keeps its backend, and a change
 * of endpoints moves few flows. The agent swaps a whole table at once by
 * replacing the inner map. */
#ifndef EBPF_PROXY_MAGLEV_H
#define EBPF_PROXY_MAGLEV_H

#include "maps.h"

#ifndef LB4_MAGLEV_MAX
#define LB4_MAGLEV_MAX 65536
#endif
/* The default table size, a prime; the loader patches the inner map's size
 * and maglev_table_size together. */
#define MAGLEV_DEFAULT_SIZE 16381

/* Entries of every table: the loader sets it with the inner map's size. */
volatile const __u32 maglev_table_size = MAGLEV_DEFAULT_SIZE;

struct lb4_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32); /* backend id */
	__uint(max_entries, MAGLEV_DEFAULT_SIZE);
};

/* ServicePort id -> its table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, LB4_MAGLEV_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb4_maglev_inner);
} lb4_maglev_v1 SEC(".maps");

/* ServicePort id -> fingerprint of its table's backend set, which only the
 * agent reads: it rewrites a table only when its backends change, also
 * across restarts. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, LB4_MAGLEV_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_maglev_fp_v1 SEC(".maps");

static __always_inline __u32 rol32(__u32 word, unsigned int shift)
{
	return (word << (shift & 31)) | (word >> ((-shift) & 31));
}

/* flow_hash is Bob Jenkins' lookup3 final mix over the flow's addresses,
 * ports and protocol with a fixed seed: the same on every node, unlike the
 * kernel's skb hash, which is seeded at boot. */
static __always_inline __u32 flow_hash(__be32 saddr, __be32 daddr, __be16 sport, __be16 dport,
				       __u8 proto)
{
	__u32 a = (__u32)saddr + 0xdeadbeef + 12;
	__u32 b = (__u32)daddr + 0xdeadbeef + 12;
	__u32 c = (((__u32)sport << 16) | (__u32)dport) + (proto ^ 0x9e3779b9) + 0xdeadbeef + 12;

	c ^= b;
	c -= rol32(b, 14);
	a ^= c;
	a -= rol32(c, 11);
	b ^= a;
	b -= rol32(a, 25);
	c ^= b;
	c -= rol32(b, 16);
	a ^= c;
	a -= rol32(c, 4);
	b ^= a;
	b -= rol32(a, 14);
	c ^= b;
	c -= rol32(b, 24);
	return c;
}

/* lb4_maglev_backend_id returns the backend id the ServicePort's Maglev
 * table holds for hash, or 0 when the ServicePort has no table (it picks at
 * random then). */
static __always_inline __u32 lb4_maglev_backend_id(__u32 svc_id, __u32 hash)
{
	__u32 size = maglev_table_size;
	__u32 idx, *id;
	void *table;

	if (!size)
		return 0;
	table = bpf_map_lookup_elem(&lb4_maglev_v1, &svc_id);
	if (!table)
		return 0;
	idx = hash % size;
	id = bpf_map_lookup_elem(table, &idx);
	return id ? *id : 0;
}

#endif /* EBPF_PROXY_MAGLEV_H */
