// Package smoke checks that the vmtest guest gives tests what they rely on:
// root, bpffs and cgroup2 at their usual places, the running kernel's modules
// and config, the dataplanes' modules loaded, a working loopback, a writable
// root, and go test's working directory. A runner change that breaks one of
// these fails here, on every kernel, before it confuses another package.
package smoke
