package k8swatch

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// Target is one IP family the proxy serves and the tracker of that
// family's sync loop. A dual-stack node has two, as kube-proxy has one
// proxier per family: each gets the Services' addresses of its family and
// the EndpointSlices of its address type.
type Target struct {
	// Family is IPv4 or IPv6; empty means IPv4.
	Family  v1.IPFamily
	Tracker *tracker.Tracker
}

// lane is one Target with its translator (whose Invalid is nil: reports go
// through translate, once for every family).
type lane struct {
	tr *tracker.Tracker
	tl Translator
}

// newLanes checks targets and makes their lanes from the translator base.
func newLanes(targets []Target, base Translator) ([]lane, error) {
	if len(targets) == 0 {
		return nil, errors.New("k8swatch: no IP family to serve")
	}
	base.Invalid = nil
	seen := map[v1.IPFamily]bool{}
	lanes := make([]lane, 0, len(targets))
	for _, t := range targets {
		tl := base
		tl.Family = t.Family
		f := tl.family()
		switch {
		case f != v1.IPv4Protocol && f != v1.IPv6Protocol:
			return nil, fmt.Errorf("k8swatch: unknown IP family %q", t.Family)
		case seen[f]:
			return nil, fmt.Errorf("k8swatch: IP family %s given twice", f)
		case t.Tracker == nil:
			return nil, fmt.Errorf("k8swatch: no tracker for IP family %s", f)
		}
		seen[f] = true
		lanes = append(lanes, lane{tr: t.Tracker, tl: tl})
	}
	return lanes, nil
}

// translate runs f with the translator of every lane and passes what they
// found to invalid (nil: nowhere) once: a problem every family meets (a
// port without a number) is one report, not one per family, and one only
// a family meets (an endpoint address of another family in a slice of
// its type) is reported as that family said it.
func translate[T any](lanes []lane, invalid InvalidFunc, f func(tl *Translator) T) []T {
	out := make([]T, len(lanes))
	var found []problem
	seen := map[problem]bool{}
	for i := range lanes {
		tl := lanes[i].tl
		if invalid != nil {
			tl.Invalid = func(kind, namespace, name, reason string) {
				p := problem{kind, namespace, name, reason}
				if !seen[p] {
					seen[p] = true
					found = append(found, p)
				}
			}
		}
		out[i] = f(&tl)
	}
	for _, p := range found {
		invalid(p.kind, p.namespace, p.name, p.reason)
	}
	return out
}
