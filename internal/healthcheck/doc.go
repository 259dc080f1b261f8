// Package healthcheck serves kube-proxy's health endpoints.
//
// proxier_health.go holds the proxier health server (kube-proxy's
// healthzBindAddress, default 0.0.0.0:10256) with /healthz and /livez, which
// report whether the sync loops keep up with the changes they are given and
// whether this node should receive load-balancer traffic. service_health.go
// holds the per-Service health check node port servers (healthCheckNodePort
// of type=LoadBalancer, externalTrafficPolicy=Local Services), which the
// sync loop updates after every applied sync, whatever the dataplane.
//
// The package is deliberately free of Kubernetes API types: callers translate
// the Node object into a NodeStatus, so the package can be tested, and reused
// by the manifests-dir source, without client-go.
package healthcheck
