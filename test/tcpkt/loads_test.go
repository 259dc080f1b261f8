package tcpkt_test

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// Loading the programs is most of what this package costs: the verifier
// walks tc_ingress for about half a second on the host, and for several
// seconds in the kernel matrix's emulated guests, where the package ran
// about seventy loads. A fixture therefore takes programs another test
// loaded with the same options and gave back, every map emptied, and loads
// new ones only when none is free: tests running side by side each hold
// their own. What a test sees is what a fresh load gives it (programs
// hold no state outside their maps); its namespace and writers are its
// own. The loads live until the test binary exits.

// loadKey is what a load depends on: the values the programs are loaded
// with and the sizes of their maps.
type loadKey struct {
	snatMin, snatMax uint16
	affinityEntries  uint32
}

// progLoad is the TC programs of one load, with the XDP program on their
// maps once a test has asked for it.
type progLoad struct {
	key  loadKey
	tc   *bpfobj.TcObjects
	spec *ebpf.CollectionSpec
	xdp  *bpfobj.XdpObjects
}

var freeLoads = struct {
	sync.Mutex
	byKey map[loadKey][]*progLoad
}{byKey: map[loadKey][]*progLoad{}}

// takeLoad returns a free load for key, or nil when there is none.
func takeLoad(key loadKey) *progLoad {
	freeLoads.Lock()
	defer freeLoads.Unlock()
	free := freeLoads.byKey[key]
	if len(free) == 0 {
		return nil
	}
	l := free[len(free)-1]
	freeLoads.byKey[key] = free[:len(free)-1]
	return l
}

// giveBack empties l's maps and makes it free for the next test; a load
// whose maps cannot all be emptied is closed instead, and tb fails.
func (l *progLoad) giveBack(tb testing.TB) {
	if err := l.empty(); err != nil {
		tb.Errorf("empty the maps of a load for the next test: %v", err)
		l.close()
		return
	}
	freeLoads.Lock()
	defer freeLoads.Unlock()
	freeLoads.byKey[l.key] = append(freeLoads.byKey[l.key], l)
}

func (l *progLoad) close() {
	l.tc.Close()
	if l.xdp != nil {
		l.xdp.Close()
	}
}

// empty removes every entry of l's maps and zeroes their arrays, as they
// were when loaded.
func (l *progLoad) empty() error {
	var errs []error
	emptyAll := func(maps any) {
		v := reflect.ValueOf(maps)
		for i := range v.NumField() {
			m, ok := v.Field(i).Interface().(*ebpf.Map)
			if !ok || m == nil {
				continue
			}
			if err := emptyMap(m); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", v.Type().Field(i).Tag.Get("ebpf"), err))
			}
		}
	}
	emptyAll(l.tc.TcMaps)
	if l.xdp != nil {
		// Its maps but the device map are the TC load's, emptied above.
		emptyAll(l.xdp.XdpMaps)
	}
	return errors.Join(errs...)
}

// emptyMap zeroes every element of an array and deletes every entry of any
// other map.
func emptyMap(m *ebpf.Map) error {
	switch m.Type() {
	case ebpf.Array, ebpf.PerCPUArray:
		zero := make([]byte, m.ValueSize())
		var value any = zero
		if m.Type() == ebpf.PerCPUArray {
			n, err := ebpf.PossibleCPU()
			if err != nil {
				return err
			}
			perCPU := make([][]byte, n)
			for i := range perCPU {
				perCPU[i] = zero
			}
			value = perCPU
		}
		for i := range m.MaxEntries() {
			if err := m.Put(i, value); err != nil {
				return fmt.Errorf("zero element %d: %w", i, err)
			}
		}
		return nil
	}
	var keys [][]byte
	var prev any // nil: the first key
	for {
		next := make([]byte, m.KeySize())
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("next key: %w", err)
		}
		keys = append(keys, next)
		prev = next
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}

// loadTC loads the TC programs for key with small private maps.
func loadTC(key loadKey) (*progLoad, error) {
	spec, err := bpfobj.LoadTc()
	if err != nil {
		return nil, err
	}
	for name, m := range spec.Maps {
		if m.MaxEntries > 1024 && m.Type != ebpf.PerCPUArray {
			m.MaxEntries = 1024
		}
		if key.affinityEntries != 0 && (name == bpfobj.TcMapLb4AffinityV1 || name == bpfobj.TcMapLb6AffinityV1) {
			m.MaxEntries = key.affinityEntries
		}
		// Private maps: never adopt or create pins of a running agent.
		m.Pinning = ebpf.PinNone
	}
	if err := spec.Variables[bpfobj.TcVarSnatPortMin].Set(key.snatMin); err != nil {
		return nil, err
	}
	if err := spec.Variables[bpfobj.TcVarSnatPortMax].Set(key.snatMax); err != nil {
		return nil, err
	}
	l := &progLoad{key: key, tc: &bpfobj.TcObjects{}, spec: spec}
	if err := spec.LoadAndAssign(l.tc, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load the TC programs: %+v", ve)
		}
		return nil, fmt.Errorf("load the TC programs: %w", err)
	}
	return l, nil
}
