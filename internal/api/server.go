package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// DefaultSocket is --api-socket's default.
const DefaultSocket = "/run/ebpf-proxy/agent.sock"

// The agent's own health on the socket: what its /livez and /healthz say
// on the health check port, which another proxy may still hold (kube-proxy,
// during a migration), so that the kubelet's probes reach this agent's.
const (
	LivezPath   = "/livez"
	HealthzPath = "/healthz"
)

// Handler serves the API of st, and health's /livez and /healthz when
// health is not nil.
func Handler(st *State, health http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ServicesPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(st.Services()) //nolint:errcheck // the client went away
	})
	if health != nil {
		mux.Handle("GET "+LivezPath, health)
		mux.Handle("GET "+HealthzPath, health)
	}
	return mux
}

// Listen creates the unix socket at path, readable and writable by its
// owner only (mode 0600): the socket is made under a temporary name,
// restricted, then renamed onto path, so that it is never reachable with
// a wider mode. A socket left at path by an earlier agent is replaced;
// any other file there is an error. The directory is created (0755) if
// needed.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return nil, fmt.Errorf("%s exists and is not a socket", path)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	os.Remove(tmp) //nolint:errcheck // usually absent
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		os.Remove(tmp) //nolint:errcheck // best effort
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		os.Remove(tmp) //nolint:errcheck // best effort
		return nil, err
	}
	return l, nil
}

// Server is the API serving on a unix socket.
type Server struct {
	path string
	srv  *http.Server
}

// Serve serves st (and health, see Handler) on the unix socket path until
// Close. It returns once the socket is listening, or with the error that
// kept it from listening.
func Serve(path string, st *State, health http.Handler, log *zap.Logger) (*Server, error) {
	l, err := Listen(path)
	if err != nil {
		return nil, fmt.Errorf("--api-socket %s: %w", path, err)
	}
	s := &Server{path: path, srv: &http.Server{Handler: Handler(st, health), ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("local API server", zap.String("socket", path), zap.Error(err))
		}
	}()
	log.Info("serving the local API", zap.String("socket", path))
	return s, nil
}

// Close stops the server and removes its socket.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx) //nolint:errcheck // closing anyway
	os.Remove(s.path)   //nolint:errcheck // best effort
}

// get asks the agent listening on the unix socket path for what it serves
// at urlPath; the caller closes the response's body.
func get(ctx context.Context, path, urlPath string) (*http.Response, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+urlPath, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// Probe asks the agent listening on the unix socket path for its health
// at urlPath (LivezPath or HealthzPath) and returns the answer's status
// code and body.
func Probe(ctx context.Context, path, urlPath string) (int, string, error) {
	resp, err := get(ctx, path, urlPath)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", urlPath, err)
	}
	return resp.StatusCode, string(body), nil
}

// Get asks the agent listening on the unix socket path for its Services.
func Get(ctx context.Context, path string) (*Services, error) {
	resp, err := get(ctx, path, ServicesPath)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", ServicesPath, resp.Status)
	}
	var out Services
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("%s: %w", ServicesPath, err)
	}
	return &out, nil
}
