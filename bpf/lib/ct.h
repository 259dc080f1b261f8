/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking for the TC programs: one LRU map holds, per flow, an
 * entry for the client's direction and one for the backend's replies, so that
 * a flow keeps its backend for its lifetime and its replies are translated
 * back. Only the TC programs include this header. */
#ifndef EBPF_PROXY_CT_H
#define EBPF_PROXY_CT_H

#include "maps.h"
#include "pkt.h"

#ifndef TC4_CT_MAX
#define TC4_CT_MAX 262144
#endif
#define TC4_SNAT_ADDRS_MAX 256

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_entry);
	__uint(max_entries, TC4_CT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc4_ct_v1 SEC(".maps");

/* Written by the agent for every device it attaches to. A map rather than a
 * constant: a node has several devices, and an address can change without
 * reloading the programs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct tc4_snat_addr);
	__uint(max_entries, TC4_SNAT_ADDRS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc4_snat_addrs_v1 SEC(".maps");

/* Lifetimes in seconds. An established TCP flow lives as long as
 * kube-proxy's conntrack keeps one (--conntrack-tcp-timeout-established,
 * 24h); a handshake that does not complete and a closing connection free
 * their entry (and source NAT port) soon. */
#define CT_LIFETIME_TCP	      86400
#define CT_LIFETIME_TCP_SYN   60
#define CT_LIFETIME_TCP_CLOSE 10
#define CT_LIFETIME_UDP	      120

/* How many random source NAT ports are tried for a new flow. */
#define SNAT_TRIES 16

static __always_inline __u32 ct_now(void)
{
	return bpf_ktime_get_ns() / 1000000000ULL;
}

/* ct_refresh extends e's lifetime for a packet of its flow. The entry is
 * written only when the expiry moves, which is at most once a second. */
static __always_inline void ct_refresh(struct ct4_entry *e, const struct pkt4 *p, __u32 now)
{
	__u32 life = CT_LIFETIME_UDP, exp;

	if (p->proto == IPPROTO_TCP) {
		if ((p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) && !(e->flags & CT_F_CLOSING))
			e->flags |= CT_F_CLOSING;
		if (e->flags & CT_F_CLOSING)
			life = CT_LIFETIME_TCP_CLOSE;
		else if (p->tcp_flags & TCP_FLAG_SYN)
			life = CT_LIFETIME_TCP_SYN;
		else
			life = CT_LIFETIME_TCP;
	}
	exp = now + life;
	if (e->expires != exp)
		e->expires = exp;
}

static __always_inline bool ct_expired(const struct ct4_entry *e, __u32 now)
{
	return (__s32)(now - e->expires) > 0;
}

/* ct_reply_key is the key of the reply entry of the flow whose client-side
 * entry is orig, for a packet p of that flow. */
static __always_inline void ct_reply_key(struct ct4_key *rkey, const struct ct4_entry *orig,
					 const struct pkt4 *p)
{
	rkey->saddr = orig->nat_daddr;
	rkey->sport = orig->nat_dport;
	rkey->daddr = orig->nat_saddr ? orig->nat_saddr : p->saddr;
	rkey->dport = orig->nat_saddr ? orig->nat_sport : p->sport;
	rkey->proto = p->proto;
	rkey->dir = CT_DIR_REPLY;
	rkey->pad[0] = 0;
	rkey->pad[1] = 0;
}

/* ct_snat_alloc records the reply entry rval under a free source NAT port
 * of rkey->daddr and leaves the port in rkey->dport. A port is free when no
 * reply entry uses it or the flow that did has expired. Returns 0, or -1
 * when SNAT_TRIES random ports were all busy. */
static __always_inline int ct_snat_alloc(struct ct4_key *rkey, const struct ct4_entry *rval,
					 __u16 port_min, __u16 port_max, __u32 now)
{
	__u32 range = (__u32)port_max - port_min + 1;
	struct ct4_entry *old;
	int i;

	if (port_max < port_min)
		return -1;
	for (i = 0; i < SNAT_TRIES; i++) {
		rkey->dport = bpf_htons(port_min + bpf_get_prandom_u32() % range);
		if (!bpf_map_update_elem(&tc4_ct_v1, rkey, rval, BPF_NOEXIST))
			return 0;
		old = bpf_map_lookup_elem(&tc4_ct_v1, rkey);
		if (old && ct_expired(old, now) &&
		    !bpf_map_update_elem(&tc4_ct_v1, rkey, rval, BPF_EXIST))
			return 0;
	}
	return -1;
}

#endif /* EBPF_PROXY_CT_H */
