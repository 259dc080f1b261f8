// Package sandbox builds throwaway network sandboxes on the local machine for
// privileged tests and for the demo.
//
// A Sandbox holds:
//   - named network namespaces wired as Kubernetes-like nodes, pods and
//     clients (see the address plan in the project's architecture notes),
//     dual-stack: every host has an IPv4 address (Host.IP) and an IPv6 one
//     (Host.IP6), with routes and forwarding for both families;
//   - a private cgroup v2 mount with one child cgroup, the only cgroup that
//     BPF programs may be attached to;
//   - a private bpffs mount for pins;
//   - small servers running in-process inside pod namespaces;
//   - client probes that run as subprocesses born inside the child cgroup and
//     a client namespace, so that cgroup BPF hooks act on their sockets.
//
// A host's IPv6 address follows from its IPv4 one by IPv6Of, which writes
// the IPv4 host part's decimal digits into the IPv6 twin of its network:
// pod 10.244.1.10 is fd00:10:244:1::10, node 192.168.77.11 is
// fd00:192:168:77::11, external client 198.18.0.10 is fd00:198:18::10,
// LoadBalancer IP 198.19.0.10 is fd00:198:19::10 and ClusterIP 10.96.0.10
// is fd00:10:96::10. Tests written
// with IPv4 literals name the IPv6 peer with it. The servers listen on both
// families on one socket and report the client address they saw, an IPv4
// client by its plain IPv4 address; the probes pick the socket family from
// the destination address.
//
// No namespace of a sandbox has a route off the machine: the router namespace
// that joins the nodes and external clients has no uplink, so even a
// translation bug cannot send a packet anywhere but into the sandbox.
//
// Programs that run client probes re-execute themselves; they must call Main
// before doing anything else, from TestMain in tests or at the top of main.
// Everything is removed again by Close, also after a failure half way.
package sandbox
