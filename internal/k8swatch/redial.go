package k8swatch

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"time"
)

// RedialInterval is how often a waiting request of the informers tries
// again to connect to the API server (see Redial); each wait adds up to a
// fifth more at random, so that the nodes of a cluster do not knock in
// step. A refused connection costs the API server's host no more than a
// reset. The chaos suite measured the changes made during a minute's
// outage served 0.2 s after the API server's return at this interval (1
// to 1.5 s at 400 ms, on a busy two-core machine).
const RedialInterval = 200 * time.Millisecond

// Redial wraps rt, the informers' transport, so that a GET whose
// connection cannot be made (the API server is down or unreachable:
// nothing was sent) waits and connects again every interval until it
// connects or its context ends, instead of failing.
//
// A failed request makes a reflector back off, exponentially up to 30 s,
// which client-go does not let a SharedInformerFactory change: after an
// outage of a minute, the changes made meanwhile would reach the node up
// to half a minute after the API server's return. A request that waits is
// sent as soon as the API server listens again. Errors after the
// connection was made (a refusal, a 5xx of an API server still starting)
// are returned as before, and the reflectors' backoff applies to them.
func Redial(rt http.RoundTripper, interval time.Duration) http.RoundTripper {
	return &redialer{next: rt, interval: interval}
}

type redialer struct {
	next     http.RoundTripper
	interval time.Duration
}

// RoundTrip implements http.RoundTripper.
func (r *redialer) RoundTrip(req *http.Request) (*http.Response, error) {
	for {
		resp, err := r.next.RoundTrip(req)
		if err == nil || req.Method != http.MethodGet || !isDialError(err) {
			return resp, err
		}
		wait := r.interval + rand.N(r.interval/5+1)
		t := time.NewTimer(wait)
		select {
		case <-req.Context().Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// isDialError reports whether err is a failure to connect, before any
// byte of the request was sent.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
