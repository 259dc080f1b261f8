package maps

import "fmt"

// idAllocator hands out the lowest free non-zero id up to max. Ids are
// stable for the life of what they name and restored from the pinned maps
// on start-up, so a restarted agent never renumbers.
type idAllocator struct {
	used map[uint32]struct{}
	next uint32
	max  uint32
}

func newIDAllocator(max uint32) *idAllocator {
	return &idAllocator{used: map[uint32]struct{}{}, next: 1, max: max}
}

func (a *idAllocator) reserve(id uint32) { a.used[id] = struct{}{} }

func (a *idAllocator) release(id uint32) {
	delete(a.used, id)
	if id < a.next {
		a.next = id
	}
}

func (a *idAllocator) alloc() (uint32, error) {
	if uint32(len(a.used)) >= a.max {
		return 0, fmt.Errorf("all %d ids in use: %w", a.max, ErrMapFull)
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
