package healthcheck

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

func TestListenFailureRaisesKubeProxysEvent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset()
	record := ListenFailureEvents(ctx, client, "ebpf-proxy")
	record(model.ServiceName{Namespace: "shop", Name: "web"}, 32000, `node node-a failed to start healthcheck "shop/web" on port 32000: address already in use`)

	// The broadcaster writes asynchronously; wait for it, boundedly.
	for range 200 {
		evs, err := client.EventsV1().Events("shop").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) > 0 {
			e := evs.Items[0]
			if e.Type != corev1.EventTypeWarning || e.Reason != "FailedToStartServiceHealthcheck" || e.Action != "Listen" ||
				e.Regarding.Kind != "Service" || e.Regarding.Name != "web" || e.Regarding.Namespace != "shop" ||
				e.Note != `node node-a failed to start healthcheck "shop/web" on port 32000: address already in use` ||
				e.ReportingController != "ebpf-proxy" {
				t.Errorf("event = %+v", e)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no event recorded")
}
