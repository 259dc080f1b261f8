package maps

import (
	"errors"
	"testing"
)

// TestIDAllocator: ids are unique and non-zero, released ones are reused,
// ids reserved (restored from the maps) are never handed out, and the
// allocator says ErrMapFull when all max are in use.
func TestIDAllocator(t *testing.T) {
	const max = 1000
	a := newIDAllocator(max)
	for _, id := range []uint32{3, 500, 999} {
		a.reserve(id)
	}
	inUse := map[uint32]bool{3: true, 500: true, 999: true}
	take := func() uint32 {
		t.Helper()
		id, err := a.alloc()
		if err != nil {
			t.Fatal(err)
		}
		if id == 0 || id > max || inUse[id] {
			t.Fatalf("alloc gave %d (in use: %v)", id, inUse[id])
		}
		inUse[id] = true
		return id
	}
	for range 600 {
		take()
	}
	// Released ids come back first, the latest first.
	for _, id := range []uint32{10, 20} {
		a.release(id)
		delete(inUse, id)
	}
	if got := take(); got != 20 {
		t.Errorf("after releasing 10 and 20: got %d, want 20", got)
	}
	if got := take(); got != 10 {
		t.Errorf("then: got %d, want 10", got)
	}
	// A released id reserved again (a restore) is not handed out.
	a.release(30)
	a.reserve(30)
	if got := take(); got == 30 {
		t.Error("a reserved id was handed out")
	}
	// Releasing an id not in use changes nothing.
	a.release(0)
	a.release(4242)
	for len(inUse) < max {
		take()
	}
	if _, err := a.alloc(); !errors.Is(err, ErrMapFull) {
		t.Fatalf("all %d in use: got %v, want ErrMapFull", max, err)
	}
	a.release(777)
	delete(inUse, 777)
	if got := take(); got != 777 {
		t.Errorf("the one id freed: got %d, want 777", got)
	}
}

// TestIDAllocatorIdsAboveMax: an id above max restored from larger maps
// counts as in use until released, is never handed out, and does not grow
// the bitmap however large it is.
func TestIDAllocatorIdsAboveMax(t *testing.T) {
	a := newIDAllocator(2)
	a.reserve(1 << 31)
	if _, err := a.alloc(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.alloc(); !errors.Is(err, ErrMapFull) {
		t.Fatalf("ids 1 and 1<<31 in use, max 2: got %v, want ErrMapFull", err)
	}
	if len(a.used) > 1 {
		t.Errorf("the bitmap grew to %d words for an id above max", len(a.used))
	}
	a.release(1 << 31)
	id, err := a.alloc()
	if err != nil || id != 2 {
		t.Fatalf("after releasing it: got %d, %v, want 2", id, err)
	}
}

// BenchmarkIDAllocatorChurn replaces one id among 100,000 in use, as a sync
// that moves one endpoint does: the cost must not grow with the ids in use.
func BenchmarkIDAllocatorChurn(b *testing.B) {
	a := newIDAllocator(1 << 20)
	for range 100_000 {
		if _, err := a.alloc(); err != nil {
			b.Fatal(err)
		}
	}
	old := uint32(17)
	for b.Loop() {
		id, err := a.alloc()
		if err != nil {
			b.Fatal(err)
		}
		a.release(old)
		old = id
	}
}
