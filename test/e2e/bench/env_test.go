package bench

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The benchmarks' settings come from the environment, so that a slower
// machine can measure less. Each reader leaves *dst alone when the
// variable is unset and refuses a value outside its bounds.

// envInt reads name as a whole number in [lo, hi].
func envInt(name string, dst *int, lo, hi int) error {
	s := os.Getenv(name)
	if s == "" {
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return fmt.Errorf("%s=%q: want a number in [%d, %d]", name, s, lo, hi)
	}
	*dst = n
	return nil
}

// envDuration reads name as a duration in (0, hi].
func envDuration(name string, dst *time.Duration, hi time.Duration) error {
	s := os.Getenv(name)
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > hi {
		return fmt.Errorf("%s=%q: want a duration in (0, %s]", name, s, hi)
	}
	*dst = d
	return nil
}

// envRows reads name as a comma-separated list of rows of known, defaults
// when unset.
func envRows(name string, defaults []string, known []rpsRow) ([]rpsRow, error) {
	names := defaults
	if s := os.Getenv(name); s != "" {
		names = nil
		for n := range strings.SplitSeq(s, ",") {
			names = append(names, strings.TrimSpace(n))
		}
	}
	var rows []rpsRow
	for _, n := range names {
		i := slices.IndexFunc(known, func(r rpsRow) bool { return r.name == n })
		if i < 0 {
			var all []string
			for _, r := range known {
				all = append(all, r.name)
			}
			return nil, fmt.Errorf("%s: unknown proxy %q (known: %s)", name, n, strings.Join(all, ", "))
		}
		rows = append(rows, known[i])
	}
	return rows, nil
}
