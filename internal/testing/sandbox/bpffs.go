package sandbox

import "sync"

// BPFFS is a private bpffs instance. Every mount of bpffs is a separate
// instance, so pins made here are invisible outside and vanish with Close.
type BPFFS struct {
	m *privateMount

	closeOnce sync.Once
	closeErr  error
}

// NewBPFFS mounts a new bpffs on a temporary directory. The caller must
// Close it.
func NewBPFFS() (*BPFFS, error) {
	id, err := newID()
	if err != nil {
		return nil, err
	}
	return newBPFFS(id)
}

func newBPFFS(id string) (*BPFFS, error) {
	m, err := newPrivateMount(id+"-bpffs-", "bpf")
	if err != nil {
		return nil, err
	}
	return &BPFFS{m: m}, nil
}

// Path returns the mount point, the directory to pin under.
func (b *BPFFS) Path() string { return b.m.dir }

// Close unmounts the bpffs, which drops every pin in it, and removes the
// mount point. Close is idempotent.
func (b *BPFFS) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.m.close() })
	return b.closeErr
}
