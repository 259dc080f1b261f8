package healthcheck

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/client-go/rest"

	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// eventSink is an API server that keeps the events posted to it.
type eventSink struct {
	t      *testing.T
	mu     sync.Mutex
	paths  []string
	events []eventsv1.Event
}

func (s *eventSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var e eventsv1.Event
	if r.Method != http.MethodPost || json.Unmarshal(body, &e) != nil {
		s.t.Errorf("%s %s: %q, want an Event posted", r.Method, r.URL.Path, body)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.paths = append(s.paths, r.URL.Path)
	s.events = append(s.events, e)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

func (s *eventSink) posted() ([]string, []eventsv1.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.paths...), append([]eventsv1.Event(nil), s.events...)
}

// waitPosted waits, boundedly, for n events.
func (s *eventSink) waitPosted(t *testing.T, n int) ([]string, []eventsv1.Event) {
	t.Helper()
	for range 200 {
		if p, e := s.posted(); len(e) >= n {
			return p, e
		}
		time.Sleep(25 * time.Millisecond)
	}
	_, e := s.posted()
	t.Fatalf("%d events posted, want %d", len(e), n)
	return nil, nil
}

func TestListenFailureRaisesKubeProxysEvent(t *testing.T) {
	sink := &eventSink{t: t}
	srv := httptest.NewServer(sink)
	defer srv.Close()
	// JSON, so that the sink can read it; the agent's client speaks
	// protobuf as the API server prefers.
	c, err := kubeapi.NewClient(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	record := ListenFailureEvents(t.Context(), c.Events, "ebpf-proxy", zap.NewNop())
	web := model.ServiceName{Namespace: "shop", Name: "web"}
	const msg = `node node-a failed to start healthcheck "shop/web" on port 32000: address already in use`
	// Every sync retries the listen: the repeats are one event.
	for range 5 {
		record(web, 32000, msg)
	}
	record(model.ServiceName{Namespace: "shop", Name: "api"}, 32001, "another")

	paths, evs := sink.waitPosted(t, 2)
	time.Sleep(100 * time.Millisecond) // room for a wrongly posted repeat
	if _, all := sink.posted(); len(all) != 2 {
		t.Errorf("%d events posted, want 2 (repeats within %v fold)", len(all), eventRepeatWindow)
	}
	if paths[0] != "/apis/events.k8s.io/v1/namespaces/shop/events" {
		t.Errorf("posted to %s", paths[0])
	}
	e := evs[0]
	if e.Type != corev1.EventTypeWarning || e.Reason != "FailedToStartServiceHealthcheck" || e.Action != "Listen" ||
		e.Regarding.Kind != "Service" || e.Regarding.Name != "web" || e.Regarding.Namespace != "shop" ||
		e.Note != msg || e.ReportingController != "ebpf-proxy" || e.ReportingInstance == "" ||
		e.EventTime.IsZero() || e.Namespace != "shop" || e.Name == "" {
		t.Errorf("event = %+v", e)
	}
	if evs[1].Regarding.Name != "api" || evs[1].Note != "another" {
		t.Errorf("second event = %+v", evs[1])
	}
}
