package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"
)

// outsideName stands for the client outside the cluster where a pod's name
// would be (probeFrom, startLoop).
const outsideName = "outside"

// outsideClient asks the test server's outside command (testserver
// outside, run by the control plane in its namespace, beside the nodes) to
// run probes and loops from there: a client outside the cluster, as a user
// of a NodePort is.
type outsideClient struct {
	base string
}

func (o outsideClient) call(ctx context.Context, method, path string, q url.Values, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, o.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the client outside the cluster: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("the client outside the cluster: %s %s: %s: %s", method, path, resp.Status, b)
	}
	return b, err
}

// probe returns the report of count attempts from outside to addr.
func (o outsideClient) probe(ctx context.Context, proto string, count int, timeout time.Duration, addr netip.AddrPort) (string, error) {
	b, err := o.call(ctx, http.MethodGet, "/probe", url.Values{"proto": {proto}, "count": {strconv.Itoa(count)},
		"timeout": {timeout.String()}, "addr": {addr.String()}}, time.Duration(count+1)*timeout+time.Minute)
	return string(b), err
}

// startLoop starts a loop from outside to addr, as the pods' loops run.
func (o outsideClient) startLoop(ctx context.Context, addr netip.AddrPort) (int, error) {
	b, err := o.call(ctx, http.MethodPost, "/loop", url.Values{"addr": {addr.String()}, "interval": {"20ms"},
		"timeout": {"5s"}, "max-duration": {"10m"}}, time.Minute)
	if err != nil {
		return 0, err
	}
	var r struct{ ID int }
	if err := json.Unmarshal(b, &r); err != nil || r.ID == 0 {
		return 0, fmt.Errorf("the client outside the cluster started no loop: %v: %s", err, b)
	}
	return r.ID, nil
}

// stopLoop ends a loop and returns its report.
func (o outsideClient) stopLoop(ctx context.Context, id int) ([]byte, error) {
	return o.call(ctx, http.MethodPost, "/loop/stop", url.Values{"id": {strconv.Itoa(id)}}, time.Minute)
}
