package main

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/conntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"

	"github.com/spf13/pflag"
	v1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbase "k8s.io/component-base/config/v1alpha1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// kube-proxy's configuration file (--config): the KubeProxyConfiguration
// that kubeadm and most installers hand kube-proxy through a ConfigMap. As
// in kube-proxy, the file replaces the flags it covers (configFlags), with
// kube-proxy's defaults for what it leaves out, except --hostname-override
// and -v, which win when given; ebpf-proxy's own flags are not in the file
// and always apply.

const (
	configKind       = "KubeProxyConfiguration"
	configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
)

// configFlags are the flags a configuration file replaces.
var configFlags = []string{
	"kubeconfig", "kube-api-content-type", "kube-api-qps", "kube-api-burst", "feature-gates", "logging-format",
	"bind-address", "healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail", "profiling",
	"show-hidden-metrics-for-version", "proxy-mode",
	"iptables-masquerade-bit", "masquerade-all", "iptables-localhost-nodeports", "iptables-sync-period", "iptables-min-sync-period",
	"ipvs-sync-period", "ipvs-min-sync-period", "ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp",
	"ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout",
	"detect-local-mode", "pod-bridge-interface", "pod-interface-name-prefix", "cluster-cidr", "nodeport-addresses",
	"oom-score-adj", "conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established",
	"conntrack-tcp-timeout-close-wait", "conntrack-tcp-be-liberal", "conntrack-udp-timeout", "conntrack-udp-timeout-stream",
	"config-sync-period",
}

// readConfigFile reads and decodes a KubeProxyConfiguration. Fields it
// does not know make kube-proxy fall back from strict to lenient decoding
// with a warning; so does this, returning the warning.
func readConfigFile(path string) (*kubeproxy.KubeProxyConfiguration, []string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	var warnings []string
	c := &kubeproxy.KubeProxyConfiguration{}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		c = &kubeproxy.KubeProxyConfiguration{}
		if lerr := yaml.Unmarshal(b, c); lerr != nil {
			return nil, nil, fmt.Errorf("--config %s: %w", path, lerr)
		}
		warnings = append(warnings, fmt.Sprintf("strict decoding of %s failed, decoded leniently as kube-proxy does: %v", path, err))
	}
	if c.Kind != configKind || c.APIVersion != configAPIVersion {
		return nil, nil, fmt.Errorf("--config %s: kind %q apiVersion %q, want %s %s", path, c.Kind, c.APIVersion, configKind, configAPIVersion)
	}
	return c, warnings, nil
}

// applyConfig sets every option the file covers from c, with kube-proxy's
// default where c leaves a field out. set says which flags the command line
// gave. It returns the covered flags that were given and so are ignored.
func (o *options) applyConfig(c *kubeproxy.KubeProxyConfiguration, set func(name string) bool) (ignored []string) {
	d := defaultOptions()
	for _, name := range configFlags {
		if set(name) {
			ignored = append(ignored, "--"+name)
		}
	}
	str := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	dur := func(v v1.Duration, def time.Duration) time.Duration {
		if v.Duration == 0 {
			return def
		}
		return v.Duration
	}

	o.featureGates = nil
	if len(c.FeatureGates) > 0 {
		o.featureGates = map[string]string{}
		for k, v := range c.FeatureGates {
			o.featureGates[k] = fmt.Sprint(v)
		}
	}
	o.kubeconfig = c.ClientConnection.Kubeconfig
	o.kubeAPIContentType = str(c.ClientConnection.ContentType, d.kubeAPIContentType)
	o.kubeAPIQPS = c.ClientConnection.QPS
	if o.kubeAPIQPS == 0 {
		o.kubeAPIQPS = d.kubeAPIQPS
	}
	o.kubeAPIBurst = c.ClientConnection.Burst
	if o.kubeAPIBurst == 0 {
		o.kubeAPIBurst = d.kubeAPIBurst
	}
	o.loggingFormat = d.loggingFormat
	if c.Logging.Format == "text" {
		o.loggingFormat = "text"
	}
	if !set("v") {
		o.verbosity = int(c.Logging.Verbosity)
	}
	if !set("hostname-override") {
		o.hostnameOverride = c.HostnameOverride
	}
	o.bindAddress = str(c.BindAddress, d.bindAddress)
	o.healthzBindAddress = str(c.HealthzBindAddress, d.healthzBindAddress)
	o.metricsBindAddress = str(c.MetricsBindAddress, d.metricsBindAddress)
	o.bindAddrHardFail = c.BindAddressHardFail
	o.profiling = c.EnableProfiling
	o.showHiddenMetrics = c.ShowHiddenMetricsForVersion
	o.proxyMode = str(string(c.Mode), proxymode.Auto)

	o.masqueradeBit = d.masqueradeBit
	if c.IPTables.MasqueradeBit != nil {
		o.masqueradeBit = *c.IPTables.MasqueradeBit
	}
	o.masqueradeAll = c.IPTables.MasqueradeAll
	o.localhostNodePorts = c.IPTables.LocalhostNodePorts == nil || *c.IPTables.LocalhostNodePorts
	o.iptablesSyncPeriod = dur(c.IPTables.SyncPeriod, d.iptablesSyncPeriod)
	o.iptablesMinSync = dur(c.IPTables.MinSyncPeriod, d.iptablesMinSync)
	// An nftables period equal to the iptables one (as --write-config-to
	// writes it when the file had none) follows the iptables one.
	o.nftablesSyncPeriod, o.nftablesMinSync = 0, 0
	if p := dur(c.NFTables.SyncPeriod, 0); p != o.iptablesSyncPeriod {
		o.nftablesSyncPeriod = p
	}
	if p := dur(c.NFTables.MinSyncPeriod, 0); p != o.iptablesMinSync {
		o.nftablesMinSync = p
	}
	if c.Mode == proxymode.NFTables {
		// The nftables section's masquerade settings, where given, are
		// the ones the nftables mode uses.
		if c.NFTables.MasqueradeBit != nil {
			o.masqueradeBit = *c.NFTables.MasqueradeBit
		}
		o.masqueradeAll = o.masqueradeAll || c.NFTables.MasqueradeAll
	}
	o.ipvsSyncPeriod = dur(c.IPVS.SyncPeriod, d.ipvsSyncPeriod)
	o.ipvsMinSync = dur(c.IPVS.MinSyncPeriod, d.ipvsMinSync)
	o.ipvsScheduler = c.IPVS.Scheduler
	o.ipvsExcludeCIDRs = slices.Clone(c.IPVS.ExcludeCIDRs)
	o.ipvsStrictARP = c.IPVS.StrictARP
	o.ipvsTCPTimeout = c.IPVS.TCPTimeout.Duration
	o.ipvsTCPFinTimeout = c.IPVS.TCPFinTimeout.Duration
	o.ipvsUDPTimeout = c.IPVS.UDPTimeout.Duration

	o.detectLocalMode = string(c.DetectLocalMode)
	o.podBridgeInterface = c.DetectLocal.BridgeInterface
	o.podInterfacePrefix = c.DetectLocal.InterfaceNamePrefix
	o.clusterCIDR = c.ClusterCIDR
	o.nodePortAddresses = slices.Clone(c.NodePortAddresses)
	o.oomScoreAdj = d.oomScoreAdj
	if c.OOMScoreAdj != nil {
		o.oomScoreAdj = *c.OOMScoreAdj
	}
	o.conntrack = conntrack.Settings{
		MaxPerCore: c.Conntrack.MaxPerCore,
		Min:        c.Conntrack.Min,
	}
	if t := c.Conntrack.TCPEstablishedTimeout; t != nil {
		o.conntrack.TCPEstablished = &t.Duration
	}
	if t := c.Conntrack.TCPCloseWaitTimeout; t != nil {
		o.conntrack.TCPCloseWait = &t.Duration
	}
	if c.Conntrack.TCPBeLiberal {
		o.conntrack.TCPBeLiberal = &c.Conntrack.TCPBeLiberal
	}
	if t := c.Conntrack.UDPTimeout.Duration; t != 0 {
		o.conntrack.UDPTimeout = &t
	}
	if t := c.Conntrack.UDPStreamTimeout.Duration; t != 0 {
		o.conntrack.UDPStreamTimeout = &t
	}
	o.configSyncPeriod = dur(c.ConfigSyncPeriod, d.configSyncPeriod)
	return ignored
}

// toConfig is the configuration in effect as a KubeProxyConfiguration
// (--write-config-to); applyConfig of it gives the same options back.
func (o *options) toConfig() *kubeproxy.KubeProxyConfiguration {
	c := &kubeproxy.KubeProxyConfiguration{}
	c.Kind, c.APIVersion = configKind, configAPIVersion
	if len(o.featureGates) > 0 {
		c.FeatureGates = map[string]bool{}
		for k := range o.featureGates {
			c.FeatureGates[k] = o.gates[k]
		}
	}
	c.ClientConnection = componentbase.ClientConnectionConfiguration{
		Kubeconfig: o.kubeconfig, ContentType: o.kubeAPIContentType, QPS: o.kubeAPIQPS, Burst: o.kubeAPIBurst,
	}
	c.Logging = logsapi.LoggingConfiguration{Format: o.loggingFormat, Verbosity: logsapi.VerbosityLevel(o.verbosity)}
	c.HostnameOverride = o.hostnameOverride
	c.BindAddress = o.bindAddress
	c.HealthzBindAddress = o.healthzBindAddress
	c.MetricsBindAddress = o.metricsBindAddress
	c.BindAddressHardFail = o.bindAddrHardFail
	c.EnableProfiling = o.profiling
	c.ShowHiddenMetricsForVersion = o.showHiddenMetrics
	c.Mode = kubeproxy.ProxyMode(o.proxyMode)
	bit, localhost := o.masqueradeBit, o.localhostNodePorts
	c.IPTables = kubeproxy.KubeProxyIPTablesConfiguration{
		MasqueradeBit: &bit, MasqueradeAll: o.masqueradeAll, LocalhostNodePorts: &localhost,
		SyncPeriod: v1.Duration{Duration: o.iptablesSyncPeriod}, MinSyncPeriod: v1.Duration{Duration: o.iptablesMinSync},
	}
	nftSync, nftMinSync := o.syncPeriods(proxymode.NFTables)
	c.NFTables = kubeproxy.KubeProxyNFTablesConfiguration{
		MasqueradeBit: &bit, MasqueradeAll: o.masqueradeAll,
		SyncPeriod: v1.Duration{Duration: nftSync}, MinSyncPeriod: v1.Duration{Duration: nftMinSync},
	}
	c.IPVS = kubeproxy.KubeProxyIPVSConfiguration{
		SyncPeriod: v1.Duration{Duration: o.ipvsSyncPeriod}, MinSyncPeriod: v1.Duration{Duration: o.ipvsMinSync},
		Scheduler: o.ipvsScheduler, ExcludeCIDRs: o.ipvsExcludeCIDRs, StrictARP: o.ipvsStrictARP,
		TCPTimeout: v1.Duration{Duration: o.ipvsTCPTimeout}, TCPFinTimeout: v1.Duration{Duration: o.ipvsTCPFinTimeout},
		UDPTimeout: v1.Duration{Duration: o.ipvsUDPTimeout},
	}
	c.DetectLocalMode = kubeproxy.LocalMode(o.detectLocalMode)
	c.DetectLocal = kubeproxy.DetectLocalConfiguration{BridgeInterface: o.podBridgeInterface, InterfaceNamePrefix: o.podInterfacePrefix}
	c.ClusterCIDR = o.clusterCIDR
	c.NodePortAddresses = o.nodePortAddresses
	oom := o.oomScoreAdj
	c.OOMScoreAdj = &oom
	ct := o.conntrack
	c.Conntrack = kubeproxy.KubeProxyConntrackConfiguration{MaxPerCore: ct.MaxPerCore, Min: ct.Min}
	if ct.TCPEstablished != nil {
		c.Conntrack.TCPEstablishedTimeout = &v1.Duration{Duration: *ct.TCPEstablished}
	}
	if ct.TCPCloseWait != nil {
		c.Conntrack.TCPCloseWaitTimeout = &v1.Duration{Duration: *ct.TCPCloseWait}
	}
	c.Conntrack.TCPBeLiberal = ct.TCPBeLiberal != nil && *ct.TCPBeLiberal
	if ct.UDPTimeout != nil {
		c.Conntrack.UDPTimeout = v1.Duration{Duration: *ct.UDPTimeout}
	}
	if ct.UDPStreamTimeout != nil {
		c.Conntrack.UDPStreamTimeout = v1.Duration{Duration: *ct.UDPStreamTimeout}
	}
	c.ConfigSyncPeriod = v1.Duration{Duration: o.configSyncPeriod}
	return c
}

// writeConfig writes the configuration in effect to path.
func (o *options) writeConfig(path string) error {
	b, err := yaml.Marshal(o.toConfig())
	if err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}

// finishFlags reads --config, once fs has parsed the flags into o: as in
// kube-proxy, the file replaces the kube-proxy flags that were not given
// on the command line.
func finishFlags(o *options, fs *pflag.FlagSet) (notes []string, err error) {
	if o.configFile == "" {
		return nil, nil
	}
	c, warnings, err := readConfigFile(o.configFile)
	if err != nil {
		return nil, err
	}
	ignored := o.applyConfig(c, func(name string) bool { return fs.Changed(name) })
	if len(ignored) > 0 {
		warnings = append(warnings, fmt.Sprintf("--config is set: as in kube-proxy, these flags are ignored in favour of the file: %v", ignored))
	}
	if c.PortRange != "" {
		warnings = append(warnings, "portRange in the configuration file has no effect (as in kube-proxy)")
	}
	return warnings, nil
}
