// Package bench measures ebpf-proxy against upstream kube-proxy at scale on
// a real API server: Services programmed per second after start, peak
// memory, and the latency of one endpoint change among many Services. It
// asserts nothing; `make -f test/e2e/e2e.mk e2e-bench` runs it and prints a
// table. The benchmark is in the package's test files.
package bench
