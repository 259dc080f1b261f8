// Package modes tests the agent's choice of proxy mode and its moves
// between modes with the real ebpf-proxy binary: it runs inside a sandbox
// node's network namespace, reads one NodePort Service from a manifests
// directory, and clients in pod and external namespaces connect through it.
//
//   - auto mode with the BPF dataplane made to fail (the agent's
//     EBPF_PROXY_TEST_BPF_FAILURE hook) picks nftables where nft works and
//     iptables elsewhere (never ipvs, which runs only when named), says why
//     in its log, its metrics and /proxyMode, and serves the ClusterIP and
//     the NodePort;
//   - a restart in another mode leaves no BPF link or pin, nftables table,
//     iptables chain, virtual server, ipset or dummy interface of the
//     earlier one, and a client connecting throughout never fails;
//   - --cleanup after any mode leaves nothing;
//   - on a dual-stack node nftables, iptables and ipvs mode run a dataplane
//     per family and serve both, ebpf mode serves IPv6 through the same
//     programs (TestDualStack, TestDualStackIPVS).
//
// The IPVS cases need a kernel with ip_vs: test/vmtest runs them; on a host
// without it they are skipped, inside the VM they fail.
package modes
