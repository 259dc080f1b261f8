package maps

import (
	"fmt"
	"maps"
	"slices"
)

// FakeMap is an in-memory Map for unit tests of pure logic. It enforces a
// capacity like a BPF hash map and can be told to fail.
type FakeMap[K comparable, V any] struct {
	Entries map[K]V
	// Max is the capacity; 0 means unlimited.
	Max int
	// Fail, when set, is called before every change; a non-nil error is
	// returned instead of making the change.
	Fail func(op string, k K) error
	// OnChange, when set, is called after every successful change, so that
	// a test can check what a concurrent reader would see at that moment.
	OnChange func()
	// Writes counts successful Put and Delete calls.
	Writes int
}

// NewFakeMap returns an empty fake with the given capacity.
func NewFakeMap[K comparable, V any](max int) *FakeMap[K, V] {
	return &FakeMap[K, V]{Entries: map[K]V{}, Max: max}
}

// Put implements Map.
func (f *FakeMap[K, V]) Put(k K, v V) error {
	if f.Fail != nil {
		if err := f.Fail("put", k); err != nil {
			return err
		}
	}
	if _, ok := f.Entries[k]; !ok && f.Max > 0 && len(f.Entries) >= f.Max {
		return fmt.Errorf("fake: %w", ErrMapFull)
	}
	f.Entries[k] = v
	f.Writes++
	if f.OnChange != nil {
		f.OnChange()
	}
	return nil
}

// Delete implements Map.
func (f *FakeMap[K, V]) Delete(k K) error {
	if f.Fail != nil {
		if err := f.Fail("delete", k); err != nil {
			return err
		}
	}
	delete(f.Entries, k)
	f.Writes++
	if f.OnChange != nil {
		f.OnChange()
	}
	return nil
}

// PutBatch implements Map, one element at a time as the kernel does, so
// OnChange sees every intermediate state.
func (f *FakeMap[K, V]) PutBatch(ks []K, vs []V) (int, error) {
	for i := range ks {
		if err := f.Put(ks[i], vs[i]); err != nil {
			return i, err
		}
	}
	return len(ks), nil
}

// DeleteBatch implements Map.
func (f *FakeMap[K, V]) DeleteBatch(ks []K) (int, error) {
	for i := range ks {
		if err := f.Delete(ks[i]); err != nil {
			return i, err
		}
	}
	return len(ks), nil
}

// Iterate implements Map, in no particular order, like the kernel.
func (f *FakeMap[K, V]) Iterate(fn func(K, V) bool) error {
	for _, k := range slices.Collect(maps.Keys(f.Entries)) {
		if !fn(k, f.Entries[k]) {
			return nil
		}
	}
	return nil
}

// Fakes are in-memory stand-ins for every map the Writer programs.
type Fakes struct {
	Services *FakeMap[ServiceKey, ServiceValue]
	Backends *FakeMap[uint32, BackendValue]
	RevNat   *FakeMap[uint32, RevNatValue]
	Members  *FakeMap[MemberKey, uint8]
	Maglev   *FakeMaglev
	// Ranges stands for the LPM trie of source ranges, as a plain map of
	// its keys.
	Ranges *FakeMap[SourceRangeKey, uint8]
	// Ports stands for the port filter array, holding the words written.
	Ports *FakeMap[uint32, uint32]
	// RemovedAt stands for the removal stamps' array.
	RemovedAt *FakeMap[uint32, uint32]
}

// NewFakes returns empty fakes; a zero capacity is unlimited.
func NewFakes(services, backends, revnat int) *Fakes {
	return &Fakes{
		Services: NewFakeMap[ServiceKey, ServiceValue](services),
		Backends: NewFakeMap[uint32, BackendValue](backends),
		RevNat:   NewFakeMap[uint32, RevNatValue](revnat),
		Members:  NewFakeMap[MemberKey, uint8](0),
		Maglev:   NewFakeMaglev(FakeMaglevSize),
		Ranges:   NewFakeMap[SourceRangeKey, uint8](0),
		Ports:    NewFakeMap[uint32, uint32](PortFilterWords),

		RemovedAt: NewFakeMap[uint32, uint32](2),
	}
}

// Maps returns the fakes as the Writer's Maps.
func (f *Fakes) Maps() Maps {
	return Maps{Services: f.Services, Backends: f.Backends, RevNat: f.RevNat, Members: f.Members, Maglev: f.Maglev, SourceRanges: f.Ranges, PortFilter: f.Ports,
		RemovedAt: f.RemovedAt}
}

// FakeMaglevSize is the table size of the fakes: a small prime keeps
// tests fast.
const FakeMaglevSize = 251

// FakeMaglev is an in-memory MaglevTables.
type FakeMaglev struct {
	M             int
	Tables        map[uint32][]uint32
	Fingerprint   map[uint32]uint64
	Sets, Deletes int
	// Err, when set, is returned by the next Set.
	Err error
	// OnChange, when set, is called after every change.
	OnChange func()
}

// NewFakeMaglev returns empty fake tables of size m.
func NewFakeMaglev(m int) *FakeMaglev {
	return &FakeMaglev{M: m, Tables: map[uint32][]uint32{}, Fingerprint: map[uint32]uint64{}}
}

// Size implements MaglevTables.
func (f *FakeMaglev) Size() int { return f.M }

// Set implements MaglevTables.
func (f *FakeMaglev) Set(id uint32, table []uint32, fp uint64) error {
	if err := f.Err; err != nil {
		f.Err = nil
		return err
	}
	if len(table) != f.M {
		return fmt.Errorf("table of %d entries, want %d", len(table), f.M)
	}
	f.Sets++
	f.Tables[id] = slices.Clone(table)
	f.Fingerprint[id] = fp
	if f.OnChange != nil {
		f.OnChange()
	}
	return nil
}

// Delete implements MaglevTables.
func (f *FakeMaglev) Delete(id uint32) error {
	f.Deletes++
	delete(f.Tables, id)
	delete(f.Fingerprint, id)
	if f.OnChange != nil {
		f.OnChange()
	}
	return nil
}

// Fingerprints implements MaglevTables.
func (f *FakeMaglev) Fingerprints() (map[uint32]uint64, error) { return maps.Clone(f.Fingerprint), nil }
