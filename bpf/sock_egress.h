/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The source range check at cgroup egress (part of sock.c, which includes
 * it last: one object holds the socket programs and this one, which reads
 * the tags the socket hooks write, sock_tags.h). The loader attaches it
 * only while some Service has source ranges. */
#ifndef EBPF_PROXY_SOCK_EGRESS_H
#define EBPF_PROXY_SOCK_EGRESS_H

/* Return values of cgroup_skb egress programs: bit 0 passes the packet,
 * bit 1 reports congestion, which a UDP sendmsg() treats as a silent drop
 * (without IP_RECVERR) where a plain drop fails it with EPERM. */
#define SKB_DROP    0
#define SKB_PASS    1
#define SKB_DROP_CN 2

/* The fixed IPv6 header (RFC 8200). */
struct range_ip6hdr {
	__be32 vtc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be32 saddr[4];
	__be32 daddr[4];
};

/* A packet as the source range check reads it. */
struct range_pkt {
	union sock_ip saddr;
	union sock_ip daddr;
	__be16 dport;
	__u8 proto;
};

/* range_pkt_read reads the addresses and destination port of a TCP or UDP
 * packet of family v6; false for anything else. The egress hook runs
 * before fragmentation: an IPv4 packet with an offset is not one of ours,
 * and neither is an IPv6 packet whose next header is not TCP or UDP
 * (sockets' own packets carry no extension headers here). */
static __always_inline bool range_pkt_read(struct __sk_buff *skb, bool v6, struct range_pkt *p)
{
	__be16 ports[2];
	__u32 l4;

	__builtin_memset(p, 0, sizeof(*p));
	if (v6) {
		struct range_ip6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)))
			return false;
		p->proto = ip6.nexthdr;
		__builtin_memcpy(p->saddr.v6, ip6.saddr, sizeof(p->saddr.v6));
		__builtin_memcpy(p->daddr.v6, ip6.daddr, sizeof(p->daddr.v6));
		l4 = sizeof(ip6);
	} else {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)))
			return false;
		if (ip.frag_off & bpf_htons(0x1fff))
			return false;
		p->proto = ip.protocol;
		p->saddr.v4 = ip.saddr;
		p->daddr.v4 = ip.daddr;
		l4 = ip.ihl * 4;
	}
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return false;
	if (bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)))
		return false;
	p->dport = ports[1];
	return true;
}

/* range_check is the verdict on a packet of family v6 that the full
 * socket sk sends (see cg_egress4). */
static __always_inline int range_check(struct __sk_buff *skb, struct bpf_sock *sk, bool v6)
{
	struct range_pkt p;
	void *tag, *dst;
	__u32 svc_id;

	tag = bpf_sk_storage_get(range_tags_map(v6), sk, 0, 0);
	if (!tag)
		return SKB_PASS;
	if (!range_pkt_read(skb, v6, &p))
		return SKB_PASS;
	dst = range_msg_slot(tag, v6, &p.daddr, p.dport, false);
	if (!dst) {
		dst = range_tag_conn(tag, v6);
		if (!range_dst_is(dst, v6, &p.daddr, p.dport))
			return SKB_PASS;
	}
	svc_id = range_dst_svc(dst, v6);
	if (!svc_id || range_dst_admitted(dst, v6, &p.saddr))
		return SKB_PASS;
	if ((range_dst_flags(dst, v6) & RANGE_DST_F_AS_NODE)
		    ? range_node_allowed(v6, svc_id)
		    : range_allowed(v6, svc_id, &p.saddr)) {
		range_dst_admit(dst, v6, &p.saddr);
		return SKB_PASS;
	}
	lb_count(LB_M_SOCK_SOURCE_RANGE);
	if (p.proto == IPPROTO_UDP && !(*range_tag_flags(tag, v6) & RANGE_TAG_F_NODE))
		return SKB_DROP_CN;
	return SKB_DROP;
}

/* cg_egress4 drops a packet that a socket tagged by sock_range_tag_set
 * sends to its backend from a source address outside the ServicePort's
 * loadBalancerSourceRanges, as kube-proxy's firewall chain does. It checks
 * IPv6 packets too, against the IPv6 tags and ranges; its name, which its
 * pinned link carries, is from when it checked IPv4 only.
 *
 * What the sender sees is kube-proxy's: a TCP connect() retransmits its SYN
 * until it times out; a pod's UDP datagram is lost without an error (kube-
 * proxy drops it in the node's PREROUTING); the node's own UDP send() fails
 * with EPERM (kube-proxy drops it in OUTPUT, which fails the send). A
 * source address admitted once is remembered for the destination, so later
 * packets pay one comparison; a refused one is checked again, as a dropped
 * packet leaves no conntrack entry in kube-proxy. */
SEC("cgroup_skb/egress")
int cg_egress4(struct __sk_buff *skb)
{
	struct bpf_sock *sk;

	sk = skb->sk;
	if (!sk)
		return SKB_PASS;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return SKB_PASS;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return range_check(skb, sk, false);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return range_check(skb, sk, true);
	return SKB_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#endif /* EBPF_PROXY_SOCK_EGRESS_H */
