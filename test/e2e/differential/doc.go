// Package differential runs one table of behaviour scenarios against
// upstream kube-proxy (iptables and nftables mode) and against ebpf-proxy, on
// a real API server and real traffic between network namespaces, and
// compares what the clients saw: which endpoints answered and with which
// client address, or whether the connection was refused (REJECT), went
// unanswered (DROP) or was not handled at all.
//
// The scenarios and the runner live in the package's tests;
// `make -f test/e2e/e2e.mk e2e` runs them and ends with one line
//
//	differential: scenarios=<n> match=<n> mismatch=<n> unsupported=<n>
//
// A scenario that needs a feature ebpf-proxy lacks (ebpfProxyFeatures) is
// run against upstream only and counted as unsupported.
package differential
