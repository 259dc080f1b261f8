package model

import "slices"

// Selection is the outcome of kube-proxy's CategorizeEndpoints for one
// ServicePort on one node: which endpoints each kind of traffic may use.
type Selection struct {
	// Cluster are the endpoints for traffic policy Cluster: ready endpoints
	// filtered by topology hints, else serving-and-terminating ones anywhere.
	// Empty when the ServicePort never uses cluster endpoints.
	Cluster []Endpoint
	// Local are the endpoints on this node for traffic policy Local: ready
	// ones, else serving-and-terminating ones. Topology is not applied.
	// Empty when the ServicePort never uses local endpoints.
	Local []Endpoint
	// HasAny is true when some endpoint anywhere is ready or serving and
	// terminating; without one every frontend rejects.
	HasAny bool
	// LocalReady counts this node's ready endpoints, which is what the
	// health check node port reports.
	LocalReady int
}

// Options are the feature switches that change endpoint selection.
type Options struct {
	// PreferSameNode honours node hints (the PreferSameTrafficDistribution
	// feature gate, on by default upstream since 1.34).
	PreferSameNode bool
}

// DefaultOptions are upstream's defaults.
var DefaultOptions = Options{PreferSameNode: true}

// Categorize selects the endpoints of sp for node, exactly as kube-proxy's
// CategorizeEndpoints does. eps must be sorted and free of duplicates (the
// change tracker guarantees both). The result may share eps's memory:
// endpoint lists are never changed once built (appending to one is safe, it
// copies), which keeps one list, not three, for a ServicePort whose
// endpoints are all ready.
func Categorize(sp *ServicePort, eps []Endpoint, node *Node, opts Options) Selection {
	var sel Selection
	isLocal := func(ep *Endpoint) bool { return node.Name != "" && ep.NodeName == node.Name }
	for i := range eps {
		if eps[i].Ready && isLocal(&eps[i]) {
			sel.LocalReady++
		}
	}

	if sp.UsesClusterEndpoints() {
		mode := topologyMode(eps, node, opts)
		sel.Cluster = filter(eps, func(ep *Endpoint) bool {
			return ep.Ready && availableForTopology(ep, mode, node)
		})
		// A topology mode is only chosen when it leaves a ready endpoint, so
		// an empty set here means there is no ready endpoint anywhere.
		if len(sel.Cluster) == 0 {
			sel.Cluster = filter(eps, func(ep *Endpoint) bool { return ep.Serving && ep.Terminating })
		}
		sel.HasAny = len(sel.Cluster) > 0
	}

	if !sp.UsesLocalEndpoints() {
		return sel
	}
	var localReady, localServingTerminating bool
	for i := range eps {
		ep := &eps[i]
		switch {
		case ep.Ready:
			sel.HasAny = true
			localReady = localReady || isLocal(ep)
		case ep.Serving && ep.Terminating:
			sel.HasAny = true
			localServingTerminating = localServingTerminating || isLocal(ep)
		}
	}
	switch {
	case localReady:
		sel.Local = filter(eps, func(ep *Endpoint) bool { return isLocal(ep) && ep.Ready })
	case localServingTerminating:
		sel.Local = filter(eps, func(ep *Endpoint) bool { return isLocal(ep) && ep.Serving && ep.Terminating })
	}
	return sel
}

type topology uint8

const (
	topologyAll topology = iota
	topologySameZone
	topologySameNode
)

// topologyMode follows the hints only when every ready endpoint carries one
// and at least one is meant for this node (or its zone); a single endpoint
// without hints makes kube-proxy ignore hints altogether.
func topologyMode(eps []Endpoint, node *Node, opts Options) topology {
	allZone, allNode := true, true
	forZone, forNode := false, false
	for i := range eps {
		ep := &eps[i]
		if !ep.Ready {
			continue
		}
		if len(ep.ZoneHints()) == 0 {
			allZone = false
		} else if node.Zone != "" && slices.Contains(ep.ZoneHints(), node.Zone) {
			forZone = true
		}
		if len(ep.NodeHints()) == 0 {
			allNode = false
		} else if slices.Contains(ep.NodeHints(), node.Name) {
			forNode = true
		}
	}
	switch {
	case opts.PreferSameNode && allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyAll
}

func availableForTopology(ep *Endpoint, mode topology, node *Node) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(ep.NodeHints(), node.Name)
	case topologySameZone:
		return slices.Contains(ep.ZoneHints(), node.Zone)
	}
	return true
}

// filter returns the endpoints keep accepts. When it accepts every one, it
// returns eps itself, capped so that an append cannot write into it:
// endpoint lists are never changed once built, and a ServicePort whose
// endpoints are all ready (most of them) then holds one list, not three.
func filter(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	n := 0
	for i := range eps {
		if keep(&eps[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps[:n:n]
	}
	out := make([]Endpoint, 0, n)
	for i := range eps {
		if keep(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}
