package cluster_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// proxyLabel says which proxies a node runs in a node-by-node migration
// (deploy/node-by-node): absent, kube-proxy; "both"; then "ebpf-proxy".
const proxyLabel = "ebpf-proxy.io/proxy"

// migrateNodeByNode migrates from kube-proxy as docs/INSTALL.md's node by
// node section says: kube-proxy's DaemonSet is told to leave the nodes
// labelled ebpf-proxy.io/proxy=ebpf-proxy, the agents' DaemonSet (with
// the node-by-node component) runs on those labelled both or ebpf-proxy;
// node by node, the agent starts beside kube-proxy and serves, then
// kube-proxy leaves, and its rules go. Last, kube-proxy's DaemonSet is
// deleted. The guide's last step, deploy/ applied without the component
// (the agents restart one node at a time), is the test's upgrade, which
// applies deploy/ with the next image.
func (e *env) migrateNodeByNode(deployDir, image string) {
	e.t.Helper()
	e.kubectl("", "-n", "kube-system", "patch", "daemonset", "kube-proxy",
		"--patch-file", filepath.Join(deployDir, "node-by-node", "kube-proxy-patch.yaml"))
	e.rollout("daemonset/kube-proxy", "kube-system")
	e.kubeProxyLog = e.saveKubeProxyLog()
	e.applyArgs("", "-k", e.overlay(deployDir, "node-by-node", image))
	for _, cn := range e.nodes {
		e.kubectl("", "label", "node", cn.Name, proxyLabel+"=both", "--overwrite")
		e.waitAgentReady(cn.Name)
		e.kubectl("", "label", "node", cn.Name, proxyLabel+"=ebpf-proxy", "--overwrite")
		e.waitGone("k8s-app=kube-proxy", cn.Name)
		if cn.Name == e.n.Name {
			e.check("kube-proxy's rules are removed once it has left this node", e.waitNoKubeProxyRules)
		}
		e.t.Logf("cluster: %s migrated", cn.Name)
	}
	e.agentChecks()
	e.kubectl("", "-n", "kube-system", "delete", "daemonset", "kube-proxy", "--wait=true")
}

// agentChecks are the checks of the agents that started beside
// kube-proxy: the first agent made the maps, whose memory is charged to
// its container, at its peak now; and the agents' probes kept reaching
// them while kube-proxy held the health check port.
func (e *env) agentChecks() {
	e.check("the agent's memory stays within its DaemonSet limit, with room", e.memoryWithinLimit("first"))
	e.check("no agent was restarted: its probes reach it while kube-proxy runs", e.notRestarted)
}

// waitAgentReady waits for the agent's pod on a node to be Ready.
func (e *env) waitAgentReady(nodeName string) {
	e.t.Helper()
	err := eventually(rolloutBound, func() error {
		pods, err := e.n.Clientset().CoreV1().Pods("kube-system").List(e.ctx, metav1.ListOptions{
			LabelSelector: "k8s-app=ebpf-proxy", FieldSelector: "spec.nodeName=" + nodeName})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					return nil
				}
			}
		}
		return fmt.Errorf("no Ready agent pod on %s (%d pods)", nodeName, len(pods.Items))
	})
	if err != nil {
		e.fatalf("%v", err)
	}
}

// nodePortsAcross checks, from outside the cluster, that each node's
// NodePort of another node's servers (web-<node>, externalTrafficPolicy
// Cluster) reaches those servers, which see the address of the node the
// client went through: kube-proxy masquerades such traffic, so that the
// reply comes back through the node that translated it.
func (e *env) nodePortsAcross() error {
	for _, through := range e.nodes {
		for _, to := range e.nodes {
			if to.Name == through.Name {
				continue
			}
			addr := netip.AddrPortFrom(through.IP, uint16(to.NodePort))
			res, err := e.probeFrom(outsideName, "tcp", 10, addr)
			if err != nil {
				return err
			}
			if f := failedAttempts(res); f != "" {
				return fmt.Errorf("%s (%s's servers through %s): %s", addr, to.Name, through.Name, f)
			}
			for _, r := range res {
				peer, err := netip.ParseAddrPort(r.Peer)
				switch {
				case !strings.HasPrefix(r.Server, "web-"+to.Name+"-"):
					return fmt.Errorf("%s answered by %q, want a server of web-%s", addr, r.Server, to.Name)
				case err != nil || peer.Addr() != through.IP:
					return fmt.Errorf("%s: %s saw the client as %q, want %s's address %s", addr, r.Server, r.Peer, through.Name, through.IP)
				}
			}
		}
	}
	return nil
}

// localTrafficPolicy checks web-local, node1's servers with
// externalTrafficPolicy Local, from outside: through node1 they answer and
// see the client's own address; through another node, which has none of
// them, the connection is dropped (no answer, not a refusal), and that
// node's health check node port says 503 where node1's says 200, so that
// a load balancer sends nothing there.
func (e *env) localTrafficPolicy() error {
	first := e.nodes[0]
	addr := netip.AddrPortFrom(first.IP, uint16(localNodePort))
	res, err := e.probeFrom(outsideName, "tcp", 10, addr)
	if err != nil {
		return err
	}
	if f := failedAttempts(res); f != "" {
		return fmt.Errorf("%s: %s", addr, f)
	}
	outsideIP := e.n.APIServer.Addr() // the control plane's address, where the client runs
	for _, r := range res {
		if peer, err := netip.ParseAddrPort(r.Peer); err != nil || peer.Addr() != outsideIP || !strings.HasPrefix(r.Server, "web-"+first.Name+"-") {
			return fmt.Errorf("%s: %s saw the client as %q, want a server of web-%s that sees %s", addr, r.Server, r.Peer, first.Name, outsideIP)
		}
	}
	if code, err := healthCheck(e.ctx, first.IP); err != nil || code != http.StatusOK {
		return fmt.Errorf("%s's health check node port: %d %v, want 200", first.Name, code, err)
	}
	for _, other := range e.nodes[1:] {
		addr := netip.AddrPortFrom(other.IP, uint16(localNodePort))
		res, err := e.probeFrom(outsideName, "tcp", 2, addr)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Error == "" || r.Error == "refused" {
				return fmt.Errorf("%s, through %s without endpoints: %s, want no answer", addr, other.Name, r)
			}
		}
		if code, err := healthCheck(e.ctx, other.IP); err != nil || code != http.StatusServiceUnavailable {
			return fmt.Errorf("%s's health check node port: %d %v, want 503", other.Name, code, err)
		}
	}
	return nil
}

// healthCheck asks a node's health check node port of web-local for
// /healthz, as a load balancer does, and returns the status code.
func healthCheck(ctx context.Context, node netip.Addr) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := "http://" + net.JoinHostPort(node.String(), strconv.Itoa(localHealthPort)) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
