// Package e2e holds the end-to-end tests: a real etcd and kube-apiserver
// (package cluster), Services and EndpointSlices written through the API, and
// the proxies under test in network namespaces.
//
// The control-plane binaries are built once into a cache with
// `make k8s-binaries`; see build-binaries.sh.
package e2e
