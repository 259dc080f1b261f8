// Package sandbox builds throwaway network sandboxes on the local machine for
// privileged tests and for the demo.
//
// A Sandbox holds:
//   - named network namespaces wired as Kubernetes-like nodes, pods and
//     clients (see the address plan in the project's architecture notes);
//   - a private cgroup v2 mount with one child cgroup, the only cgroup that
//     BPF programs may be attached to;
//   - a private bpffs mount for pins;
//   - small servers running in-process inside pod namespaces;
//   - client probes that run as subprocesses born inside the child cgroup and
//     a client namespace, so that cgroup BPF hooks act on their sockets.
//
// No namespace of a sandbox has a route off the machine: the router namespace
// that joins the nodes and external clients has no uplink, so even a
// translation bug cannot send a packet anywhere but into the sandbox.
//
// Programs that run client probes re-execute themselves; they must call Main
// before doing anything else, from TestMain in tests or at the top of main.
// Everything is removed again by Close, also after a failure half way.
package sandbox
