/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking for the TC and XDP programs (through nodeport.h): one
 * LRU map holds, per flow, an entry for the client's direction and one for
 * the backend's replies, so that a flow keeps its backend for its lifetime
 * and its replies are translated back, and the source NAT ports. */
#ifndef EBPF_PROXY_CT_H
#define EBPF_PROXY_CT_H

#include "maps.h"
#include "parse.h"

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

/* The IPv6 flows, as tc4_ct_v1 (the loader sizes both alike). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct6_key);
	__type(value, struct ct6_entry);
	__uint(max_entries, TC4_CT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc6_ct_v1 SEC(".maps");

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

/* The IPv6 address source NAT gives traffic leaving a device, as
 * tc4_snat_addrs_v1; a device without one has no entry. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct tc6_snat_addr);
	__uint(max_entries, TC4_SNAT_ADDRS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc6_snat_addrs_v1 SEC(".maps");

/* The next hops of new flows (nexthop.h): per CPU, a direct-mapped cache
 * of NH_SLOTS slots indexed by a hash of the key; a slot holds the last
 * key that hashed there. The IPv6 twin is tc6_nexthop_v1. */
#ifndef NH_SLOTS
#define NH_SLOTS 1024
#endif
_Static_assert((NH_SLOTS & (NH_SLOTS - 1)) == 0, "NH_SLOTS is a power of two");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct nh4_slot);
	__uint(max_entries, NH_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc4_nexthop_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct nh6_slot);
	__uint(max_entries, NH_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc6_nexthop_v1 SEC(".maps");

/* By family (NH_SHARE_IPV4, NH_SHARE_IPV6): NH_SHARE_ON where the agent
 * found that a client's port cannot change its route (no multipath hash
 * over ports, no routing rule on the source port), NH_SHARE_ALL where its
 * address cannot either (nexthop.h), written before every sync of the
 * family; NH_SHARE_OFF, as a new map starts, makes every new flow look
 * its route up. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tc_nexthop_share_v1 SEC(".maps");

/* The flow tracking below is written once for both families, as lb.h: v6
 * is a constant at every call and says whether an entry is a struct
 * ct6_entry or a struct ct4_entry, a key a struct ct6_key or a struct
 * ct4_key. CT_E names a field the two entries share, CT_K one of the keys;
 * CT_E_ADDR and CT_K_ADDR an address, as a pointer to its words. */
#define CT_E(e, v6, f)	    (*((v6) ? &((struct ct6_entry *)(e))->f : &((struct ct4_entry *)(e))->f))
#define CT_K(k, v6, f)	    (*((v6) ? &((struct ct6_key *)(k))->f : &((struct ct4_key *)(k))->f))
#define CT_E_ADDR(e, v6, f) ((v6) ? ((struct ct6_entry *)(e))->f : &((struct ct4_entry *)(e))->f)
#define CT_K_ADDR(k, v6, f) ((v6) ? ((struct ct6_key *)(k))->f : &((struct ct4_key *)(k))->f)

static __always_inline void *ct_map(bool v6)
{
	return v6 ? (void *)&tc6_ct_v1 : (void *)&tc4_ct_v1;
}

/* Lifetimes in seconds. An established TCP flow lives as long as
 * kube-proxy's conntrack keeps one (--conntrack-tcp-timeout-established,
 * 24h); a handshake that does not complete and a closing connection free
 * their entry soon (a closed one frees its source NAT port at once, see
 * ct_tcp_track_v). A source-NATed UDP flow lives as in conntrack: 30 s
 * (nf_conntrack_udp_timeout) until it is a stream, that is until it has
 * seen a reply and is still active CT_UDP_STREAM_AGE seconds after it began,
 * then 120 s (nf_conntrack_udp_timeout_stream). DNS-like traffic, a new
 * source port per query, would otherwise hold a source NAT port for 120 s a
 * query. A UDP flow without source NAT, whose two entries each see one
 * direction only and use no port of ours, keeps 120 s. */
#define CT_LIFETIME_TCP	      86400
#define CT_LIFETIME_TCP_SYN   60
#define CT_LIFETIME_TCP_CLOSE 10
#define CT_LIFETIME_UDP	      120
#define CT_LIFETIME_UDP_SHORT 30
#define CT_UDP_STREAM_AGE     2

/* The TCP state flags, which a new connection on the tuple starts over. */
#define CT_F_TCP_STATE                                                                             \
	(CT_F_CLOSING | CT_F_FIN_ORIG | CT_F_FIN_REPLY | CT_F_FIN_REPLY_FIRST | CT_F_CLOSED |      \
	 CT_F_SYN_WAIT | CT_F_REPLY_CLOSING)

/* How many random source NAT ports are tried for a new flow. */
#define SNAT_TRIES 16

/* ct_now is the second of CLOCK_MONOTONIC the packet is in, as of the last
 * tick: the coarse clock reads a value the tick keeps, where the fine one
 * reads the TSC (a few tens of ns a packet), and every use here counts
 * whole seconds. The Writer's removal stamps read the same clock
 * (CLOCK_MONOTONIC_COARSE). */
static __always_inline __u32 ct_now(void)
{
	return bpf_ktime_get_coarse_ns() / 1000000000ULL;
}

/* ct_tcp_track_v follows a TCP flow's close in e's flags, for a packet with
 * TCP flags tf from the backend (reply) or the client. A source-NATed flow's reply entry sees
 * both directions (the client's packets refresh it in np_orig_valid), so it
 * knows when its port may be reused, as conntrack lets a new connection
 * take a NAT tuple whose entry is in TIME_WAIT or CLOSE
 * (nf_nat_used_tuple_harder):
 *  - an RST, from either side, closes the flow;
 *  - so does the ACK of the side that sent the first FIN once both sides
 *    have sent theirs: the final ACK (sequence numbers are not kept, so an
 *    ACK of earlier data that crosses the second FIN counts too; a port
 *    reused too early is then handled as a late packet, see
 *    np_lookup_tracked).
 * A half-closed flow (one FIN) or one in LAST_ACK (both FINs, no final ACK)
 * keeps its port. A client's SYN (without ACK) on a new entry, or on a flow
 * that was closing, is a new connection: the state starts over and the flow
 * waits for the backend's SYN (CT_F_SYN_WAIT), until which a backend packet
 * without SYN or RST belongs to an older connection. A SYN on an open flow
 * (a retransmission crossing the backend's answer) changes nothing. */
static __always_inline void ct_tcp_track_v(void *e, bool v6, __u8 tf, bool reply)
{
	__u16 fin = reply ? CT_F_FIN_REPLY : CT_F_FIN_ORIG;
	__u16 both = CT_F_FIN_ORIG | CT_F_FIN_REPLY;
	__u16 f = CT_E(e, v6, flags);

	if (tf & TCP_FLAG_RST) {
		f |= CT_F_CLOSED | CT_F_CLOSING;
	} else if (tf & TCP_FLAG_SYN) {
		if (reply)
			f &= ~CT_F_SYN_WAIT;
		else if (!(tf & TCP_FLAG_ACK) && (!CT_E(e, v6, expires) || (f & CT_F_CLOSING)))
			f = (f & ~CT_F_TCP_STATE) | CT_F_SYN_WAIT;
	} else if (tf & TCP_FLAG_FIN) {
		if (!(f & both) && reply)
			f |= CT_F_FIN_REPLY_FIRST;
		f |= fin | CT_F_CLOSING;
	} else if ((f & both) == both && (tf & TCP_FLAG_ACK) &&
		   reply == !!(f & CT_F_FIN_REPLY_FIRST)) {
		f |= CT_F_CLOSED;
	}
	if (CT_E(e, v6, flags) != f)
		CT_E(e, v6, flags) = f;
}

/* ct_udp_life is the lifetime a source-NATed UDP flow's packet p gives its
 * entry e (see CT_LIFETIME_UDP_SHORT), marking the flow replied and a stream
 * as it becomes one. born wraps after 18 hours, long past any flow that is
 * not a stream yet. */
static __always_inline __u32 ct_udp_life(void *e, bool v6, bool reply, __u32 now)
{
	__u16 f = CT_E(e, v6, flags);

	if (reply)
		f |= CT_F_UDP_REPLIED;
	if ((f & (CT_F_UDP_REPLIED | CT_F_UDP_STREAM)) == CT_F_UDP_REPLIED &&
	    (__u16)((__u16)now - CT_E(e, v6, born)) >= CT_UDP_STREAM_AGE)
		f |= CT_F_UDP_STREAM;
	if (CT_E(e, v6, flags) != f)
		CT_E(e, v6, flags) = f;
	return (f & CT_F_UDP_STREAM) ? CT_LIFETIME_UDP : CT_LIFETIME_UDP_SHORT;
}

/* ct_refresh_v extends e's lifetime for a packet of its flow (protocol
 * proto, TCP flags tcp_flags), from the backend when reply, and follows the
 * flow's state. A new entry (expires
 * still 0) is born now. The entry is written only when something moves:
 * the expiry at most once a second. A SYN on an open flow (the backend's
 * SYN-ACK sent again after the client's ACK, a client's SYN crossing it)
 * never shortens the flow's lifetime, as conntrack ignores it on an
 * established connection: only a new connection on the tuple, which
 * ct_tcp_track_v starts over from a closing flow, takes a SYN's lifetime. */
static __always_inline void ct_refresh_v(void *e, bool v6, __u8 proto, __u8 tcp_flags, __u32 now,
					 bool reply)
{
	__u32 life = CT_LIFETIME_UDP, exp;

	if (!CT_E(e, v6, expires))
		CT_E(e, v6, born) = (__u16)now;
	if (proto == IPPROTO_TCP) {
		ct_tcp_track_v(e, v6, tcp_flags, reply);
		if (CT_E(e, v6, flags) & CT_F_CLOSING)
			life = CT_LIFETIME_TCP_CLOSE;
		else if (!(tcp_flags & TCP_FLAG_SYN))
			life = CT_LIFETIME_TCP;
		else if (CT_E(e, v6, expires) > now + CT_LIFETIME_TCP_SYN)
			return;
		else
			life = CT_LIFETIME_TCP_SYN;
	} else if (CT_E(e, v6, flags) & CT_F_SNAT) {
		life = ct_udp_life(e, v6, reply, now);
	}
	exp = now + life;
	if (CT_E(e, v6, expires) != exp)
		CT_E(e, v6, expires) = exp;
}

/* ct_fib_get gives fib the next hop that e's flow's last FIB lookup found
 * (the device and both MAC addresses, struct ct4_entry's fib_*), when that
 * lookup was made in second now and let a packet of at least len bytes (IP
 * length) through; else it returns false and the caller looks it up. A
 * route or neighbour change thus reaches a flow within a second, and the
 * MTU is checked for every packet longer than those seen. */
static __always_inline bool ct_fib_get(const void *e, bool v6, __u32 now, __u32 len,
				       struct bpf_fib_lookup *fib)
{
	__u32 ifindex = CT_E(e, v6, fib_ifindex);

	if (!ifindex || CT_E(e, v6, fib_at) != (__u16)now || len > CT_E(e, v6, fib_len))
		return false;
	fib->ifindex = ifindex;
	if (v6) {
		__builtin_memcpy(fib->dmac, ((const struct ct6_entry *)e)->fib_dmac, ETH_ALEN);
		__builtin_memcpy(fib->smac, ((const struct ct6_entry *)e)->fib_smac, ETH_ALEN);
	} else {
		__builtin_memcpy(fib->dmac, ((const struct ct4_entry *)e)->fib_dmac, ETH_ALEN);
		__builtin_memcpy(fib->smac, ((const struct ct4_entry *)e)->fib_smac, ETH_ALEN);
	}
	return true;
}

/* ct_fib_put keeps in e the next hop fib that a successful FIB lookup found
 * in second now for a packet of len bytes. Two CPUs updating one entry at
 * once write the same next hop, but for a route or neighbour change
 * between their lookups (then one packet may leave with the older one). */
static __always_inline void ct_fib_put(void *e, bool v6, __u32 now, __u32 len,
				       const struct bpf_fib_lookup *fib)
{
	__u32 known = 0;

	/* A longer packet of the same second through the same device: the
	 * shorter ones seen before still pass. */
	if (CT_E(e, v6, fib_at) == (__u16)now && CT_E(e, v6, fib_ifindex) == fib->ifindex)
		known = CT_E(e, v6, fib_len);
	CT_E(e, v6, fib_len) = len > known ? len : known;
	CT_E(e, v6, fib_at) = (__u16)now;
	CT_E(e, v6, fib_ifindex) = fib->ifindex;
	if (v6) {
		__builtin_memcpy(((struct ct6_entry *)e)->fib_dmac, fib->dmac, ETH_ALEN);
		__builtin_memcpy(((struct ct6_entry *)e)->fib_smac, fib->smac, ETH_ALEN);
	} else {
		__builtin_memcpy(((struct ct4_entry *)e)->fib_dmac, fib->dmac, ETH_ALEN);
		__builtin_memcpy(((struct ct4_entry *)e)->fib_smac, fib->smac, ETH_ALEN);
	}
}

static __always_inline bool ct_expired_v(const void *e, bool v6, __u32 now)
{
	__u32 exp = v6 ? ((const struct ct6_entry *)e)->expires
		       : ((const struct ct4_entry *)e)->expires;

	return (__s32)(now - exp) > 0;
}

/* ct_reply_late_v says whether p, a backend's packet to a source NAT port
 * whose reply entry is e, belongs to an older connection than e's flow: a
 * TCP flow waiting for the backend's SYN only takes a SYN or an RST (which
 * refuses the connection) from it. Such a packet (the backend's
 * retransmitted FIN of the flow that had the port before, or the ACK a
 * backend socket still in TIME_WAIT or LAST_ACK answers the new SYN with)
 * must not reach the new client. Passed to the node's stack, which has no
 * socket on the port (the range is outside the ephemeral one), it is
 * answered with an RST: that ends the backend's leftover socket, and the
 * new client's next SYN gets through, as when the new client itself resets
 * it under conntrack. */
static __always_inline bool ct_reply_late_v(const void *e, bool v6, __u8 proto, __u8 tcp_flags)
{
	__u16 f = v6 ? ((const struct ct6_entry *)e)->flags : ((const struct ct4_entry *)e)->flags;

	return proto == IPPROTO_TCP && (f & CT_F_SYN_WAIT) &&
	       !(tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_RST));
}

/* ct_snat_alloc_v records the reply entry rval under a free source NAT port
 * of rkey->daddr and leaves the port in rkey->dport. A port is free when no
 * reply entry uses it, the flow that did has expired, or that flow is a
 * closed TCP connection (CT_F_CLOSED, counted). Taking over an entry leaves
 * the old flow's client-side entry pointing at a reply entry that is no
 * longer its own: np_orig_valid then lets its packets select again. Two
 * CPUs may take over the same entry at once; the loser's flow selects again
 * at its next packet, as after an eviction. Returns 0, or -1 when
 * SNAT_TRIES random ports were all busy. */
static __always_inline int ct_snat_alloc_v(void *rkey, bool v6, const void *rval, __u16 port_min,
					   __u16 port_max, __u32 now)
{
	__u32 range = (__u32)port_max - port_min + 1;
	void *old;
	bool closed;
	int i;

	if (port_max < port_min)
		return -1;
	for (i = 0; i < SNAT_TRIES; i++) {
		CT_K(rkey, v6, dport) = bpf_htons(port_min + bpf_get_prandom_u32() % range);
		if (!bpf_map_update_elem(ct_map(v6), rkey, rval, BPF_NOEXIST))
			return 0;
		old = bpf_map_lookup_elem(ct_map(v6), rkey);
		if (!old)
			continue;
		closed = !ct_expired_v(old, v6, now) && (CT_E(old, v6, flags) & CT_F_CLOSED);
		if ((closed || ct_expired_v(old, v6, now)) &&
		    !bpf_map_update_elem(ct_map(v6), rkey, rval, BPF_EXIST)) {
			if (closed)
				lb_count(LB_M_TC_SNAT_REUSED);
			return 0;
		}
	}
	return -1;
}

/* ct_orig_key fills okey, a struct ct6_key or struct ct4_key as v6 says,
 * with the key of the client-side entry of p's flow. */
static __always_inline void ct_orig_key(void *okey, bool v6, const void *p)
{
	pkt_addr_copy(v6, CT_K_ADDR(okey, v6, saddr), PKT_ADDR(p, v6, saddr));
	pkt_addr_copy(v6, CT_K_ADDR(okey, v6, daddr), PKT_ADDR(p, v6, daddr));
	CT_K(okey, v6, sport) = PKT_F(p, v6, sport);
	CT_K(okey, v6, dport) = PKT_F(p, v6, dport);
	CT_K(okey, v6, proto) = PKT_F(p, v6, proto);
	CT_K(okey, v6, dir) = CT_DIR_ORIG;
	CT_K(okey, v6, pad[0]) = 0;
	CT_K(okey, v6, pad[1]) = 0;
}

/* ct_reply_key fills rkey with the key of the reply entry of the flow whose
 * client-side entry is orig, for a packet p of that flow (all three of the
 * family v6 says): the backend's replies come to the source NAT address
 * and port of a source-NATed flow, else to the client. */
static __always_inline void ct_reply_key(void *rkey, bool v6, const void *orig, const void *p)
{
	bool snat = CT_E(orig, v6, flags) & CT_F_SNAT;

	pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, saddr), CT_E_ADDR(orig, v6, nat_daddr));
	CT_K(rkey, v6, sport) = CT_E(orig, v6, nat_dport);
	if (snat) {
		pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, daddr), CT_E_ADDR(orig, v6, nat_saddr));
		CT_K(rkey, v6, dport) = CT_E(orig, v6, nat_sport);
	} else {
		pkt_addr_copy(v6, CT_K_ADDR(rkey, v6, daddr), PKT_ADDR(p, v6, saddr));
		CT_K(rkey, v6, dport) = PKT_F(p, v6, sport);
	}
	CT_K(rkey, v6, proto) = PKT_F(p, v6, proto);
	CT_K(rkey, v6, dir) = CT_DIR_REPLY;
	CT_K(rkey, v6, pad[0]) = 0;
	CT_K(rkey, v6, pad[1]) = 0;
}

#endif /* EBPF_PROXY_CT_H */
