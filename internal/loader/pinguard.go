package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// PinGuard holds a handle on every map and link pinned under an agent's
// bpffs directory (maps/ and links/) and pins again those whose pins were
// removed behind the agent's back (an operator's `rm`, a cleanup script, a
// bpffs remounted): the programs keep running while the agent holds its
// handles, but an agent that starts without the pins creates empty maps
// and attaches a second set of programs, and once the last handle goes
// the unpinned programs detach.
//
// The agent pins and unpins objects itself (TC links as devices come and
// go, the source range check); Refresh, called after it did, makes those
// the ones to guard. Not safe for concurrent use.
type PinGuard struct {
	bpffs string
	held  map[string]*heldPin
}

// heldPin is a handle on a pinned object and the pin's inode, which tells
// a pin of another object at the same path.
type heldPin struct {
	ino uint64
	m   *ebpf.Map
	l   link.Link
}

func (h *heldPin) close() {
	if h.m != nil {
		h.m.Close()
	}
	if h.l != nil {
		h.l.Close()
	}
}

// NewPinGuard returns a guard of the pins under bpffs holding nothing yet;
// call Refresh.
func NewPinGuard(bpffs string) *PinGuard {
	return &PinGuard{bpffs: bpffs, held: map[string]*heldPin{}}
}

// Refresh makes the guarded pins those that exist now: it takes a handle
// on every pin it does not hold yet and lets go of those whose pins are
// gone, unless their directory went too (the agent removes pins, never
// its directories: that was done behind its back, and Repair restores
// them). Call it after the agent pinned or unpinned objects itself; a
// single pin removed behind its back between the last Repair and Refresh
// (during a sync) is taken for one the agent removed and not restored,
// and a pin the agent made and that was removed before the next Refresh
// is not known to it.
func (g *PinGuard) Refresh() error {
	seen := map[string]bool{}
	var errs []error
	for _, dir := range []string{mapsDir(g.bpffs), linksDir(g.bpffs)} {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", dir, err))
			continue
		}
		for _, e := range entries {
			if !e.Type().IsRegular() {
				continue
			}
			path := filepath.Join(dir, e.Name())
			ino, err := inode(path)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			seen[path] = true
			if h := g.held[path]; h != nil && h.ino == ino {
				continue
			}
			h, err := open(path, dir == linksDir(g.bpffs))
			if err != nil {
				errs = append(errs, err)
				delete(seen, path)
				continue
			}
			h.ino = ino
			if old := g.held[path]; old != nil {
				old.close()
			}
			g.held[path] = h
		}
	}
	for path, h := range g.held {
		if seen[path] {
			continue
		}
		if _, err := os.Stat(filepath.Dir(path)); errors.Is(err, os.ErrNotExist) {
			// Its whole directory went, which the agent never
			// does: removed behind its back, during the sync that
			// refreshes, for Repair to restore.
			continue
		}
		h.close()
		delete(g.held, path)
	}
	return errors.Join(errs...)
}

func open(path string, isLink bool) (*heldPin, error) {
	if isLink {
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned link %s: %w", path, err)
		}
		return &heldPin{l: l}, nil
	}
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", path, err)
	}
	return &heldPin{m: m}, nil
}

func inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, os.ErrNotExist
		}
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// Repair pins again, at its path, every guarded object whose pin is gone
// (the directories are made again if they went too), and returns the
// paths it restored, sorted. A path that now holds another object is left
// alone and let go of.
func (g *PinGuard) Repair() ([]string, error) {
	var restored []string
	var errs []error
	for path, h := range g.held {
		ino, err := inode(path)
		switch {
		case err == nil && ino == h.ino:
			continue
		case err == nil:
			// Someone pinned another object there: theirs.
			h.close()
			delete(g.held, path)
			continue
		case !errors.Is(err, os.ErrNotExist):
			errs = append(errs, err)
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			errs = append(errs, fmt.Errorf("recreate %s: %w", filepath.Dir(path), err))
			continue
		}
		if err := h.pin(path); err != nil {
			errs = append(errs, fmt.Errorf("pin %s again: %w", path, err))
			continue
		}
		if h.ino, err = inode(path); err != nil {
			errs = append(errs, err)
		}
		restored = append(restored, path)
	}
	slices.Sort(restored)
	return restored, errors.Join(errs...)
}

// pin pins the held object at path, where nothing is pinned.
func (h *heldPin) pin(path string) error {
	if h.m != nil {
		// A clone has no pin path of its own, so Pin pins it rather
		// than renaming the pin it believes it has.
		c, err := h.m.Clone()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Pin(path)
	}
	// Unpin only forgets the gone pin (removing a missing file is no
	// error), so that Pin pins anew.
	if err := h.l.Unpin(); err != nil {
		return err
	}
	return h.l.Pin(path)
}

// Held returns how many pins the guard holds.
func (g *PinGuard) Held() int { return len(g.held) }

// Close lets go of every handle; the pins stay.
func (g *PinGuard) Close() {
	for path, h := range g.held {
		h.close()
		delete(g.held, path)
	}
}
