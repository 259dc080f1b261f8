package maps

import "fmt"

// batchSize bounds one batch syscall.
const batchSize = 4096

// queue holds the writes one sync makes to one map, in the order the
// Writer made them. Flushing sends them as batches.
type queue[K comparable, V any] struct {
	m       Map[K, V]
	putK    []K
	putV    []V
	delK    []K
	batched bool
}

func newQueue[K comparable, V any](m Map[K, V]) *queue[K, V] {
	return &queue[K, V]{m: m, batched: true}
}

func (q *queue[K, V]) put(k K, v V) error {
	if !q.batched {
		return q.m.Put(k, v)
	}
	q.putK = append(q.putK, k)
	q.putV = append(q.putV, v)
	return nil
}

func (q *queue[K, V]) del(k K) error {
	if !q.batched {
		return q.m.Delete(k)
	}
	q.delK = append(q.delK, k)
	return nil
}

func (q *queue[K, V]) flushPuts() error {
	defer func() { q.putK, q.putV = q.putK[:0], q.putV[:0] }()
	for i := 0; i < len(q.putK); i += batchSize {
		end := min(i+batchSize, len(q.putK))
		if n, err := q.m.PutBatch(q.putK[i:end], q.putV[i:end]); err != nil {
			return fmt.Errorf("after %d of %d updates: %w", i+n, len(q.putK), err)
		}
	}
	return nil
}

func (q *queue[K, V]) flushDeletes() error {
	defer func() { q.delK = q.delK[:0] }()
	for i := 0; i < len(q.delK); i += batchSize {
		end := min(i+batchSize, len(q.delK))
		if n, err := q.m.DeleteBatch(q.delK[i:end]); err != nil {
			return fmt.Errorf("after %d of %d deletions: %w", i+n, len(q.delK), err)
		}
	}
	return nil
}

func (q *queue[K, V]) reset() { q.putK, q.putV, q.delK = q.putK[:0], q.putV[:0], q.delK[:0] }

// queues are the Writer's queues for one sync.
type queues struct {
	services *queue[ServiceKey, ServiceValue]
	backends *queue[uint32, BackendValue]
	revNat   *queue[uint32, RevNatValue]
	match    *queue[MemberKey, uint8]
	maglev   *maglevQueue
}

func newQueues(m Maps) queues {
	return queues{newQueue(m.Services), newQueue(m.Backends), newQueue(m.RevNat), newQueue(m.Members),
		&maglevQueue{m: m.Maglev, applied: map[uint32]uint64{}}}
}

func (q queues) setBatched(b bool) {
	q.services.batched, q.backends.batched, q.revNat.batched, q.match.batched = b, b, b, b
}

func (q queues) reset() {
	q.services.reset()
	q.backends.reset()
	q.revNat.reset()
	q.match.reset()
	q.maglev.reset()
}

// flush sends a sync's writes in the one order that keeps every lookup
// consistent: what entries will point at first (backends, reverse NAT,
// memberships, Maglev tables, which name backends), then the service entries in the order they were made
// (a frontend's slots before its master entry), then deletions of service
// entries (a removed frontend's master entry before its slots) and of Maglev
// tables, and last
// the deletion of what no service entry points at any more.
func (q queues) flush() error {
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"backends", q.backends.flushPuts},
		{"reverse NAT", q.revNat.flushPuts},
		{"members", q.match.flushPuts},
		{"maglev tables", q.maglev.flushSets},
		{"services", q.services.flushPuts},
		{"services", q.services.flushDeletes},
		{"maglev tables", q.maglev.flushDeletes},
		{"members", q.match.flushDeletes},
		{"backends", q.backends.flushDeletes},
		{"reverse NAT", q.revNat.flushDeletes},
	} {
		if err := step.do(); err != nil {
			q.reset()
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
	return nil
}
