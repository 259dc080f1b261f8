// Package cluster runs a real etcd and kube-apiserver on 127.0.0.1 for the
// end-to-end tests: throwaway certificates, static tokens, RBAC on, no
// controller manager (tests write EndpointSlices themselves, which keeps them
// deterministic). It hands tests a client-go clientset and kubeconfig files,
// creates Node objects, makes the API server reachable inside test network
// namespaces, restarts the API server on demand, and removes every process and
// file it created when the test ends or the test binary is interrupted.
//
// The binaries come from the cache that test/e2e/build-binaries.sh fills; see
// FindBinaries.
package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/interrupt"
)

// Users that every cluster has. AdminUser is in system:masters. The default
// RBAC policy binds KubeProxyUser to ClusterRole system:node-proxier, exactly
// the rights upstream kube-proxy has on a real cluster.
const (
	AdminUser     = "admin"
	KubeProxyUser = "system:kube-proxy"
)

// ServiceCIDR and ServiceCIDR6 are the API server's
// --service-cluster-ip-range (dual-stack, IPv4 primary), the ClusterIP
// ranges of the project's test address plan.
const (
	ServiceCIDR  = "10.96.0.0/16"
	ServiceCIDR6 = "fd00:10:96::/112"
)

// User is an extra identity for Options.Users. It gets a static bearer token
// and a kubeconfig file; grant it rights with RBAC objects through the admin
// clientset.
type User struct {
	Name   string
	Groups []string
}

// Options configure Start. The zero value runs the cached binaries with the
// harness's defaults.
type Options struct {
	// Binaries to run; FindBinaries when empty.
	Binaries Binaries
	// Users in addition to AdminUser and KubeProxyUser.
	Users []User
	// APIServerArgs are appended to the harness's kube-apiserver flags
	// (a flag given twice takes the later value).
	APIServerArgs []string
	// ServingIPs are extra addresses the API server's certificate is valid
	// for, such as a node address that kubelets and pods dial.
	ServingIPs []net.IP
	// StartTimeout bounds each start of etcd and of the API server; 2
	// minutes when zero (both start in seconds on an idle machine, but the
	// machine is shared with builds).
	StartTimeout time.Duration
}

const (
	defaultStartTimeout = 2 * time.Minute
	// stopGrace is how long the API server gets to shut down gracefully on
	// SIGTERM before SIGKILL.
	stopGrace = 15 * time.Second
	// startAttempts covers a free port being taken between the harness
	// choosing it and the process binding it.
	startAttempts = 3
)

// Cluster is a running etcd and kube-apiserver. Its methods are safe for
// concurrent use.
type Cluster struct {
	opts    Options
	bins    Binaries
	dir     string
	pki     *pki
	etcdURL string
	apiPort int
	tokens  map[string]string // user name -> bearer token
	users   []string          // user names, in the order of the token file

	// ctx is cancelled by Stop, so that a Stop from the interrupt handler
	// does not wait for a start in progress to time out.
	ctx    context.Context
	cancel context.CancelFunc

	mu         sync.Mutex
	etcd       *agent.Process
	apiserver  *agent.Process
	forwarders []*Forwarder
	stopped    bool
	stopErr    error
	unregister func()
	clientset  *kubernetes.Clientset
}

// Start starts etcd and kube-apiserver and returns once the API server is
// ready (/readyz, RBAC bootstrap policy, the default namespace and the
// kubernetes Service exist). The caller must call Stop; StartT does that. On
// error nothing is left running.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	bins := opts.Binaries
	if bins == (Binaries{}) {
		if bins, err = FindBinaries(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "ebpf-proxy-e2e-")
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	c = &Cluster{opts: opts, bins: bins, dir: dir, tokens: map[string]string{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	// Registered before the first process starts, so that an interrupt
	// during the start already cleans up.
	c.unregister = interrupt.Register(func() { _ = c.Stop() })
	// The returns below set c to nil: the cleanup keeps its own.
	started := c
	defer func() {
		if err != nil {
			_ = started.Stop()
		}
	}()

	if c.pki, err = writePKI(dir, opts.ServingIPs); err != nil {
		return nil, err
	}
	if err := c.writeTokens(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServerFreshPort(ctx); err != nil {
		return nil, err
	}
	for _, u := range c.users {
		if err := c.writeKubeconfig(u); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) writeTokens() error {
	users := append([]User{
		{Name: AdminUser, Groups: []string{"system:masters"}},
		{Name: KubeProxyUser},
	}, c.opts.Users...)
	var b strings.Builder
	for _, u := range users {
		if _, dup := c.tokens[u.Name]; dup || u.Name == "" || strings.ContainsAny(u.Name, ",\"\n") {
			return fmt.Errorf("invalid or duplicate user name %q", u.Name)
		}
		for _, g := range u.Groups {
			if g == "" || strings.ContainsAny(g, ",\"\n") {
				return fmt.Errorf("user %s: invalid group name %q", u.Name, g)
			}
		}
		tok := newToken()
		c.tokens[u.Name] = tok
		c.users = append(c.users, u.Name)
		// token,user,uid[,"group1,group2"]: the format of --token-auth-file.
		fmt.Fprintf(&b, "%s,%s,%s", tok, u.Name, u.Name)
		if len(u.Groups) > 0 {
			fmt.Fprintf(&b, ",%q", strings.Join(u.Groups, ","))
		}
		b.WriteByte('\n')
	}
	path := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	var lastErr error
	for range startAttempts {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		dataDir := filepath.Join(c.dir, "etcd")
		if err := os.RemoveAll(dataDir); err != nil {
			return fmt.Errorf("clear etcd data directory: %w", err)
		}
		args := []string{
			"--name=e2e",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=e2e=" + peer,
			// The data is thrown away with the cluster; fsync would only
			// make the tests slower and the shared disk busier.
			"--unsafe-no-fsync",
			"--log-level=warn",
		}
		p, err := startProcess("etcd", c.bins.Etcd, args, filepath.Join(c.dir, "etcd.log"))
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.etcd = p
		c.mu.Unlock()
		lastErr = c.waitReady(ctx, p, func(hc *http.Client) error {
			return checkHealth(hc, client+"/health", `"health":"true"`)
		}, http.DefaultClient)
		if lastErr == nil {
			c.etcdURL = client
			return nil
		}
		_ = p.Stop(stopGrace)
		if !strings.Contains(p.LogTail(50), "address already in use") {
			break
		}
	}
	return fmt.Errorf("start etcd: %w", lastErr)
}

func (c *Cluster) startAPIServerFreshPort(ctx context.Context) error {
	var err error
	for range startAttempts {
		var ports []int
		if ports, err = freePorts(1); err != nil {
			return err
		}
		c.apiPort = ports[0]
		err = c.startAPIServer(ctx)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
	}
	return err
}

func (c *Cluster) apiServerArgs() []string {
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--cert-dir=" + filepath.Join(c.dir, "apiserver-certs"),
		"--tls-cert-file=" + c.pki.certFile,
		"--tls-private-key-file=" + c.pki.keyFile,
		"--client-ca-file=" + c.pki.caFile,
		"--token-auth-file=" + filepath.Join(c.dir, "tokens.csv"),
		"--service-account-key-file=" + c.pki.saPubFile,
		"--service-account-signing-key-file=" + c.pki.saPrivFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + ServiceCIDR + "," + ServiceCIDR6,
		"--authorization-mode=RBAC",
		// No loopback endpoint for default/kubernetes: it would be an
		// endpoint the proxies under test program but no test expects.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	return append(args, c.opts.APIServerArgs...)
}

// startAPIServer starts kube-apiserver on c.apiPort and waits until it is
// ready. It does not hold c.mu while waiting, so Stop can interrupt it.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return errors.New("cluster is stopped")
	}
	if c.apiserver != nil {
		c.mu.Unlock()
		return errors.New("kube-apiserver is already running")
	}
	p, err := startProcess("kube-apiserver", c.bins.KubeAPIServer, c.apiServerArgs(), filepath.Join(c.dir, "kube-apiserver.log"))
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.apiserver = p
	c.mu.Unlock()

	hc, err := c.httpClient()
	if err != nil {
		return err
	}
	err = c.waitReady(ctx, p, func(hc *http.Client) error {
		return checkHealth(hc, c.URL()+"/readyz", "ok")
	}, hc)
	if err == nil {
		err = c.waitBootstrapped(ctx, p)
	}
	if err != nil {
		c.mu.Lock()
		c.apiserver = nil
		c.mu.Unlock()
		_ = p.Stop(stopGrace)
		return fmt.Errorf("start kube-apiserver: %w\nlast lines of its log:\n%s", err, p.LogTail(30))
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.forwarders {
		if err := f.listen(); err != nil {
			return err
		}
	}
	return nil
}

// waitBootstrapped waits for what the API server creates right after it
// reports ready: tests that create Services in "default", or count
// Services, must not race with it.
func (c *Cluster) waitBootstrapped(ctx context.Context, p *agent.Process) error {
	cs := c.Clientset()
	return c.waitReady(ctx, p, func(*http.Client) error {
		if _, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := cs.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		return err
	}, nil)
}

// waitReady polls check until it succeeds, the process exits, the start
// timeout passes, ctx is cancelled or the cluster is stopped.
func (c *Cluster) waitReady(ctx context.Context, p *agent.Process, check func(*http.Client) error, hc *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check(hc)
		if err == nil {
			return nil
		}
		if exitErr := p.ExitError(); exitErr != nil {
			return fmt.Errorf("%w\nlast lines of its log:\n%s", exitErr, p.LogTail(30))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w (last check: %v)", p.Name(), c.opts.StartTimeout, ctx.Err(), err)
		case <-c.ctx.Done():
			return fmt.Errorf("%s: cluster stopped while starting", p.Name())
		case <-tick.C:
		}
	}
}

func checkHealth(hc *http.Client, url, want string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	body := string(data)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(body))
	}
	return nil
}

func (c *Cluster) httpClient() (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.pki.caPEM) {
		return nil, errors.New("parse cluster CA certificate")
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1. They
// are held open together so the kernel cannot hand out one twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// URL is the API server's address, https://127.0.0.1:<port>. It stays the
// same across RestartAPIServer.
func (c *Cluster) URL() string { return "https://127.0.0.1:" + strconv.Itoa(c.apiPort) }

// Port is the API server's port on 127.0.0.1.
func (c *Cluster) Port() int { return c.apiPort }

// CACertPEM is the PEM certificate of the CA that signed the API server's
// serving certificate.
func (c *Cluster) CACertPEM() []byte { return slices.Clone(c.pki.caPEM) }

// CAFile is the path of the cluster CA's certificate, for components such as
// kube-controller-manager (--root-ca-file).
func (c *Cluster) CAFile() string { return c.pki.caFile }

// ServiceAccountKeyFile is the path of the service-account signing key, for
// kube-controller-manager (--service-account-private-key-file).
func (c *Cluster) ServiceAccountKeyFile() string { return c.pki.saPrivFile }

// Binaries returns the binaries the cluster runs, including kube-proxy and
// kubectl for the tests to run.
func (c *Cluster) Binaries() Binaries { return c.bins }

// Dir is the cluster's temporary directory (certificates, tokens,
// kubeconfigs, etcd data, logs). Stop removes it.
func (c *Cluster) Dir() string { return c.dir }

// Token returns the bearer token of user.
func (c *Cluster) Token(user string) (string, error) {
	tok, ok := c.tokens[user]
	if !ok {
		return "", fmt.Errorf("no user %q in this cluster", user)
	}
	return tok, nil
}

// RESTConfig returns a new client configuration for user, without client-side
// rate limiting (client-go's default of 5 requests per second would make
// fixture loading the bottleneck of every test).
func (c *Cluster) RESTConfig(user string) (*rest.Config, error) {
	tok, err := c.Token(user)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            c.URL(),
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CACertPEM()},
		QPS:             -1,
		UserAgent:       "ebpf-proxy-e2e",
	}, nil
}

// Clientset returns a clientset authenticated as AdminUser.
func (c *Cluster) Clientset() *kubernetes.Clientset {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clientset == nil {
		cfg, err := c.RESTConfig(AdminUser)
		if err != nil {
			panic(err) // AdminUser always exists
		}
		c.clientset = kubernetes.NewForConfigOrDie(cfg)
	}
	return c.clientset
}

// ClientsetFor returns a new clientset authenticated as user.
func (c *Cluster) ClientsetFor(user string) (*kubernetes.Clientset, error) {
	cfg, err := c.RESTConfig(user)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset for %s: %w", user, err)
	}
	return cs, nil
}

func (c *Cluster) kubeconfigPath(user string) string {
	return filepath.Join(c.dir, "kubeconfig-"+strings.ReplaceAll(user, ":", "-"))
}

func (c *Cluster) writeKubeconfig(user string) error {
	return c.WriteKubeconfig(user, c.URL(), c.kubeconfigPath(user))
}

// WriteKubeconfig writes to path a kubeconfig for user that names the API
// server at server (an https URL): the address a client in another network
// namespace or machine dials. It embeds the CA and the user's token.
func (c *Cluster) WriteKubeconfig(user, server, path string) error {
	token, err := c.Token(user)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.CACertPEM()}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig for %s: %w", user, err)
	}
	return nil
}

// Kubeconfig returns the path of a kubeconfig file for user. The file embeds
// the CA and the token, and names the server https://127.0.0.1:<port>, which
// is valid in the root namespace and, after ForwardIntoNetNS, inside a test
// namespace.
func (c *Cluster) Kubeconfig(user string) (string, error) {
	if _, err := c.Token(user); err != nil {
		return "", err
	}
	return c.kubeconfigPath(user), nil
}

// AdminKubeconfig returns the path of the kubeconfig file for AdminUser.
func (c *Cluster) AdminKubeconfig() string { return c.kubeconfigPath(AdminUser) }

// KubeProxyKubeconfig returns the path of the kubeconfig file for
// KubeProxyUser, the identity upstream kube-proxy runs as.
func (c *Cluster) KubeProxyKubeconfig() string { return c.kubeconfigPath(KubeProxyUser) }

// LogTails returns the last lines of the API server's and etcd's logs.
func (c *Cluster) LogTails(lines int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, p := range []*agent.Process{c.apiserver, c.etcd} {
		if p != nil {
			fmt.Fprintf(&b, "last lines of the %s log:\n%s\n", p.Name(), p.LogTail(lines))
		}
	}
	return b.String()
}

// EtcdPID is the process ID of etcd, or 0 once the cluster is stopped.
func (c *Cluster) EtcdPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.etcd == nil {
		return 0
	}
	return c.etcd.PID()
}

// APIServerPID is the process ID of kube-apiserver, or 0 while it is
// stopped.
func (c *Cluster) APIServerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiserver == nil {
		return 0
	}
	return c.apiserver.PID()
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 15 s) and
// closes the listeners and connections of every Forwarder, so clients in test
// namespaces see the API server go away just as clients in the root namespace
// do. etcd keeps running. Stopping a stopped API server does nothing.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	p := c.apiserver
	c.apiserver = nil
	for _, f := range c.forwarders {
		f.pause()
	}
	c.mu.Unlock()
	if p != nil {
		_ = p.Stop(stopGrace)
	}
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// same flags, port and etcd, and waits until it is ready; then every
// Forwarder listens again.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	return c.startAPIServer(ctx)
}

// RestartAPIServer is StopAPIServer followed by StartAPIServer.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.StopAPIServer()
	return c.StartAPIServer(ctx)
}

// Stop kills the API server and etcd, closes every Forwarder and removes
// Dir. It is idempotent and safe to call concurrently with any method; the
// first call's result is returned to every caller.
func (c *Cluster) Stop() error {
	c.cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	for _, f := range c.forwarders {
		f.close()
	}
	c.forwarders = nil
	// SIGTERM first: the API server shuts down in about a second, and its
	// log then ends with the shutdown rather than with a page of etcd
	// errors from being cut off; SIGKILL only if it hangs.
	for _, p := range []*agent.Process{c.apiserver, c.etcd} {
		if p != nil {
			_ = p.Stop(stopGrace)
		}
	}
	c.apiserver, c.etcd = nil, nil
	if err := os.RemoveAll(c.dir); err != nil {
		c.stopErr = fmt.Errorf("remove cluster directory: %w", err)
	}
	c.unregister()
	return c.stopErr
}
