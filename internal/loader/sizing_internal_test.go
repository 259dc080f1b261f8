package loader

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// The automatic sizes take the LRU maps' key and value sizes from the
// generated types: they are the objects' own.
func TestLRUMapsOfTheSizesAreTheObjects(t *testing.T) {
	sock, err := bpfobj.LoadSock()
	if err != nil {
		t.Fatal(err)
	}
	tc, err := bpfobj.LoadTc()
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, fam := range lruMapsOfFamily {
		for _, m := range fam {
			listed[m.name] = true
			ms, ok := sock.Maps[m.name]
			if !ok {
				ms = tc.Maps[m.name]
			}
			if ms == nil || ms.Type != ebpf.LRUHash {
				t.Fatalf("%s: %v, not an LRU map of the objects", m.name, ms)
			}
			if int(ms.KeySize) != m.key || int(ms.ValueSize) != m.value {
				t.Errorf("%s: key %d B, value %d B in the object, %d and %d in the sizes", m.name, ms.KeySize, ms.ValueSize, m.key, m.value)
			}
		}
	}
	for _, spec := range []*ebpf.CollectionSpec{sock, tc} {
		for name, ms := range spec.Maps {
			if ms.Type == ebpf.LRUHash && !listed[name] {
				t.Errorf("LRU map %s is left out of the automatic sizes", name)
			}
		}
	}
}
