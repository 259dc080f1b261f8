package testbed_test

import (
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// TestProcessUsage reads this process's usage, and sees a BPF map it makes
// counted once however many descriptors it has.
func TestProcessUsage(t *testing.T) {
	sandbox.RequireRoot(t)
	before, err := testbed.ProcessUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if before.RSS == 0 || before.PeakRSS < before.RSS || before.FDs < 3 || before.Threads < 1 {
		t.Fatalf("usage %+v: want a resident set, a peak at least as large, stdin/out/err and a thread", before)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "usage_probe", Type: ebpf.Hash, KeySize: 8, ValueSize: 64, MaxEntries: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	clone, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	defer clone.Close()
	after, err := testbed.ProcessUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.Maps != before.Maps+1 {
		t.Errorf("%d maps after making one, want %d", after.Maps, before.Maps+1)
	}
	if got, least := after.MapBytes-before.MapBytes, uint64(4096*(8+64)); got < least {
		t.Errorf("a map of 4096 entries of 72 bytes adds %d bytes, want at least %d", got, least)
	}
	if after.FDs < before.FDs+2 {
		t.Errorf("%d descriptors after opening two, had %d", after.FDs, before.FDs)
	}
	// A leak is told by what leaks: the map's two descriptors by its name.
	if got, want := testbed.FDGrowth(before, after), "anon_inode:bpf-map usage_probe +2"; !slices.Contains(got, want) {
		t.Errorf("growth %q, want it to hold %q", got, want)
	}
}
