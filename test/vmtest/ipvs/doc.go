// Package ipvs holds the IPVS smoke test of the kernel matrix: inside the VM
// the ip_vs module loads and a virtual server passes real TCP traffic between
// network namespaces to real servers. It gives the IPVS fallback a place to
// run, since the CI host's kernel has no IPVS.
package ipvs
