// Package netns runs code and child processes inside a network namespace,
// for the agent (the fallback dataplanes programming a namespace named by a
// path, the socket terminator opening sock_diag sockets in every pod's
// namespace) and for the tests and their sandboxes alike.
//
// A namespace belongs to an OS thread, not to a goroutine, so everything here
// runs on a locked thread of its own and never on the caller's. A thread that
// cannot be switched back is discarded rather than returned to the runtime's
// pool, so that no other goroutine ever runs in the wrong namespace.
//
// A namespace is named by its path (/run/netns/<name>, /proc/<pid>/ns/net;
// "" for the caller's own) or by an open handle.
package netns
