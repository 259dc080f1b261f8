// Package maglev builds Maglev consistent-hashing lookup tables (Eisenbud
// et al., "Maglev: A Fast and Reliable Software Network Load Balancer",
// NSDI 2016, section 3.4): every backend gets an equal share of the table
// to within one entry, and a change of the backend set moves few entries
// between the backends that stay.
//
// Tables depend only on the backends' names and the table size, so every
// node computes the same table for the same Service: a flow that moves
// between nodes keeps its backend.
package maglev

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// DefaultSize is the default table size, a prime as the algorithm needs.
const DefaultSize = 16381

// Errors of Build.
var (
	ErrSizeNotPrime  = errors.New("maglev: table size must be a prime")
	ErrTooManyNames  = errors.New("maglev: more backends than table entries")
	ErrDuplicateName = errors.New("maglev: duplicate backend name")
)

// CheckSize returns ErrSizeNotPrime (wrapped) unless m can be a table's
// size.
func CheckSize(m int) error {
	if !isPrime(m) {
		return fmt.Errorf("%w: %d", ErrSizeNotPrime, m)
	}
	return nil
}

// Build returns a table of size m in which entry i holds the index, in
// names, of the backend for hash values congruent to i. names identify the
// backends stably across nodes (for example "10.244.1.5:8080/TCP"); their
// order does not change which backend an entry names, only the index used
// for it. An empty names gives an empty table.
func Build(names []string, m int) ([]int, error) {
	if !isPrime(m) {
		return nil, fmt.Errorf("%w: %d", ErrSizeNotPrime, m)
	}
	n := len(names)
	if n == 0 {
		return nil, nil
	}
	if n > m {
		return nil, fmt.Errorf("%w: %d backends, %d entries", ErrTooManyNames, n, m)
	}
	// The backends take turns in name order, not in the caller's order,
	// so that every node fills the table the same way.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(names[a], names[b]) })
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	for k, i := range order {
		if k > 0 && names[order[k-1]] == names[i] {
			return nil, fmt.Errorf("%w: %q", ErrDuplicateName, names[i])
		}
		offset[k] = hash(names[i], 0) % uint64(m)
		skip[k] = hash(names[i], 1)%uint64(m-1) + 1
	}

	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	next := make([]uint64, n) // how far each backend is along its permutation
	filled := 0
	for {
		for i := range n {
			// The backend's next preferred entry that is still free.
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[c] = order[i]
			next[i]++
			filled++
			if filled == m {
				return table, nil
			}
		}
	}
}

// hash is FNV-1a over a seed byte and the name: stable across processes
// and architectures, unlike hash/maphash.
func hash(name string, seed byte) uint64 {
	h := fnv.New64a()
	h.Write([]byte{seed})
	h.Write([]byte(name))
	return h.Sum64()
}

func isPrime(m int) bool {
	if m < 2 {
		return false
	}
	for d := 2; d*d <= m; d++ {
		if m%d == 0 {
			return false
		}
	}
	return true
}
