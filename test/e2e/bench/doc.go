// Package bench measures ebpf-proxy against upstream kube-proxy on a real
// API server. BenchmarkScale: Services programmed per second after start,
// peak memory, and the latency of one endpoint change among many Services
// (`make -f test/e2e/e2e.mk e2e-bench`). BenchmarkNodePortRPS: requests per
// second from an external client through a NodePort to a pod on another
// node, new connections and persistent ones, as ratios against upstream's
// iptables mode (`make -f test/e2e/e2e.mk e2e-bench-rps`). Both assert
// nothing but that traffic flows, and print a table. The benchmarks are in
// the package's test files.
package bench
