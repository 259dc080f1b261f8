package maglev

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func names(r *rand.Rand, n int) []string {
	out := make([]string, 0, n)
	seen := map[string]bool{}
	for len(out) < n {
		s := fmt.Sprintf("10.%d.%d.%d:%d/TCP", r.IntN(256), r.IntN(256), r.IntN(256), 1+r.IntN(65535))
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// TestBalance: over random backend sets from 2 to 100 backends, every
// backend's share of a 16381-entry table is within 1% of fair.
func TestBalance(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 2; n <= 100; n++ {
		ns := names(r, n)
		table, err := Build(ns, DefaultSize)
		if err != nil {
			t.Fatal(err)
		}
		count := make([]int, n)
		for _, b := range table {
			count[b]++
		}
		fair := float64(DefaultSize) / float64(n)
		for i, c := range count {
			if dev := (float64(c) - fair) / fair; dev > 0.01 || dev < -0.01 {
				t.Errorf("n=%d: backend %d has %d entries, fair is %.1f (%.2f%% off)", n, i, c, fair, 100*dev)
			}
		}
	}
}

// TestRemovalDisruption: removing one backend reassigns at most 2% of the
// entries that did not belong to it.
func TestRemovalDisruption(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{2, 3, 5, 10, 20, 50, 100} {
		for trial := range 5 {
			ns := names(r, n)
			before, err := Build(ns, DefaultSize)
			if err != nil {
				t.Fatal(err)
			}
			gone := r.IntN(n)
			rest := append(append([]string{}, ns[:gone]...), ns[gone+1:]...)
			after, err := Build(rest, DefaultSize)
			if err != nil {
				t.Fatal(err)
			}
			moved, kept := 0, 0
			for i := range before {
				if before[i] == gone {
					continue
				}
				kept++
				if rest[after[i]] != ns[before[i]] {
					moved++
				}
			}
			if frac := float64(moved) / float64(kept); frac > 0.02 {
				t.Errorf("n=%d trial %d: removing one backend moved %.2f%% of the others' entries, want at most 2%%", n, trial, 100*frac)
			} else if trial == 0 {
				t.Logf("n=%d: %.2f%% of the others' entries moved", n, 100*frac)
			}
		}
	}
}

// TestIndependentOfOrder: the same backends in another order give the
// same backend for every entry, which is what lets nodes agree.
func TestIndependentOfOrder(t *testing.T) {
	ns := []string{"10.0.0.1:80/TCP", "10.0.0.2:80/TCP", "10.0.0.3:80/TCP", "10.0.0.4:80/TCP"}
	rev := []string{ns[3], ns[2], ns[1], ns[0]}
	a, _ := Build(ns, 251)
	b, _ := Build(rev, 251)
	for i := range a {
		if ns[a[i]] != rev[b[i]] {
			t.Fatalf("entry %d: %s vs %s", i, ns[a[i]], rev[b[i]])
		}
	}
}

func TestBuildRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names []string
		m     int
		want  error
	}{
		{"size not prime", []string{"a"}, 16384, ErrSizeNotPrime},
		{"more backends than entries", []string{"a", "b", "c", "d"}, 3, ErrTooManyNames},
		{"duplicate backend", []string{"a", "a"}, 7, ErrDuplicateName},
	} {
		if _, err := Build(tc.names, tc.m); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if tbl, err := Build(nil, 7); err != nil || tbl != nil {
		t.Errorf("no backends: %v %v, want an empty table", tbl, err)
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			ns := names(rand.New(rand.NewPCG(5, 6)), n)
			for range b.N {
				if _, err := Build(ns, DefaultSize); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
