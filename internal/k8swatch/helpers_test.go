package k8swatch

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// reports collects what an InvalidFunc is told.
type reports struct {
	mu   sync.Mutex
	list []string
}

func (r *reports) fn(kind, namespace, name, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, fmt.Sprintf("%s %s/%s: %s", kind, namespace, name, reason))
}

func (r *reports) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.list
	r.list = nil
	return out
}

// checkReports checks that the reports match the wanted substrings one for
// one, in order.
func checkReports(t *testing.T, got, want []string) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(got[i], want[i])
	}
	if !ok {
		t.Errorf("reports:\n  got  %q\n  want %q", got, want)
	}
}

func spn(ns, name, port string, proto model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// epStrings renders endpoints as "ip:port" plus the conditions that are not
// the plain ready state, for readable comparisons.
func epStrings(eps []model.Endpoint) []string {
	out := []string{}
	for i := range eps {
		ep := &eps[i]
		s := ep.String()
		switch {
		case ep.Ready && !ep.Terminating:
		case ep.Serving && ep.Terminating:
			s += " serving-terminating"
		case ep.Terminating:
			s += " terminating"
		default:
			s += " not-ready"
		}
		if ep.NodeName != "" {
			s += " @" + ep.NodeName
		}
		out = append(out, s)
	}
	return out
}

// describe renders a State as one sorted line per ServicePort: frontend,
// every endpoint, and the ClusterIP verdict.
func describe(st *model.State) []string {
	out := []string{}
	for name, svc := range st.Services {
		act, eps := svc.Internal()
		out = append(out, fmt.Sprintf("%s %s:%d eps=%v internal=%s%v",
			name, svc.Port.ClusterIP, svc.Port.Port, epStrings(svc.Endpoints), act, epStrings(eps)))
	}
	slices.Sort(out)
	return out
}

func checkLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  got:\n    %s\n  want:\n    %s", what, strings.Join(got, "\n    "), strings.Join(want, "\n    "))
	}
}

// cacheTombstone wraps obj as an informer does when it missed the delete.
func cacheTombstone(key string, obj any) cache.DeletedFinalStateUnknown {
	return cache.DeletedFinalStateUnknown{Key: key, Obj: obj}
}
