// Package maps owns the BPF maps of the socket, TC and XDP programs: their
// Go types (generated from the C in bpf/lib/structs.h), the encoding of
// addresses into them, and the only code that writes them.
//
// The Writer keeps what it applied in memory, restored from the pinned maps
// once at start-up, and diffs every sync against it so that a sync writes
// only what changed, in an order that never lets a lookup see a half-written
// Service.
package maps

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// Generated map key and value types, named for what they are.
type (
	// ServiceKey mirrors struct lb4_key.
	ServiceKey = bpfobj.SockLb4Key
	// ServiceValue mirrors struct lb4_service.
	ServiceValue = bpfobj.SockLb4Service
	// BackendValue mirrors struct lb4_backend.
	BackendValue = bpfobj.SockLb4Backend
	// RevNatValue mirrors struct lb4_reverse_nat.
	RevNatValue = bpfobj.SockLb4ReverseNat
	// MemberKey mirrors struct lb4_member_key.
	MemberKey = bpfobj.SockLb4MemberKey
	// SourceRangeKey mirrors struct lb4_src_range_key.
	SourceRangeKey = bpfobj.SockLb4SrcRangeKey
)

// Flags of ServiceValue, mirroring the SVC_F_* enum.
const (
	FlagReject       uint16 = 1 << 0
	FlagDrop         uint16 = 1 << 1
	FlagTwoScopes    uint16 = 1 << 2
	FlagClusterIP    uint16 = 1 << 3
	FlagNodePort     uint16 = 1 << 4
	FlagExternalIP   uint16 = 1 << 5
	FlagLoadBalancer uint16 = 1 << 6
	FlagSourceRanges uint16 = 1 << 7
	// FlagExternalLocal marks the external entries of a Service with
	// externalTrafficPolicy=Local (SVC_F_EXT_LOCAL).
	FlagExternalLocal uint16 = 1 << 8
	// FlagLocalhostNodePort marks a NodePort on 127.0.0.1, for the node's
	// own sockets only (SVC_F_LOCALHOST).
	FlagLocalhostNodePort uint16 = 1 << 9
	// FlagMaglev marks the external entries of a ServicePort with a
	// Maglev table (SVC_F_MAGLEV): only theirs do TC and XDP look up,
	// by the flow's hash.
	FlagMaglev uint16 = 1 << 10
)

// Flags of BackendValue.
const (
	// BackendFlagTerminating mirrors BE_F_TERMINATING.
	BackendFlagTerminating uint8 = 1 << 0
	// BackendFlagLocal mirrors BE_F_LOCAL: the endpoint is on this node.
	BackendFlagLocal uint8 = 1 << 1
)

// Scopes of a ServiceKey, mirroring enum lb_scope.
const (
	ScopeExternal uint8 = 0
	ScopeInternal uint8 = 1
)

// Map is the part of a BPF hash map the Writer needs. It is small so that
// tests can substitute a fake or a fault-injecting implementation.
type Map[K comparable, V any] interface {
	Put(k K, v V) error
	Delete(k K) error
	// PutBatch stores the pairs in order and returns how many it stored
	// before an error.
	PutBatch(ks []K, vs []V) (int, error)
	// DeleteBatch deletes the keys in order, ignoring missing ones, and
	// returns how many it processed before an error.
	DeleteBatch(ks []K) (int, error)
	// Iterate calls fn for every entry until fn returns false.
	Iterate(fn func(K, V) bool) error
}

// Maps are the maps the Writer programs.
type Maps struct {
	Services Map[ServiceKey, ServiceValue]
	Backends Map[uint32, BackendValue]
	RevNat   Map[uint32, RevNatValue]
	// Members holds (backend, ServicePort) while the backend may be
	// chosen for the ServicePort.
	Members Map[MemberKey, uint8]
	// Maglev holds the Maglev tables of the ServicePorts that use Maglev
	// for external traffic; nil when the dataplane has none.
	Maglev MaglevTables
	// SourceRanges holds the loadBalancerSourceRanges of ServicePorts
	// whose LoadBalancer IPs have them (an LPM trie); nil leaves them
	// unwritten, for tests of the other maps.
	SourceRanges Map[SourceRangeKey, uint8]
	// PortFilter holds a bit per port that an external frontend uses or
	// used (lb4_ext_ports_v1, PortFilterWords words): the TC and XDP
	// programs pass packets to other ports early. nil leaves it
	// unwritten, for tests of the other maps; the TC and XDP programs
	// then translate nothing.
	PortFilter Map[uint32, uint32]
	// RemovedAt holds, by family (RemovedAtIPv4, RemovedAtIPv6), the
	// second of CLOCK_MONOTONIC_COARSE in which the Writer last deleted a
	// backend or a membership (lb_removed_at_v1): the TC and XDP
	// programs check tracked flows in full in that second. nil leaves it
	// unwritten; tracked flows then see a removal up to a second late.
	RemovedAt Map[uint32, uint32]
}

// Keys of the removal stamps' map (LB_REMOVED_AT_*).
const (
	RemovedAtIPv4 uint32 = 0
	RemovedAtIPv6 uint32 = 1
)

// ErrMapFull is returned (wrapped) when a map has no room for a new entry.
var ErrMapFull = errors.New("map is full")

// fullError says that m has no room left: its name and capacity, which
// its --bpf-map-*-max flag sets, wrapping ErrMapFull.
func fullError(m *ebpf.Map) error {
	return fmt.Errorf("%s holds its %d entries: %w", mapName(m), m.MaxEntries(), ErrMapFull)
}

// noMemoryError says that the kernel could not allocate an entry of m, a
// map that is not preallocated: the memory cgroup the map is charged to
// (the agent's container's) is at its limit. It wraps ErrMapFull: the
// entry does not fit, and the Writer answers it as it does a full map.
func noMemoryError(m *ebpf.Map, err error) error {
	return fmt.Errorf("%s has no memory for a new entry (%w): the maps are charged to the agent's container, which is at its memory limit; raise the limit: %w",
		mapName(m), err, ErrMapFull)
}

// mapName is m's name as loaded: "Hash(lb4_services_v1)#15" is
// lb4_services_v1, which the kernel's copy would truncate to 15 bytes.
func mapName(m *ebpf.Map) string {
	name := m.String()
	if _, rest, ok := strings.Cut(name, "("); ok {
		name, _, _ = strings.Cut(rest, ")")
	}
	return name
}

// kernelMap adapts an *ebpf.Map.
type kernelMap[K comparable, V any] struct{ m *ebpf.Map }

// FromKernel wraps a loaded BPF hash map.
func FromKernel[K comparable, V any](m *ebpf.Map) Map[K, V] { return kernelMap[K, V]{m} }

func (k kernelMap[K, V]) Put(key K, v V) error {
	if err := k.m.Update(&key, &v, ebpf.UpdateAny); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) || isE2BIG(err) {
			return fullError(k.m)
		}
		if errors.Is(err, unix.ENOMEM) {
			return noMemoryError(k.m, err)
		}
		return fmt.Errorf("update %s: %w", k.m, err)
	}
	return nil
}

func (k kernelMap[K, V]) PutBatch(ks []K, vs []V) (int, error) {
	n, err := k.m.BatchUpdate(ks, vs, nil)
	if err != nil {
		if isE2BIG(err) || errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fullError(k.m)
		}
		if errors.Is(err, unix.ENOMEM) {
			return n, noMemoryError(k.m, err)
		}
		return n, fmt.Errorf("batch update %s: %w", k.m, err)
	}
	return n, nil
}

// DeleteBatch deletes one by one: a batch delete stops at the first missing
// key, and a delete is not on the path that must be fast.
func (k kernelMap[K, V]) DeleteBatch(ks []K) (int, error) {
	for i := range ks {
		if err := k.Delete(ks[i]); err != nil {
			return i, err
		}
	}
	return len(ks), nil
}

func (k kernelMap[K, V]) Delete(key K) error {
	if err := k.m.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", k.m, err)
	}
	return nil
}

func (k kernelMap[K, V]) Iterate(fn func(K, V) bool) error {
	var (
		key K
		val V
	)
	it := k.m.Iterate()
	for it.Next(&key, &val) {
		if !fn(key, val) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", k.m, err)
	}
	return nil
}

// KernelMaps wraps the loaded maps of the socket programs.
// A nil source ranges map (a dump of maps an older agent pinned) is left
// out.
func KernelMaps(m *bpfobj.SockMaps) Maps {
	km := Maps{
		Services: FromKernel[ServiceKey, ServiceValue](m.Lb4ServicesV1),
		Backends: FromKernel[uint32, BackendValue](m.Lb4BackendsV1),
		RevNat:   FromKernel[uint32, RevNatValue](m.Lb4RevnatV1),

		Members: FromKernel[MemberKey, uint8](m.Lb4MembersV1),
	}
	if m.Lb4SourceRangesV1 != nil {
		km.SourceRanges = FromKernel[SourceRangeKey, uint8](m.Lb4SourceRangesV1)
	}
	if m.Lb4ExtPortsV1 != nil {
		km.PortFilter = FromKernel[uint32, uint32](m.Lb4ExtPortsV1)
	}
	if m.LbRemovedAtV1 != nil {
		km.RemovedAt = FromKernel[uint32, uint32](m.LbRemovedAtV1)
	}
	return km
}
