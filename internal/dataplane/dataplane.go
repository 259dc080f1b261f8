// Package dataplane defines what every proxy mode implements: the BPF
// dataplane (internal/dataplane/bpf) and the fallbacks
// (internal/fallback/...). The sync loop (internal/proxier) drives one of
// them; internal/proxymode chooses which. It imports nothing but the
// model, so that dataplanes and their tests can all use it.
package dataplane

import "github.com/ebpf-proxy/ebpf-proxy/internal/model"

// Dataplane programs the node from the desired State, writing only what
// changed since the last sync. The sync loop calls it from one goroutine.
type Dataplane interface {
	// Name is the proxy mode it implements ("ebpf", "nftables", "iptables",
	// "ipvs").
	Name() string
	// Sync applies up. After an error the dataplane may be partly updated;
	// the next Sync it gets is a full one.
	Sync(up model.Update) error
}

// The proxy modes (--proxy-mode), each the Name of its dataplane. They
// live here, in the one package every dataplane imports, and auto, which
// chooses among them, is config.ProxyModeAuto.
const (
	EBPF     = "ebpf"
	NFTables = "nftables"
	IPTables = "iptables"
	IPVS     = "ipvs"
)
