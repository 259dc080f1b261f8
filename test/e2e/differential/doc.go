// Package differential runs one table of behaviour scenarios against
// upstream kube-proxy (iptables and nftables mode) and against ebpf-proxy
// (its BPF mode, the same with pods translated per packet, and its
// iptables and nftables fallback modes), on
// a real API server and real traffic between network namespaces, and
// compares what the clients saw: which endpoints answered and with which
// client address, or whether the connection was refused (REJECT), went
// unanswered (DROP) or was not handled at all.
//
// The scenarios and the runner live in the package's tests;
// `make -f test/e2e/e2e.mk e2e` runs them and ends with one line per
// fallback mode, then the BPF mode's line:
//
//	differential (iptables fallback): scenarios=<n> match=<n> mismatch=<n> known=<n> unsupported=<n>
//	differential (nftables fallback): ...
//	differential (BPF, pods per packet): scenarios=<n> match=<n> mismatch=<n> unsupported=<n>
//	differential: scenarios=<n> match=<n> mismatch=<n> unsupported=<n>
//
// The BPF mode with pods per packet (--socket-lb-scope=node) is judged as
// the BPF mode is. In the BPF mode's default (--socket-lb-scope=all) the
// meshed pod serves the mesh scenarios (a sidecar told where its pod
// connected) through its Pod object's opt-out annotation
// (ebpf-proxy.io/socket-lb: disabled): ebpf-proxy runs with the rights of
// deploy/rbac.yaml, which let it read the node's pods and the namespaces.
//
// The IPVS fallback is not in the run: the host's kernel has no ip_vs.
//
// The SCTP scenarios (sctpScenarios) run where the kernel can open SCTP
// sockets; on this machine's, which cannot, the run leaves them out and its
// summary says so. `make differential-sctp` runs them in the VM runner's
// 6.1 and 6.12 guests, with a subset of the kinds (KindsEnv) and SCTP
// required (SCTPEnv).
//
// A scenario that needs a feature a mode of ebpf-proxy lacks
// (ebpfProxyFeatures, fallbacks) is not run against that mode and counted
// as unsupported in its line.
package differential
