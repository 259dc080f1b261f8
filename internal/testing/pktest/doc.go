// Package pktest is the packet fixture framework for the TC and XDP programs,
// in the style of the kernel's BPF selftests and katran's test fixtures: a
// table per program of {name, input packet, expected verdict, expected output
// packet}, run through BPF_PROG_TEST_RUN.
//
// It has three parts:
//
//   - Builders for Ethernet/IPv4/TCP/UDP/ICMP packets with correct lengths
//     and checksums by default (UDP, TCP, ICMPEcho, ICMPUnreachable, ...), and
//     With* methods to vary any header field or break it on purpose: wrong
//     checksums, IP options, fragments (Builder.Fragments), bad header
//     lengths, link padding. Truncate and Cuts produce truncated packets;
//     Builder6 (TCP6, UDP6, ICMPv6) IPv6 ones, and ARPRequest, IPv6UDP and
//     Frame other frames.
//   - A tolerant decoder and checksum verifier for output packets (Decode,
//     VerifyChecksums; IPv4 and IPv6, with the packet an ICMP or ICMPv6
//     error quotes) and a field-level Diff ("ipv4.dst: got 10.0.0.1 want
//     10.0.0.2") that works on exactly the malformed packets where a strict
//     parser would give up.
//   - The runner: Run executes a table of Case against a loaded program and
//     checks verdict, output bytes and output checksums; Exec runs one case
//     for custom checks; Bench reports ns per packet.
//
// What BPF_PROG_TEST_RUN does, and what the runner does about it (read from
// net/bpf/test_run.c of Debian's 6.1 and 6.12 kernels, and measured on them
// and on 6.18):
//
//   - Both program types need at least ETH_HLEN (14) bytes of input, or the
//     kernel returns EINVAL. Run refuses shorter cases with that reason;
//     Cuts starts at 14 bytes. No device hands a TC or XDP program less.
//   - TC input whose EtherType says IPv4 (IPv6) but that ends inside the
//     IPv4 (IPv6) header is refused by kernels with upstream commit
//     12bec2bd4b76 (2026; Debian's 6.1.192, 6.12.117 and the 6.18 host have
//     it). RunCase skips such cases there, naming the reason
//     (ErrShortL3Refused); XDP runs them on every kernel.
//   - TC (SchedCLS, SchedACT): the frame must start with an Ethernet header;
//     the kernel sets skb->protocol from its EtherType (eth_type_trans) and
//     the skb belongs to the loopback device unless SKBContext.Ifindex names
//     another one, so skb->pkt_type is PACKET_OTHERHOST for unicast frames.
//     The whole frame is linear; at most 3712 bytes fit (4 KiB pages).
//     Run passes BPF_F_TEST_SKB_CHECKSUM_COMPLETE by default, so the packet
//     arrives as from a NIC that delivers CHECKSUM_COMPLETE and the kernel
//     fails the run (EBADMSG) if the program leaves skb->csum inconsistent
//     with the data: the mistake that gives "hw csum failure" in production.
//   - XDP: up to 3520 bytes are linear (4096 minus 256 bytes headroom and the
//     shared info); the rest is put into fragment pages, which a program
//     without frags support never sees. XDPContext.LinearLen makes the
//     linear part shorter to test that on small packets. XDP_TX and
//     XDP_REDIRECT are only return values here: nothing is transmitted.
//   - With a repeat count, the kernel runs the program again and again on
//     the same buffer: a program that rewrites the packet sees its own
//     output from the second run on. Bench therefore measures such programs
//     one run per syscall on a fresh copy, with the kernel's own timer, and
//     subtracts the cost of timing a single run.
//
// Everything that loads or runs a program needs root (CAP_BPF and
// CAP_NET_ADMIN); builders, decoder and diff do not.
package pktest
