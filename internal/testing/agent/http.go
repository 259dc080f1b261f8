package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// maxBody bounds what a scrape reads: /metrics of 10,000 Services is a few
// MiB.
const maxBody = 64 << 20

// HTTPClient returns a client whose connections are made inside the
// network namespace at nsPath ("" is the test binary's own), where the
// agent's health and metrics servers listen on its loopback; the test
// binary itself never moves. It uses no proxy and no keep-alive, and gives
// up on a request after 10 s.
func HTTPClient(nsPath string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var conn net.Conn
				err := netns.Do(nsPath, func() (err error) {
					conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return conn, err
			},
			DisableKeepAlives: true,
		},
	}
}

// Get fetches url from inside the process's namespace and returns the
// status code and the body.
func (p *Process) Get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, body, nil
}

// GetWhenUp is Get, trying again for 5 s while the connection fails: the
// servers start with the agent.
func (p *Process) GetWhenUp(url string) (int, []byte, error) {
	var err error
	for range 50 {
		var code int
		var body []byte
		if code, body, err = p.Get(context.Background(), url); err == nil {
			return code, body, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, nil, fmt.Errorf("GET %s: %w", url, err)
}

// Metrics scrapes url (the /metrics of the agent or of kube-proxy) from
// inside the process's namespace.
func (p *Process) Metrics(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	code, body, err := p.Get(ctx, url)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", url, code, http.StatusText(code))
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	return fams, nil
}
