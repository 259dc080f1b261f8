// Package chaos runs the agent through faults while clients keep using its
// Services, and counts every connection that fails: the agent SIGKILLed at
// random moments, the API server gone for a while with Services and
// endpoints changed meanwhile, endpoints replaced in a rolling fashion
// every second, maps filled past their capacity, its bpffs pins removed
// behind its back, and Services made, moved and deleted for minutes while
// its memory, descriptors and goroutines must stay bounded.
//
// Each scenario runs on its own testbed (one node, real API server) with a
// TCP and a UDP client loop running from a pod of the node to a ClusterIP
// Service, and prints one line with its counts:
//
//	chaos: scenario=kill attempts=N failed=F tcp=N/F udp=N/F ...
//
// `make e2e` (and so `make test`) runs the short version; `make chaos` the
// long one (EBPF_PROXY_CHAOS=long).
package chaos
