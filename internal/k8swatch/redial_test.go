package k8swatch

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestRedial(t *testing.T) {
	const interval = 20 * time.Millisecond
	client := &http.Client{Transport: Redial(&http.Transport{}, interval)}

	t.Run("a GET waits for the server to listen", func(t *testing.T) {
		addr := freeAddr(t)
		up := 300 * time.Millisecond
		go func() {
			time.Sleep(up)
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })}
			t.Cleanup(func() { srv.Close() })
			go func() { _ = srv.Serve(l) }()
		}()
		start := time.Now()
		resp, err := client.Get("http://" + addr + "/")
		if err != nil {
			t.Fatalf("GET while the server was away: %v", err)
		}
		resp.Body.Close()
		if took := time.Since(start); took < up || took > up+10*interval+time.Second {
			t.Errorf("answered after %s; want soon after the server's %s", took, up)
		}
	})
	t.Run("a POST fails at once", func(t *testing.T) {
		start := time.Now()
		if _, err := client.Post("http://"+freeAddr(t)+"/", "text/plain", nil); err == nil {
			t.Fatal("POST to nothing succeeded")
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("POST took %s to fail", took)
		}
	})
	t.Run("the request's context ends the wait", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+freeAddr(t)+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Do(req); err == nil {
			t.Fatal("GET to nothing succeeded")
		}
		if ctx.Err() == nil {
			t.Error("the GET gave up before its context ended")
		}
	})
}
