package maps

import "fmt"

// idAllocator hands out free non-zero ids up to max: released ones first,
// then ids never used, in order. Ids are stable for the life of what they
// name and restored from the pinned maps on start-up, so a restarted agent
// never renumbers. Each allocation costs O(1) amortized, however many ids
// are in use: a sync that replaces one endpoint among 100,000 does not
// search through them.
type idAllocator struct {
	used map[uint32]struct{}
	// free are released ids, reused first, most recent first; an id in it
	// may have been reserved again since (restore), and is then skipped.
	free []uint32
	// next is where the search for a never-released free id resumes: it
	// only moves forward (wrapping at max), so that allocating while most
	// ids below it are in use does not pass over them again each time.
	next uint32
	max  uint32
}

func newIDAllocator(max uint32) *idAllocator {
	return &idAllocator{used: map[uint32]struct{}{}, next: 1, max: max}
}

func (a *idAllocator) reserve(id uint32) { a.used[id] = struct{}{} }

// presize makes room for n ids when none is in use yet.
func (a *idAllocator) presize(n int) {
	if len(a.used) == 0 {
		a.used = make(map[uint32]struct{}, n)
	}
}

func (a *idAllocator) release(id uint32) {
	if _, ok := a.used[id]; !ok {
		return
	}
	delete(a.used, id)
	a.free = append(a.free, id)
}

func (a *idAllocator) alloc() (uint32, error) {
	if uint32(len(a.used)) >= a.max {
		return 0, fmt.Errorf("all %d ids in use: %w", a.max, ErrMapFull)
	}
	for len(a.free) > 0 {
		id := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		if _, ok := a.used[id]; !ok {
			a.used[id] = struct{}{}
			return id, nil
		}
	}
	for id := a.next; ; id++ {
		if id == 0 || id > a.max {
			id = 1
		}
		if _, ok := a.used[id]; !ok {
			a.used[id] = struct{}{}
			a.next = id + 1
			return id, nil
		}
	}
}
