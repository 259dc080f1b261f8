package maps_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// TestLayoutsMatchTheObject checks every Go mirror of a map struct against
// the BTF of the compiled object: same size, and each field at the same
// offset with the same size. The C is the source of truth.
func TestLayoutsMatchTheObject(t *testing.T) {
	spec, err := bpfobj.LoadSock()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cName string
		goVal any
	}{
		{"lb4_key", maps.ServiceKey{}},
		{"lb4_service", maps.ServiceValue{}},
		{"lb4_backend", maps.BackendValue{}},
		{"lb4_reverse_nat", maps.RevNatValue{}},
		{"sock4_revnat_key", bpfobj.SockSock4RevnatKey{}},
		{"sock4_revnat", bpfobj.SockSock4Revnat{}},
		{"lb6_key", maps.Service6Key{}},
		{"lb6_backend", maps.Backend6Value{}},
		{"lb6_reverse_nat", maps.RevNat6Value{}},
		{"lb6_src_range_key", maps.SourceRange6Key{}},
		{"lb6_affinity_key", bpfobj.SockLb6AffinityKey{}},
		{"sock6_revnat_key", bpfobj.SockSock6RevnatKey{}},
		{"sock6_revnat", bpfobj.SockSock6Revnat{}},
		{"sock6_udp_key", bpfobj.SockSock6UdpKey{}},
	} {
		t.Run(tc.cName, func(t *testing.T) {
			var st *btf.Struct
			if err := spec.Types.TypeByName(tc.cName, &st); err != nil {
				t.Fatal(err)
			}
			gt := reflect.TypeOf(tc.goVal)
			if uintptr(st.Size) != gt.Size() {
				t.Fatalf("struct %s is %d bytes in C, %d in Go", tc.cName, st.Size, gt.Size())
			}
			var goFields []reflect.StructField
			for i := range gt.NumField() {
				if f := gt.Field(i); f.Name != "_" {
					goFields = append(goFields, f)
				}
			}
			if len(goFields) != len(st.Members) {
				t.Fatalf("struct %s has %d members in C, %d in Go", tc.cName, len(st.Members), len(goFields))
			}
			for i, m := range st.Members {
				f := goFields[i]
				size, err := btf.Sizeof(m.Type)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.EqualFold(strings.ReplaceAll(m.Name, "_", ""), f.Name) {
					t.Errorf("member %d: %s in C, %s in Go", i, m.Name, f.Name)
				}
				if uintptr(m.Offset.Bytes()) != f.Offset || uintptr(size) != f.Type.Size() {
					t.Errorf("%s.%s: C offset %d size %d, Go offset %d size %d", tc.cName, m.Name, m.Offset.Bytes(), size, f.Offset, f.Type.Size())
				}
			}
		})
	}
}
