package maps

import (
	"errors"

	"golang.org/x/sys/unix"
)

// isE2BIG reports whether err is the kernel's "map is full" answer to an
// insert.
func isE2BIG(err error) bool { return errors.Is(err, unix.E2BIG) }
