// Package bench measures ebpf-proxy against upstream kube-proxy on a real
// API server. BenchmarkScale: Services programmed per second after start,
// peak memory (RSS, and the peak of the proxy's own memory cgroup, which
// counts the kernel memory it caused), and the latency of one endpoint
// change among many Services
// (`make -f test/e2e/e2e.mk e2e-bench`). BenchmarkNodePortRPS: requests per
// second from an external client through a NodePort to a pod on another
// node, new connections and persistent ones, as ratios against upstream's
// iptables mode (`make -f test/e2e/e2e.mk e2e-bench-rps`).
// BenchmarkNodePortPPS: packets per second on the same path, UDP frames
// made without a NIC by BPF_PROG_TEST_RUN's live-frames mode (an AF_PACKET
// socket where the kernel refuses it), for upstream's
// iptables and nftables modes and ebpf-proxy at TC and XDP, ending with
// issue 16's `bench:` lines (`make -f test/e2e/e2e.mk bench-pps`). All assert
// nothing but that traffic flows, and print a table. The benchmarks are in
// the package's test files.
package bench
