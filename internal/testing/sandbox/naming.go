package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
)

// idPrefix starts the name of everything a sandbox creates on the machine,
// so that a leftover can be traced back to this package.
const idPrefix = "ebpt-"

// newID returns a fresh "ebpt-<6 hex>" identifier. Concurrent test binaries
// share the machine, so names must not depend on the test or the process.
func newID() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random sandbox id: %w", err)
	}
	return idPrefix + hex.EncodeToString(b[:]), nil
}

var hostNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// checkHostName keeps host names usable inside netns names, file names and
// server replies (which are split on spaces).
func checkHostName(name string) error {
	if !hostNameRE.MatchString(name) {
		return fmt.Errorf("invalid host name %q: want 1-32 characters of [a-z0-9-], not starting or ending with '-'", name)
	}
	return nil
}
