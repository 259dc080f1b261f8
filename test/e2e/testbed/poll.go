package testbed

import (
	"context"
	"fmt"
	"time"
)

// PollInterval is how often Poll asks again.
const PollInterval = 50 * time.Millisecond

// Poll calls cond every PollInterval until it reports true, ctx ends or
// bound has passed; the error then names what was awaited and cond's last
// error.
func Poll(ctx context.Context, what string, bound time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(bound)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(PollInterval):
		}
	}
	return fmt.Errorf("%s: not within %s (last error: %v)", what, bound, last)
}
