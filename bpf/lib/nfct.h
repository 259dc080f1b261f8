/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The kernel's own connection tracking, asked about the TCP connections that
 * it translated before the agent took a frontend over: kube-proxy's, or a
 * fallback mode's, on a node the agent starts on. Such a connection's
 * packets after the takeover are of no flow the agent tracks; taken as new
 * flows, they would reach a backend by another tuple and be reset (or
 * silently lost, for the handshake's last ACK). Handed to the stack, the
 * kernel's entry keeps translating them, also once the rules that made it
 * are gone, for as long as the connection lasts, as it would have under
 * kube-proxy. The lookup needs the conntrack kfuncs (6.0 and later, and the
 * nf_conntrack module loaded when the programs are, with its BTF): without
 * them no connection is the kernel's, and the programs decide as before. */
#ifndef EBPF_PROXY_NFCT_H
#define EBPF_PROXY_NFCT_H

#include "common.h"
#include "parse.h"

/* The kernel's types, as far as the kfuncs take them. The loader checks a
 * kfunc's prototype against the kernel's by kind only, so that these stand
 * for the kernel's struct nf_conn and struct bpf_ct_opts. */
struct nf_conn {
	int unused;
};

/* struct bpf_ct_opts as 6.0 first took it (12 bytes); later kernels, whose
 * struct grew, take this size too. */
struct nfct_opts {
	__s32 netns_id; /* -1: the packet's namespace */
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

/* Set by the loader when the kernel has both kfuncs (internal/loader
 * conntrackKfuncs). A weak kfunc the kernel lacks becomes a call the
 * verifier refuses, so the branch to it must be dead at load; the kernels
 * before 6.4 refuse the test of a kfunc's address (bpf_ksym_exists). */
volatile const __u8 nfct_kfuncs = 0;

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					 __u32 tuple__sz, struct nfct_opts *opts,
					 __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *ct) __ksym __weak;

/* nfct_tracks says whether the kernel's connection tracking holds an entry
 * for p, a TCP packet of the family v6 says, by its tuple as it came in
 * (the original direction of the connections kube-proxy translates at
 * PREROUTING). */
static __always_inline bool nfct_tracks(struct __sk_buff *skb, bool v6, const void *p)
{
	struct bpf_sock_tuple t = {};
	struct nfct_opts opts = {
		.netns_id = -1,
		.l4proto = IPPROTO_TCP,
	};
	struct nf_conn *ct;
	__u32 size;

	if (!nfct_kfuncs)
		return false;
	if (v6) {
		__builtin_memcpy(t.ipv6.saddr, PKT_ADDR(p, true, saddr), sizeof(t.ipv6.saddr));
		__builtin_memcpy(t.ipv6.daddr, PKT_ADDR(p, true, daddr), sizeof(t.ipv6.daddr));
		t.ipv6.sport = PKT_F(p, true, sport);
		t.ipv6.dport = PKT_F(p, true, dport);
		size = sizeof(t.ipv6);
	} else {
		t.ipv4.saddr = ((const struct pkt4 *)p)->saddr;
		t.ipv4.daddr = ((const struct pkt4 *)p)->daddr;
		t.ipv4.sport = PKT_F(p, false, sport);
		t.ipv4.dport = PKT_F(p, false, dport);
		size = sizeof(t.ipv4);
	}
	ct = bpf_skb_ct_lookup(skb, &t, size, &opts, sizeof(opts));
	if (!ct)
		return false;
	bpf_ct_release(ct);
	return true;
}

#endif /* EBPF_PROXY_NFCT_H */
