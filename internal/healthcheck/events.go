package healthcheck

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Event posting bounds.
const (
	// eventRepeatWindow is how long a repeat of an event already posted is
	// not posted again: every sync retries a failed listen, and the
	// events.k8s.io broadcaster folds the repeats of 6 minutes into one
	// event as well.
	eventRepeatWindow = 6 * time.Minute
	// eventQueue is how many events wait for the API server before new
	// ones are dropped.
	eventQueue = 100
	// eventAttempts and eventRetry bound the posting of one event.
	eventAttempts = 3
	eventRetry    = 5 * time.Second
)

// ListenFailureEvents returns a recorder that raises kube-proxy's Warning
// event FailedToStartServiceHealthcheck on a Service whose health check
// node port cannot be bound, so that `kubectl describe service` shows it;
// component is the reporting controller and client an events.k8s.io/v1
// REST client. Events are posted in the background, in order, until ctx is
// done; a repeat within eventRepeatWindow of the same event is not posted
// again, and a post the API server refuses is retried twice, then logged
// to log.
func ListenFailureEvents(ctx context.Context, client rest.Interface, component string, log *zap.Logger) ListenFailureRecorder {
	host, _ := os.Hostname()
	p := &eventPoster{client: client, log: log, controller: component, instance: component + "-" + host,
		queue: make(chan *eventsv1.Event, eventQueue), posted: map[string]time.Time{}}
	go p.run(ctx)
	return func(svc model.ServiceName, _ uint16, msg string) {
		// The reference is kube-proxy's: it has no Service object at hand,
		// only the name, so the UID is the name too.
		ref := corev1.ObjectReference{Kind: "Service", Namespace: svc.Namespace, Name: svc.Name, UID: types.UID(svc.String())}
		p.record(ref, corev1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen", msg)
	}
}

// eventPoster posts events.k8s.io/v1 Events.
type eventPoster struct {
	client               rest.Interface
	log                  *zap.Logger
	controller, instance string
	queue                chan *eventsv1.Event

	mu     sync.Mutex
	posted map[string]time.Time // by repeatKey: when last queued
}

// repeatKey is what makes two events repeats of one another.
func repeatKey(e *eventsv1.Event) string {
	r := e.Regarding
	return fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%s", r.Kind, r.Namespace, r.Name, e.Type, e.Reason, e.Action, e.Note)
}

func (p *eventPoster) record(ref corev1.ObjectReference, typ, reason, action, note string) {
	now := time.Now()
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	e := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: p.controller,
		ReportingInstance:   p.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           ref,
		Note:                note,
		Type:                typ,
	}
	key := repeatKey(e)
	p.mu.Lock()
	if t, ok := p.posted[key]; ok && now.Sub(t) < eventRepeatWindow {
		p.mu.Unlock()
		return
	}
	for k, t := range p.posted {
		if now.Sub(t) >= eventRepeatWindow {
			delete(p.posted, k)
		}
	}
	p.posted[key] = now
	p.mu.Unlock()
	select {
	case p.queue <- e:
	default: // the API server is behind: dropped, as a broadcaster does
	}
}

func (p *eventPoster) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-p.queue:
			p.post(ctx, e)
		}
	}
}

func (p *eventPoster) post(ctx context.Context, e *eventsv1.Event) {
	var err error
	for i := range eventAttempts {
		if i > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(eventRetry):
			}
		}
		if err = p.client.Post().Namespace(e.Namespace).Resource("events").Body(e).Do(ctx).Error(); err == nil {
			return
		}
	}
	p.log.Warn("cannot post an event", zap.String("reason", e.Reason), zap.String("namespace", e.Namespace),
		zap.String("regarding", e.Regarding.Name), zap.Error(err))
}
