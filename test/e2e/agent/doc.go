// Package agent tests ebpf-proxy against a real API server as an operator
// runs it: how fast it programs a new Service and what it reports about
// that (kubeproxy_network_programming_duration_seconds), how it copes with
// an API server that is not up yet or restarts, and that the RBAC rules
// deploy/rbac.yaml ships are all it needs. The tests are in the package's
// test files.
package agent
