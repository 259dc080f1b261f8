/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What the answers that TC builds in place of a packet share: the ICMP
 * port unreachable of a frontend without endpoints (unreach.h) and the TCP
 * reset of a flow whose backend was removed (reset.h). Each goes back out of
 * the device the packet came in on, to the host it came from. */
#ifndef EBPF_PROXY_REPLY_H
#define EBPF_PROXY_REPLY_H

#include "common.h"
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>

/* pkt_reply_macs reads the frame's two MAC addresses (destination, then
 * source) into macs before the packet is rebuilt. Returns 0 or -1. */
static __always_inline int pkt_reply_macs(struct __sk_buff *skb, __u8 *macs)
{
	return bpf_skb_load_bytes(skb, 0, macs, 2 * ETH_ALEN) ? -1 : 0;
}

/* pkt_reply_send swaps the MAC addresses that pkt_reply_macs read into the
 * rebuilt frame and sends it back out of the device it came in on. Returns
 * the TC verdict. */
static __always_inline int pkt_reply_send(struct __sk_buff *skb, const __u8 *macs)
{
	if (bpf_skb_store_bytes(skb, 0, macs + ETH_ALEN, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, macs, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

#endif /* EBPF_PROXY_REPLY_H */
