/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map keys and values. These layouts are the source of truth: bpf2go
 * generates the Go types from them, and internal/maps is the only code that
 * writes them. Byte order is in the types: __be fields are network order.
 * Padding is explicit so that the C and Go layouts cannot drift. */
#ifndef EBPF_PROXY_STRUCTS_H
#define EBPF_PROXY_STRUCTS_H

#include "common.h"

/* Which traffic a service entry answers. A frontend whose verdict is the
 * same for every client has one entry, in LB_SCOPE_EXT. One that treats
 * clients inside the cluster differently (externalTrafficPolicy=Local with
 * short-circuit) also has an LB_SCOPE_INT entry, and its master entry in
 * LB_SCOPE_EXT carries SVC_F_TWO_SCOPES. */
enum lb_scope {
	LB_SCOPE_EXT = 0,
	LB_SCOPE_INT = 1,
};

/* Service flags, in lb4_service.flags. */
enum {
	SVC_F_REJECT = 1 << 0,	   /* no usable endpoint anywhere: refuse */
	SVC_F_DROP = 1 << 1,	   /* traffic policy Local, none on this node */
	SVC_F_TWO_SCOPES = 1 << 2, /* an LB_SCOPE_INT entry exists */
	SVC_F_CLUSTER_IP = 1 << 3,
	SVC_F_NODE_PORT = 1 << 4,
	SVC_F_EXTERNAL_IP = 1 << 5,
	SVC_F_LOAD_BALANCER = 1 << 6,
	SVC_F_SOURCE_RANGES = 1 << 7, /* lb4_source_ranges says who may connect */
	SVC_F_EXT_LOCAL = 1 << 8,     /* externalTrafficPolicy=Local: no SNAT */
	SVC_F_LOCALHOST = 1 << 9,     /* a NodePort on 127.0.0.1: the node's sockets only */
	/* The ServicePort has a Maglev table: only then do TC and XDP hash
	 * a new flow and look the table up. */
	SVC_F_MAGLEV = 1 << 10,
};

/* Key of lb4_services. slot 0 is the master entry of a frontend; slots
 * 1..count hold its backends. */
struct lb4_key {
	__be32 address;
	__be16 dport;
	__u16 slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

/* Value of lb4_services. In the master entry count is the number of backend
 * slots and backend_id is 0; in a backend slot only backend_id and
 * rev_nat_id are set. svc_id names the ServicePort: every frontend of one
 * ServicePort (ClusterIP, NodePort, ...) shares it, and with it the
 * session affinity of its clients. */
struct lb4_service {
	__u32 backend_id;
	__u16 count;
	__u16 flags;
	__u32 rev_nat_id;
	__u32 affinity_timeout; /* seconds; 0 without session affinity */
	__u32 svc_id;
};

/* Who a session affinity entry is for: the network namespace of a socket
 * (each pod, and the node itself, is its own client) or, for traffic that
 * arrives from outside, the client's IPv4 address. */
enum {
	AFFINITY_CLIENT_NETNS = 0,
	AFFINITY_CLIENT_ADDR = 1,
};

/* Key and value of lb4_affinity: the backend a client last used for a
 * ServicePort, and when. */
struct lb4_affinity_key {
	__u64 client; /* netns cookie, or an IPv4 address in network order */
	__u32 svc_id;
	__u8 client_kind;
	__u8 pad[3];
};

struct lb4_affinity {
	__u64 last_used_ns; /* bpf_ktime_get_ns() */
	__u32 backend_id;
	__u8 pad[4];
};

/* Key of lb4_members: present while backend_id is one the ServicePort svc_id
 * may choose, so that neither session affinity nor a UDP socket's earlier
 * choice outlives a backend's selection. */
struct lb4_member_key {
	__u32 backend_id;
	__u32 svc_id;
};

/* Key of lb4_source_ranges, an LPM trie: a loadBalancerSourceRanges CIDR of
 * the ServicePort svc_id. prefixlen counts svc_id's 32 bits and the CIDR's;
 * a lookup gives 64 and the client's address. */
struct lb4_src_range_key {
	__u32 prefixlen;
	__u32 svc_id;
	__be32 address;
};

/* svc_id | SRC_RANGE_NODE with address 0 is present when the ranges of
 * svc_id hold an address of the node: the node's sockets whose source the
 * kernel picks are admitted (see sock4_range_dst). No ServicePort id has
 * this bit. */
#define SRC_RANGE_NODE 0x80000000u

/* One destination a socket sends to through a LoadBalancer IP whose
 * Service has loadBalancerSourceRanges: the ServicePort (0: none) and the
 * backend the socket hook chose, and the source address a packet to it was
 * last admitted from (0: none yet). */
struct sock4_range_dst {
	__u32 svc_id;
	__be32 backend;
	__be16 port;
	__u8 flags;
	__u8 pad;
	__be32 allowed_saddr;
};

/* Flags of struct sock4_range_dst. */
enum {
	/* A socket of the node whose source address the kernel picks. kube-
	 * proxy sees its packet with the source of the route to the
	 * LoadBalancer IP, a node address; the translated socket gets that of
	 * the route to the endpoint (a pod bridge's address, say). So it is
	 * checked as the node's address, not as its own. */
	RANGE_DST_F_AS_NODE = 1 << 0,
};

/* Flags of struct sock4_range_tag. */
enum {
	RANGE_TAG_F_NODE = 1 << 0, /* a socket of the node's own namespace */
};

/* How many destinations of sendmsg() a tag holds (a power of 2). */
#define SOCK4_RANGE_MSG_SLOTS 4

/* Value of sock4_range_tags, a socket storage: what the egress program
 * must check of a socket's packets. conn is set by connect(); msg holds the
 * destinations sendmsg() with an address (unconnected UDP) last sent to
 * through such a LoadBalancer IP, so that datagrams that threads send at
 * once to several destinations each meet their own; a send to the same
 * backend by another way clears its slot. A packet is checked against the
 * msg slot of its destination, else against conn. next is the slot to
 * reuse when all are taken. */
struct sock4_range_tag {
	struct sock4_range_dst conn;
	struct sock4_range_dst msg[SOCK4_RANGE_MSG_SLOTS];
	__u8 flags;
	__u8 next;
	__u8 pad[2];
};

/* Backend flags, in lb4_backend.flags. */
enum {
	BE_F_TERMINATING = 1 << 0,
};

/* BE_F_LOCAL: the endpoint runs on this node. The TC program delivers
 * external traffic to it without source NAT; traffic to an endpoint on
 * another node is sent there with the node's address as its source. */
enum {
	BE_F_LOCAL = 1 << 1,
};

/* Value of lb4_backends, keyed by a __u32 backend id. */
struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 flags;
};

/* Value of lb4_reverse_nat, keyed by a __u32 rev-nat id: the frontend a
 * translated flow must appear to come from. */
struct lb4_reverse_nat {
	__be32 address;
	__be16 port;
	__u8 pad[2];
};

/* Key and value of sock4_udp_fwd: the backend an unconnected UDP socket
 * sent to for a frontend, so that its datagrams stay on one backend as a
 * conntrack entry keeps a flow in kube-proxy. */
struct sock4_udp_key {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u8 pad[2];
};

struct sock4_udp {
	__u32 backend_id;
	__u32 svc_id;
};

/* Key and value of sock4_reverse_nat: for a socket (by cookie) that was sent
 * to a backend, the frontend its replies must appear to come from. */
struct sock4_revnat_key {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u8 pad[2];
};

struct sock4_revnat {
	__be32 address;
	__be16 port;
	__u8 pad[2];
	__u32 rev_nat_id;
};

/* IPv6. The socket programs serve IPv6 destinations from maps of their own,
 * whose layouts follow the IPv4 ones with a 16-byte address (four __be32
 * words in network order). Backend, reverse NAT and ServicePort ids are
 * those of the IPv6 maps: the agent numbers each family apart. The service
 * value (struct lb4_service), the membership key, the affinity value and
 * the UDP forward value name no address and are shared with IPv4. An
 * IPv4-mapped destination (::ffff:a.b.c.d) of an AF_INET6 socket is IPv4:
 * it goes through the IPv4 maps. */

/* Key of lb6_services, as struct lb4_key. */
struct lb6_key {
	__be32 address[4];
	__be16 dport;
	__u16 slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

/* Value of lb6_backends, keyed by a __u32 backend id, as struct
 * lb4_backend. */
struct lb6_backend {
	__be32 address[4];
	__be16 port;
	__u8 proto;
	__u8 flags;
};

/* Value of lb6_revnat, keyed by a __u32 rev-nat id, as struct
 * lb4_reverse_nat. */
struct lb6_reverse_nat {
	__be32 address[4];
	__be16 port;
	__u8 pad[2];
};

/* Key of lb6_affinity, as struct lb4_affinity_key: client is a netns
 * cookie in its first word (AFFINITY_CLIENT_NETNS, the socket programs), or
 * room for an IPv6 address in network order (AFFINITY_CLIENT_ADDR). */
struct lb6_affinity_key {
	__u64 client[2];
	__u32 svc_id;
	__u8 client_kind;
	__u8 pad[3];
};

/* Key of lb6_source_ranges, an LPM trie, as struct lb4_src_range_key:
 * prefixlen counts svc_id's 32 bits and the CIDR's; a lookup gives 160 and
 * the client's address. svc_id | SRC_RANGE_NODE with address 0 is the
 * node's entry. */
struct lb6_src_range_key {
	__u32 prefixlen;
	__u32 svc_id;
	__be32 address[4];
};

/* Key of sock6_udp_fwd (value struct sock4_udp), as struct sock4_udp_key. */
struct sock6_udp_key {
	__u64 cookie;
	__be32 address[4];
	__be16 port;
	__u8 pad[6];
};

/* Key and value of sock6_revnat, as struct sock4_revnat_key and struct
 * sock4_revnat. */
struct sock6_revnat_key {
	__u64 cookie;
	__be32 address[4];
	__be16 port;
	__u8 pad[6];
};

struct sock6_revnat {
	__be32 address[4];
	__be16 port;
	__u8 pad[2];
	__u32 rev_nat_id;
};

/* One destination of a socket's IPv6 packets that the egress program
 * checks against a ServicePort's source ranges, as struct sock4_range_dst. */
struct sock6_range_dst {
	__u32 svc_id;
	__be32 backend[4];
	__be16 port;
	__u8 flags;
	__u8 pad;
	__be32 allowed_saddr[4];
};

/* Value of sock6_range_tags, a socket storage, as struct sock4_range_tag:
 * what the egress program must check of a socket's IPv6 packets. */
struct sock6_range_tag {
	struct sock6_range_dst conn;
	struct sock6_range_dst msg[SOCK4_RANGE_MSG_SLOTS];
	__u8 flags;
	__u8 next;
	__u8 pad[2];
};

/* Direction of a tc4_ct entry's key. */
enum {
	CT_DIR_ORIG = 0,  /* the flow as the client sends it, to the frontend */
	CT_DIR_REPLY = 1, /* the flow as the backend answers, after translation */
};

/* Key of tc4_ct: a flow's addresses and ports as the packet carries them
 * when the TC program sees it. */
struct ct4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;
	__u8 pad[2];
};

/* Flags of struct ct4_entry. */
enum {
	CT_F_SNAT = 1 << 0,    /* source translated: replies arrive at ingress */
	CT_F_CLOSING = 1 << 1, /* TCP FIN or RST seen: the entry expires soon */
	/* TCP close tracking (ct.h), what conntrack's TIME_WAIT and CLOSE
	 * states say: the flow's reply entry sees both directions. */
	CT_F_FIN_ORIG = 1 << 2,	       /* the client's FIN seen */
	CT_F_FIN_REPLY = 1 << 3,       /* the backend's FIN seen */
	CT_F_FIN_REPLY_FIRST = 1 << 4, /* the backend closed first */
	CT_F_CLOSED = 1 << 5,	       /* closed: its source NAT port is free */
	CT_F_SYN_WAIT = 1 << 6,	       /* opened by a SYN, no SYN from the backend yet */
	/* UDP (ct.h): a reply seen, and the flow a stream (replied and still
	 * active 2 s after it began), as conntrack's SEEN_REPLY and ASSURED. */
	CT_F_UDP_REPLIED = 1 << 7,
	CT_F_UDP_STREAM = 1 << 8,
	/* On the client-side entry of a source-NATed TCP flow: the backend
	 * sent a FIN or an RST (seen by the reply entry), so the client's
	 * packets are checked in full (nodeport.h np_orig_fresh). */
	CT_F_REPLY_CLOSING = 1 << 9,
	/* A pod's flow, translated at its device (tc.c tc_pod_ingress): its
	 * translated packets may meet the node's devices' programs too (a
	 * pod bridge among --devices), which must take them for no stale
	 * tuple (nodeport.h np_forget_stale_reply). */
	CT_F_POD = 1 << 10,
};

/* Value of tc4_ct: how packets with the key's tuple are rewritten. A zero
 * address leaves that side untouched. In CT_DIR_ORIG entries nat_d* is the
 * backend and nat_s* the node address and port of the source NAT; in
 * CT_DIR_REPLY entries nat_s* is the frontend the reply must come from and
 * nat_d* the client it returns to (source NAT only). */
struct ct4_entry {
	__be32 nat_saddr;
	__be32 nat_daddr;
	__be16 nat_sport;
	__be16 nat_dport;
	__u32 backend_id;
	__u32 svc_id;
	/* Seconds of CLOCK_MONOTONIC after which the entry no longer holds
	 * its flow: a new flow with the same tuple selects again, and a
	 * source NAT port may be reused. */
	__u32 expires;
	__u16 flags;
	/* The low 16 bits of the second the entry was made in (a UDP flow's
	 * age decides its lifetime). */
	__u16 born;
	/* The next hop that XDP's FIB lookup found for the packets this entry
	 * rewrites (xdp.c xdp_send): the device, the MAC addresses, and the
	 * largest packet (IP length) the lookup let through. It is used only
	 * in the second it was found in (fib_at, the low 16 bits of it), so
	 * that a route or neighbour change takes effect within a second, and
	 * only for packets up to fib_len, so that the MTU is still checked.
	 * fib_ifindex 0: none; a flow to a local backend keeps none, and its
	 * fib_at is the second its checks were last made in (nodeport.h
	 * np_checked). */
	__u32 fib_ifindex;
	__u16 fib_len;
	__u16 fib_at;
	__u8 fib_dmac[6];
	__u8 fib_smac[6];
};

/* Value of tc4_snat_addrs, keyed by a __u32 ifindex: the address source NAT
 * gives traffic leaving that device. */
struct tc4_snat_addr {
	__be32 address;
};

/* Key and value of tc6_ct and tc6_snat_addrs, the IPv6 twins of tc4_ct and
 * tc4_snat_addrs: the same fields, with 16-byte addresses (four __be32 words
 * in network order). The TC programs track IPv6 flows with the same rules
 * (ct.h), their flags are those of struct ct4_entry. */
struct ct6_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;
	__u8 pad[2];
};

struct ct6_entry {
	__be32 nat_saddr[4];
	__be32 nat_daddr[4];
	__be16 nat_sport;
	__be16 nat_dport;
	__u32 backend_id;
	__u32 svc_id;
	__u32 expires;
	__u16 flags;
	__u16 born;
	/* As in struct ct4_entry. */
	__u32 fib_ifindex;
	__u16 fib_len;
	__u16 fib_at;
	__u8 fib_dmac[6];
	__u8 fib_smac[6];
};

struct tc6_snat_addr {
	__be32 address[4];
};

/* A slot of tc4_nexthop (a per-CPU array, nexthop.h): the next hop that
 * the FIB lookup of a new flow's first packet (nodeport.h np_snat_lookup)
 * found, and the key it serves, everything that lookup is given but the
 * client's port: the client, the backend and its port, the protocol, the
 * TOS and the device the flow came in on. The agent lets a client's flows
 * share a next hop only where the client's port cannot change the route
 * (tc_nexthop_share). */
struct nh4_key {
	__be32 saddr;
	__be32 daddr;
	__u32 ifindex;
	__be16 dport;
	__u8 proto;
	__u8 tos;
};

/* struct nh4_key for IPv6 (no TOS: the lookup is given no traffic class or
 * flow label). */
struct nh6_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__u32 ifindex;
	__be16 dport;
	__u8 proto;
	__u8 pad;
};

/* The next hop of a slot, as struct ct4_entry's fib_* fields keep a
 * flow's (the same layout): the device (0: none), the largest packet (IP
 * length) the lookup let through, the low 16 bits of the second it was
 * made in (only that second's new flows take it) and the MAC addresses. */
struct nh_entry {
	__u32 ifindex;
	__u16 len;
	__u16 at;
	__u8 dmac[6];
	__u8 smac[6];
};

struct nh4_slot {
	struct nh4_key key;
	struct nh_entry nh;
};

struct nh6_slot {
	struct nh6_key key;
	struct nh_entry nh;
};

/* Values of tc_nexthop_share, by family (NH_SHARE_IPV4, NH_SHARE_IPV6). */
enum {
	NH_SHARE_IPV4 = 0,
	NH_SHARE_IPV6 = 1,
	NH_SHARE_OFF = 0, /* every new flow is looked up (the default) */
	NH_SHARE_ON = 1,  /* a client's new flows share a next hop (nexthop.h) */
	NH_SHARE_ALL = 2, /* so do different clients' (the route ignores the source) */
};

/* Indices of lb_metrics: per-CPU packet and event counters. */
enum lb_metric {
	LB_M_XLATE_TCP = 0,	/* TCP connect translated */
	LB_M_XLATE_UDP,		/* UDP connect or sendmsg translated */
	LB_M_REJECT,		/* refused: no endpoint */
	LB_M_DROP,		/* refused: policy Local, no local endpoint */
	LB_M_NO_SLOT,		/* master entry without its slot: a bug */
	LB_M_NO_BACKEND,	/* slot pointing at a missing backend: a bug */
	LB_M_REVNAT_HIT,	/* reply address translated back */
	LB_M_REVNAT_STALE,	/* reverse entry of a deleted frontend */
	LB_M_REVNAT_UPDATE_ERR, /* could not record a reverse entry */
	LB_M_AFFINITY_HIT,	/* backend chosen by session affinity */
	LB_M_AFFINITY_STALE,	/* affinity entry expired or its backend gone */
	LB_M_UDP_STICKY,	/* UDP datagram kept on its socket's backend */
	LB_M_TC_NEW_LOCAL,	/* TC: new external flow to a local backend */
	LB_M_TC_NEW_SNAT,	/* TC: new external flow to a remote backend, SNAT */
	LB_M_TC_FWD,		/* TC: packet of a tracked flow translated */
	LB_M_TC_REPLY,		/* TC: reply translated back */
	LB_M_TC_ICMP_FAIL,	/* TC: could not build the ICMP unreachable */
	LB_M_TC_SNAT_NO_PORT,	/* TC: no free source NAT port */
	LB_M_TC_SNAT_NO_ADDR,	/* TC: no source NAT address for the device */
	LB_M_TC_NO_ROUTE,	/* TC: no route or neighbour for a translated packet */
	LB_M_TC_CT_FULL,	/* TC: could not record a flow */
	LB_M_TC_FRAGMENT,	/* TC: fragment to a frontend, not translated */
	LB_M_TC_SOURCE_RANGE,	/* TC: client outside loadBalancerSourceRanges */
	LB_M_MAGLEV,		/* TC: backend chosen by a Maglev table */
	LB_M_TC_ICMP_XLATE,	/* TC: ICMP error about a tracked flow translated */
	LB_M_TC_STALE_REPLY,	/* TC: stale reply entry of a reused tuple dropped */
	LB_M_XDP_NEW_SNAT,	/* XDP: new flow to a remote backend, SNAT, sent */
	LB_M_XDP_FWD,		/* XDP: packet of a source-NATed flow translated, sent */
	LB_M_XDP_REPLY,		/* XDP: reply translated back, sent */
	LB_M_XDP_TO_TC,		/* XDP: passed to TC (next hop, device, mid-stream TCP) */
	LB_M_XDP_MULTIBUF,	/* XDP: multi-buffer frame passed to TC */
	LB_M_SOCK_SOURCE_RANGE, /* socket: packet of a pod or the node outside the ranges dropped */
	LB_M_SOCK_RANGE_TAG_ERR, /* socket: could not tag a socket for the range check */
	LB_M_TC_SNAT_REUSED,	 /* TC/XDP: a closed flow's source NAT port reused */
	LB_M_TC_SNAT_LATE,	 /* TC: backend's late packet of a reused port, to the stack */
	LB_M_TC_RESET,		 /* TC: TCP flow to a removed backend reset */
	LB_M_TC_RESET_FAIL,	 /* TC: could not build that reset */
	LB_M_TC_NEXTHOP_SHARED,	 /* TC/XDP: new flow's next hop from the client's earlier flow */
	LB_M_TC_NF_TRACKED, /* TC: segment of a connection netfilter translates, to the stack */
	LB_M_TC_POD_NEW,    /* TC: new flow of a pod translated per packet */
	LB_M_TC_POD_SNAT,   /* TC: new flow of a pod masqueraded (hairpin, external frontend) */
	LB_M_TC_PORT_CLASH, /* TC: new flow's reply tuple another frontend's: source port changed */
	LB_M_MAX,
};

#endif /* EBPF_PROXY_STRUCTS_H */
