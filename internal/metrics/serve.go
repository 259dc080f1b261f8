package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"go.uber.org/zap"
)

// Serve runs an HTTP server (the metrics or the health server) until ctx
// ends, then returns nil. A failure to bind is retried every 5 seconds
// unless hardFail is set, as kube-proxy does: then Serve returns it.
func Serve(ctx context.Context, name, addr string, h http.Handler, hardFail bool, log *zap.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // exiting anyway
	}()
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			log.Info("serving", zap.String("server", name), zap.String("address", ln.Addr().String()))
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server failed", zap.String("server", name), zap.Error(err))
			}
			return nil
		}
		if hardFail {
			return fmt.Errorf("%s server: %w", name, err)
		}
		log.Error("cannot bind, retrying in 5s", zap.String("server", name), zap.String("address", addr), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
}

// InstallProfiling serves Go's runtime profiles under /debug/pprof/, where
// kube-proxy's --profiling serves them.
func InstallProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
