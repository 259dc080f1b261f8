// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* A small translator that exists only to prove internal/testing/pktest, the packet
 * fixture framework, before the real TC and XDP programs exist. It is never
 * loaded by the agent.
 *
 * Both entry points parse the same way: frames that are not IPv4 and IPv4
 * headers that are malformed are dropped; truncated packets, fragments and
 * anything without a NAT entry pass untouched. A UDP or TCP packet whose
 * destination has an entry in sample_nat gets its destination address and
 * port rewritten with incremental checksum updates: by hand at XDP, which
 * then sends it back out (XDP_TX), and with the checksum helpers at TC, which
 * also marks it. The parser follows the IHL, so packets with IP options are
 * translated too. */

#include "../lib/common.h"

/* The few header layouts the sample needs; the vendored UAPI headers do not
 * carry the networking ones. */
#define ETH_HLEN       14
#define ETH_P_IP       0x0800
#define IP_MF	       0x2000
#define IP_OFFSET      0x1fff
#define IP_CSUM_OFF    10
#define IP_DADDR_OFF   16
#define L4_DPORT_OFF   2
#define UDP_CSUM_OFF   6
#define TCP_CSUM_OFF   16
#define UDP_HLEN       8
#define TCP_HLEN       20
#define CSUM_MANGLED_0 0xffff

/* Return values of TC programs (linux/pkt_cls.h). */
#define TC_ACT_OK   0
#define TC_ACT_SHOT 2

struct sample_ethhdr {
	__u8 h_dest[6];
	__u8 h_source[6];
	__be16 h_proto;
};

struct sample_iphdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

/* The first four bytes of UDP and TCP headers. */
struct sample_ports {
	__be16 source;
	__be16 dest;
};

/* A destination to translate, (address, port, protocol) in network order. */
struct nat_key {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* The destination it becomes. */
struct nat_val {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

/* Why a packet took its path; counted so that tests see the path taken, not
 * only the verdict. */
enum event {
	SAMPLE_EV_REWRITTEN,
	SAMPLE_EV_NO_MATCH,
	SAMPLE_EV_FRAGMENT,
	SAMPLE_EV_TRUNCATED,
	SAMPLE_EV_NOT_IPV4,
	SAMPLE_EV_MALFORMED,
	SAMPLE_EV_MARKED,
	SAMPLE_EV_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct nat_key);
	__type(value, struct nat_val);
	__uint(max_entries, 16);
} sample_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, enum event); /* also puts the enum in BTF for bpf2go */
	__type(value, __u64);
	__uint(max_entries, SAMPLE_EV_MAX);
} sample_events SEC(".maps");

/* The mark TC puts on packets it translated; a packet that already carries
 * it is left alone. A constant rather than an immediate store into the
 * context, which the 6.1 verifier rejects (BPF_ST into ctx). */
volatile const __u32 sample_mark = 0x5a;

/* Set only by pktest's own tests, to prove that they catch a translator
 * that forgets the L4 checksum. */
volatile const __u8 sample_bug_skip_l4_csum = 0;

static __always_inline void sample_count(enum event ev)
{
	__u64 *n = bpf_map_lookup_elem(&sample_events, &ev);

	if (n)
		__sync_fetch_and_add(n, 1);
}

enum sample_action {
	SAMPLE_PASS,
	SAMPLE_DROP,
	SAMPLE_REWRITE,
};

/* Where the translation applies, as offsets from the start of the frame. */
struct sample_xlate {
	__u32 l3_off;
	__u32 l4_off;
	__u32 csum_off; /* of the L4 checksum, from l4_off */
	__u8 proto;
	__be32 old_addr;
	__be32 new_addr;
	__be16 old_port;
	__be16 new_port;
};

/* sample_classify decides what to do with the frame in [data, data_end) and
 * fills x for SAMPLE_REWRITE. It never reads past data_end nor past the IP
 * total length, so a truncated packet cannot be mistranslated. */
static __always_inline enum sample_action sample_classify(void *data, void *data_end,
							  struct sample_xlate *x)
{
	struct sample_ethhdr *eth = data;
	struct sample_iphdr *ip = data + ETH_HLEN;
	struct nat_key key = {};
	struct nat_val *val;
	struct sample_ports *ports;
	__u32 ihl, tot_len, l4_len, hlen;
	void *l4;

	if ((void *)(eth + 1) > data_end) {
		sample_count(SAMPLE_EV_TRUNCATED);
		return SAMPLE_PASS;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP)) {
		sample_count(SAMPLE_EV_NOT_IPV4);
		return SAMPLE_DROP;
	}
	if ((void *)(ip + 1) > data_end) {
		sample_count(SAMPLE_EV_TRUNCATED);
		return SAMPLE_PASS;
	}
	ihl = ip->ver_ihl & 0x0f;
	tot_len = bpf_ntohs(ip->tot_len);
	/* The 6.1 verifier does not bound the result of a byte swap, and
	 * tot_len is added to a packet pointer below: bound it again, behind a
	 * barrier that keeps the compiler from dropping the mask. */
	barrier_var(tot_len);
	tot_len &= 0xffff;
	if ((ip->ver_ihl >> 4) != 4 || ihl < 5 || tot_len < ihl * 4) {
		sample_count(SAMPLE_EV_MALFORMED);
		return SAMPLE_DROP;
	}
	/* Bytes after the IP total length are link padding, not payload. */
	if (data + ETH_HLEN + tot_len > data_end) {
		sample_count(SAMPLE_EV_TRUNCATED);
		return SAMPLE_PASS;
	}
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) {
		sample_count(SAMPLE_EV_FRAGMENT);
		return SAMPLE_PASS;
	}
	if (ip->protocol == IPPROTO_UDP) {
		hlen = UDP_HLEN;
		x->csum_off = UDP_CSUM_OFF;
	} else if (ip->protocol == IPPROTO_TCP) {
		hlen = TCP_HLEN;
		x->csum_off = TCP_CSUM_OFF;
	} else {
		sample_count(SAMPLE_EV_NO_MATCH);
		return SAMPLE_PASS;
	}
	l4_len = tot_len - ihl * 4;
	l4 = (void *)ip + ihl * 4;
	if (l4_len < hlen || l4 + hlen > data_end) {
		sample_count(SAMPLE_EV_TRUNCATED);
		return SAMPLE_PASS;
	}
	ports = l4;
	key.addr = ip->daddr;
	key.port = ports->dest;
	key.proto = ip->protocol;
	val = bpf_map_lookup_elem(&sample_nat, &key);
	if (!val) {
		sample_count(SAMPLE_EV_NO_MATCH);
		return SAMPLE_PASS;
	}
	x->l3_off = ETH_HLEN;
	x->l4_off = ETH_HLEN + ihl * 4;
	x->proto = ip->protocol;
	x->old_addr = ip->daddr;
	x->new_addr = val->addr;
	x->old_port = ports->dest;
	x->new_port = val->port;
	return SAMPLE_REWRITE;
}

static __always_inline __u16 sample_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* sample_csum_replace updates a ones' complement checksum for a 32-bit field
 * changing from `from` to `to` (RFC 1624, eqn. 3). Byte order does not
 * matter as long as the checksum and the field are read the same way. */
static __always_inline __u16 sample_csum_replace(__u16 check, __u32 from, __u32 to)
{
	__u32 sum = (__u16)~check;

	sum += (~from & 0xffff) + (~from >> 16);
	sum += (to & 0xffff) + (to >> 16);
	return (__u16)~sample_csum_fold(sum);
}

SEC("xdp")
int pktest_sample_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct sample_xlate x = {};
	struct sample_iphdr *ip;
	struct sample_ports *ports;
	__sum16 *check;

	switch (sample_classify(data, data_end, &x)) {
	case SAMPLE_DROP:
		return XDP_DROP;
	case SAMPLE_PASS:
		return XDP_PASS;
	default:
		break;
	}
	/* The verifier needs the bounds again for the offsets of x. */
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end || x.l4_off > ETH_HLEN + 60 || x.csum_off > TCP_CSUM_OFF)
		return XDP_PASS;
	ports = data + x.l4_off;
	check = data + x.l4_off + x.csum_off;
	if ((void *)(ports + 1) > data_end || (void *)(check + 1) > data_end)
		return XDP_PASS;

	ip->check = sample_csum_replace(ip->check, x.old_addr, x.new_addr);
	ip->daddr = x.new_addr;
	/* A UDP checksum of zero means none (RFC 768): it stays zero, and a
	 * computed zero is sent as all ones. */
	if (!sample_bug_skip_l4_csum && (x.proto == IPPROTO_TCP || *check)) {
		__u16 c = sample_csum_replace(*check, x.old_addr, x.new_addr);

		c = sample_csum_replace(c, x.old_port, x.new_port);
		if (x.proto == IPPROTO_UDP && !c)
			c = CSUM_MANGLED_0;
		*check = c;
	}
	ports->dest = x.new_port;
	sample_count(SAMPLE_EV_REWRITTEN);
	return XDP_TX;
}

SEC("tc")
int pktest_sample_tc(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct sample_xlate x = {};
	__u64 l4_flags, port_flags = 0;
	__u16 l4_csum;
	__u32 mark;

	if (skb->mark == sample_mark) {
		sample_count(SAMPLE_EV_MARKED);
		return TC_ACT_OK;
	}
	switch (sample_classify(data, data_end, &x)) {
	case SAMPLE_DROP:
		return TC_ACT_SHOT;
	case SAMPLE_PASS:
		return TC_ACT_OK;
	default:
		break;
	}
	l4_flags = x.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	/* The helpers keep skb->csum right for CHECKSUM_COMPLETE packets: the
	 * address change cancels out in the IP header, the port change in the
	 * L4 checksum, and BPF_F_PSEUDO_HDR carries the pseudo-header's part of
	 * the L4 checksum change. A UDP datagram without checksum has no field
	 * to cancel the port change in, so skb->csum must follow the store. */
	if (bpf_skb_load_bytes(skb, x.l4_off + x.csum_off, &l4_csum, sizeof(l4_csum)))
		return TC_ACT_SHOT;
	if (x.proto == IPPROTO_UDP && !l4_csum)
		port_flags = BPF_F_RECOMPUTE_CSUM;
	if (!sample_bug_skip_l4_csum &&
	    (bpf_l4_csum_replace(skb, x.l4_off + x.csum_off, x.old_addr, x.new_addr,
				 l4_flags | BPF_F_PSEUDO_HDR | sizeof(x.new_addr)) ||
	     bpf_l4_csum_replace(skb, x.l4_off + x.csum_off, x.old_port, x.new_port,
				 l4_flags | sizeof(x.new_port))))
		return TC_ACT_SHOT;
	if (bpf_l3_csum_replace(skb, x.l3_off + IP_CSUM_OFF, x.old_addr, x.new_addr,
				sizeof(x.new_addr)) ||
	    bpf_skb_store_bytes(skb, x.l3_off + IP_DADDR_OFF, &x.new_addr, sizeof(x.new_addr), 0) ||
	    bpf_skb_store_bytes(skb, x.l4_off + L4_DPORT_OFF, &x.new_port, sizeof(x.new_port),
				port_flags))
		return TC_ACT_SHOT;
	mark = sample_mark;
	skb->mark = mark;
	sample_count(SAMPLE_EV_REWRITTEN);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
