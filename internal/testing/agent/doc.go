// Package agent runs the ebpf-proxy binary under test, and the programs a
// test starts beside it (upstream kube-proxy as the reference, the control
// plane's binaries), as child processes: inside a test's network namespace,
// with their output kept for the test, a parent-death signal so that none
// outlives a killed test binary, and the agent's HTTP servers reached from
// inside that namespace.
//
// It is test infrastructure: production packages never import it.
package agent
