/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maglev consistent hashing for traffic from outside the node. A
 * ServicePort that uses it has a table of MAGLEV_TABLE_SIZE backend ids,
 * built by the agent (internal/maglev) from its external endpoints; a new
 * flow takes the backend at the entry its hash selects. Every node builds
 * the same table for the same endpoints and hashes a flow the same way, so a
 * flow that a router moves to another node keeps its backend, and a change
 * of endpoints moves few flows. The agent swaps a whole table at once by
 * replacing the inner map. Each family has its tables, keyed by the ids of
 * its ServicePorts (the IPv4 and IPv6 writers number them apart); the
 * helpers take the family as lb.h's do, v6. */
#ifndef EBPF_PROXY_MAGLEV_H
#define EBPF_PROXY_MAGLEV_H

#include "maps.h"

#ifndef LB4_MAGLEV_MAX
#define LB4_MAGLEV_MAX 65536
#endif
#ifndef LB6_MAGLEV_MAX
#define LB6_MAGLEV_MAX 65536
#endif
/* The default table size, a prime; the loader patches the inner map's size
 * and maglev_table_size together. */
#define MAGLEV_DEFAULT_SIZE 16381

/* Entries of every table: the loader sets it with the inner map's size. */
volatile const __u32 maglev_table_size = MAGLEV_DEFAULT_SIZE;

/* One table, of either family. */
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
	__uint(map_flags, BPF_F_NO_PREALLOC);
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
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb4_maglev_fp_v1 SEC(".maps");

/* The IPv6 ServicePorts' tables and fingerprints, as above. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, LB6_MAGLEV_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb4_maglev_inner);
} lb6_maglev_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, LB6_MAGLEV_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb6_maglev_fp_v1 SEC(".maps");

static __always_inline void *lb_maglev_map(bool v6)
{
	return v6 ? (void *)&lb6_maglev_v1 : (void *)&lb4_maglev_v1;
}

static __always_inline __u32 rol32(__u32 word, unsigned int shift)
{
	return (word << (shift & 31)) | (word >> ((-shift) & 31));
}

/* The flow hashes are Bob Jenkins' lookup3 (hashword) over the flow's
 * addresses, ports and protocol with a fixed seed: the same on every node,
 * unlike the kernel's skb hash, which is seeded at boot, and the same in
 * every release, as nodes of two releases share flows during an upgrade.
 * lookup3_mix mixes three words before the next three are added;
 * lookup3_final mixes the last three into the hash. */
#define LOOKUP3_INIT   0xdeadbeef
#define LOOKUP3_GOLDEN 0x9e3779b9

static __always_inline void lookup3_mix(__u32 *a, __u32 *b, __u32 *c)
{
	*a -= *c;
	*a ^= rol32(*c, 4);
	*c += *b;
	*b -= *a;
	*b ^= rol32(*a, 6);
	*a += *c;
	*c -= *b;
	*c ^= rol32(*b, 8);
	*b += *a;
	*a -= *c;
	*a ^= rol32(*c, 16);
	*c += *b;
	*b -= *a;
	*b ^= rol32(*a, 19);
	*a += *c;
	*c -= *b;
	*c ^= rol32(*b, 4);
	*b += *a;
}

static __always_inline __u32 lookup3_final(__u32 a, __u32 b, __u32 c)
{
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

/* flow_word is the last word of both hashes: the ports and protocol. */
static __always_inline __u32 flow_word(__be16 sport, __be16 dport, __u8 proto)
{
	return (((__u32)sport << 16) | (__u32)dport) + (proto ^ LOOKUP3_GOLDEN);
}

/* flow_hash hashes an IPv4 flow: three words. */
static __always_inline __u32 flow_hash(__be32 saddr, __be32 daddr, __be16 sport, __be16 dport,
				       __u8 proto)
{
	__u32 init = LOOKUP3_INIT + 3 * 4;

	return lookup3_final((__u32)saddr + init, (__u32)daddr + init,
			     flow_word(sport, dport, proto) + init);
}

/* flow_hash6_masked is flow_hash6 of the source address's words ANDed
 * with smask: all ones hashes the address, 0 the unspecified one. */
static __always_inline __u32 flow_hash6_masked(const __be32 *saddr, __be32 smask,
					       const __be32 *daddr, __be16 sport, __be16 dport,
					       __u8 proto)
{
	__u32 a, b, c;

	a = b = c = LOOKUP3_INIT + 9 * 4;
	a += saddr[0] & smask;
	b += saddr[1] & smask;
	c += saddr[2] & smask;
	lookup3_mix(&a, &b, &c);
	a += saddr[3] & smask;
	b += daddr[0];
	c += daddr[1];
	lookup3_mix(&a, &b, &c);
	a += daddr[2];
	b += daddr[3];
	c += flow_word(sport, dport, proto);
	return lookup3_final(a, b, c);
}

/* flow_hash6 hashes an IPv6 flow: the two addresses' eight words, then
 * the ports and protocol, nine words in all. */
static __always_inline __u32 flow_hash6(const __be32 *saddr, const __be32 *daddr, __be16 sport,
					__be16 dport, __u8 proto)
{
	return flow_hash6_masked(saddr, ~(__be32)0, daddr, sport, dport, proto);
}

/* lb_maglev_backend_id returns the backend id the Maglev table of the
 * ServicePort svc_id, of family v6, holds for hash, or 0 when the
 * ServicePort has no table (it picks at random then). */
static __always_inline __u32 lb_maglev_backend_id(bool v6, __u32 svc_id, __u32 hash)
{
	__u32 size = maglev_table_size;
	__u32 idx, *id;
	void *table;

	/* Hashed before the lookup: else the compiler keeps the flow's
	 * words across it, on the stack. */
	barrier_var(hash);
	if (!size)
		return 0;
	table = bpf_map_lookup_elem(lb_maglev_map(v6), &svc_id);
	if (!table)
		return 0;
	idx = hash % size;
	id = bpf_map_lookup_elem(table, &idx);
	return id ? *id : 0;
}

#endif /* EBPF_PROXY_MAGLEV_H */
