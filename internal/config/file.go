package config

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"

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
//
// The file's mode is kube-proxy's choice, not ebpf-proxy's: kubeadm writes
// "mode: iptables" into every ConfigMap it makes (since 1.37, where the
// field was empty before), and the agent reading that ConfigMap must not
// take it as a wish for its iptables fallback. So --proxy-mode is the
// agent's own setting, never replaced by the file (KubeProxyMode keeps
// what the file says, for the log and for the sections kube-proxy would
// read by it).

const (
	configKind       = "KubeProxyConfiguration"
	configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
)

// configFlags are the flags a configuration file replaces.
var configFlags = []string{
	"kubeconfig", "kube-api-content-type", "kube-api-qps", "kube-api-burst", "feature-gates", "logging-format",
	"bind-address", "healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail", "profiling",
	"show-hidden-metrics-for-version",
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
func (o *Options) applyConfig(c *kubeproxy.KubeProxyConfiguration, set func(name string) bool) (ignored []string) {
	d := Defaults()
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

	o.FeatureGates = nil
	if len(c.FeatureGates) > 0 {
		o.FeatureGates = map[string]string{}
		for k, v := range c.FeatureGates {
			o.FeatureGates[k] = fmt.Sprint(v)
		}
	}
	o.Kubeconfig = c.ClientConnection.Kubeconfig
	o.KubeAPIContentType = str(c.ClientConnection.ContentType, d.KubeAPIContentType)
	o.KubeAPIQPS = c.ClientConnection.QPS
	if o.KubeAPIQPS == 0 {
		o.KubeAPIQPS = d.KubeAPIQPS
	}
	o.KubeAPIBurst = c.ClientConnection.Burst
	if o.KubeAPIBurst == 0 {
		o.KubeAPIBurst = d.KubeAPIBurst
	}
	o.LoggingFormat = d.LoggingFormat
	if c.Logging.Format == "text" {
		o.LoggingFormat = "text"
	}
	if !set("v") {
		o.Verbosity = int(c.Logging.Verbosity)
	}
	if !set("hostname-override") {
		o.HostnameOverride = c.HostnameOverride
	}
	o.BindAddress = str(c.BindAddress, d.BindAddress)
	o.HealthzBindAddress = str(c.HealthzBindAddress, d.HealthzBindAddress)
	o.MetricsBindAddress = str(c.MetricsBindAddress, d.MetricsBindAddress)
	o.BindAddrHardFail = c.BindAddressHardFail
	o.Profiling = c.EnableProfiling
	o.ShowHiddenMetrics = c.ShowHiddenMetricsForVersion
	o.KubeProxyMode = string(c.Mode)

	o.MasqueradeBit = d.MasqueradeBit
	if c.IPTables.MasqueradeBit != nil {
		o.MasqueradeBit = *c.IPTables.MasqueradeBit
	}
	o.MasqueradeAll = c.IPTables.MasqueradeAll
	o.LocalhostNodePorts = c.IPTables.LocalhostNodePorts == nil || *c.IPTables.LocalhostNodePorts
	o.IPTablesSyncPeriod = dur(c.IPTables.SyncPeriod, d.IPTablesSyncPeriod)
	o.IPTablesMinSync = dur(c.IPTables.MinSyncPeriod, d.IPTablesMinSync)
	// An nftables period equal to the iptables one (as --write-config-to
	// writes it when the file had none) follows the iptables one.
	o.NFTablesSyncPeriod, o.NFTablesMinSync = 0, 0
	if p := dur(c.NFTables.SyncPeriod, 0); p != o.IPTablesSyncPeriod {
		o.NFTablesSyncPeriod = p
	}
	if p := dur(c.NFTables.MinSyncPeriod, 0); p != o.IPTablesMinSync {
		o.NFTablesMinSync = p
	}
	if c.Mode == kubeProxyNFTables {
		// The nftables section's masquerade settings, where given, are
		// the ones the nftables mode uses.
		if c.NFTables.MasqueradeBit != nil {
			o.MasqueradeBit = *c.NFTables.MasqueradeBit
		}
		o.MasqueradeAll = o.MasqueradeAll || c.NFTables.MasqueradeAll
	}
	o.IPVSSyncPeriod = dur(c.IPVS.SyncPeriod, d.IPVSSyncPeriod)
	o.IPVSMinSync = dur(c.IPVS.MinSyncPeriod, d.IPVSMinSync)
	o.IPVSScheduler = c.IPVS.Scheduler
	o.IPVSExcludeCIDRs = slices.Clone(c.IPVS.ExcludeCIDRs)
	o.IPVSStrictARP = c.IPVS.StrictARP
	o.IPVSTCPTimeout = c.IPVS.TCPTimeout.Duration
	o.IPVSTCPFinTimeout = c.IPVS.TCPFinTimeout.Duration
	o.IPVSUDPTimeout = c.IPVS.UDPTimeout.Duration

	o.DetectLocalMode = string(c.DetectLocalMode)
	o.PodBridgeInterface = c.DetectLocal.BridgeInterface
	o.PodInterfacePrefix = c.DetectLocal.InterfaceNamePrefix
	o.ClusterCIDR = c.ClusterCIDR
	o.NodePortAddresses = slices.Clone(c.NodePortAddresses)
	o.OOMScoreAdj = d.OOMScoreAdj
	if c.OOMScoreAdj != nil {
		o.OOMScoreAdj = *c.OOMScoreAdj
	}
	o.Conntrack = nfconntrack.Settings{
		MaxPerCore: c.Conntrack.MaxPerCore,
		Min:        c.Conntrack.Min,
	}
	if t := c.Conntrack.TCPEstablishedTimeout; t != nil {
		o.Conntrack.TCPEstablished = &t.Duration
	}
	if t := c.Conntrack.TCPCloseWaitTimeout; t != nil {
		o.Conntrack.TCPCloseWait = &t.Duration
	}
	if c.Conntrack.TCPBeLiberal {
		o.Conntrack.TCPBeLiberal = &c.Conntrack.TCPBeLiberal
	}
	if t := c.Conntrack.UDPTimeout.Duration; t != 0 {
		o.Conntrack.UDPTimeout = &t
	}
	if t := c.Conntrack.UDPStreamTimeout.Duration; t != 0 {
		o.Conntrack.UDPStreamTimeout = &t
	}
	o.ConfigSyncPeriod = dur(c.ConfigSyncPeriod, d.ConfigSyncPeriod)
	return ignored
}

// toConfig is the configuration in effect as a KubeProxyConfiguration
// (--write-config-to); applyConfig of it gives the same options back.
func (o *Options) toConfig() *kubeproxy.KubeProxyConfiguration {
	c := &kubeproxy.KubeProxyConfiguration{}
	c.Kind, c.APIVersion = configKind, configAPIVersion
	if len(o.FeatureGates) > 0 {
		c.FeatureGates = map[string]bool{}
		for k := range o.FeatureGates {
			c.FeatureGates[k] = o.Gates[k]
		}
	}
	c.ClientConnection = componentbase.ClientConnectionConfiguration{
		Kubeconfig: o.Kubeconfig, ContentType: o.KubeAPIContentType, QPS: o.KubeAPIQPS, Burst: o.KubeAPIBurst,
	}
	c.Logging = logsapi.LoggingConfiguration{Format: o.LoggingFormat, Verbosity: logsapi.VerbosityLevel(o.Verbosity)}
	c.HostnameOverride = o.HostnameOverride
	c.BindAddress = o.BindAddress
	c.HealthzBindAddress = o.HealthzBindAddress
	c.MetricsBindAddress = o.MetricsBindAddress
	c.BindAddressHardFail = o.BindAddrHardFail
	c.EnableProfiling = o.Profiling
	c.ShowHiddenMetricsForVersion = o.ShowHiddenMetrics
	c.Mode = kubeproxy.ProxyMode(o.KubeProxyMode)
	bit, localhost := o.MasqueradeBit, o.LocalhostNodePorts
	c.IPTables = kubeproxy.KubeProxyIPTablesConfiguration{
		MasqueradeBit: &bit, MasqueradeAll: o.MasqueradeAll, LocalhostNodePorts: &localhost,
		SyncPeriod: v1.Duration{Duration: o.IPTablesSyncPeriod}, MinSyncPeriod: v1.Duration{Duration: o.IPTablesMinSync},
	}
	nftSync, nftMinSync := o.NFTablesPeriods()
	c.NFTables = kubeproxy.KubeProxyNFTablesConfiguration{
		MasqueradeBit: &bit, MasqueradeAll: o.MasqueradeAll,
		SyncPeriod: v1.Duration{Duration: nftSync}, MinSyncPeriod: v1.Duration{Duration: nftMinSync},
	}
	c.IPVS = kubeproxy.KubeProxyIPVSConfiguration{
		SyncPeriod: v1.Duration{Duration: o.IPVSSyncPeriod}, MinSyncPeriod: v1.Duration{Duration: o.IPVSMinSync},
		Scheduler: o.IPVSScheduler, ExcludeCIDRs: o.IPVSExcludeCIDRs, StrictARP: o.IPVSStrictARP,
		TCPTimeout: v1.Duration{Duration: o.IPVSTCPTimeout}, TCPFinTimeout: v1.Duration{Duration: o.IPVSTCPFinTimeout},
		UDPTimeout: v1.Duration{Duration: o.IPVSUDPTimeout},
	}
	c.DetectLocalMode = kubeproxy.LocalMode(o.DetectLocalMode)
	c.DetectLocal = kubeproxy.DetectLocalConfiguration{BridgeInterface: o.PodBridgeInterface, InterfaceNamePrefix: o.PodInterfacePrefix}
	c.ClusterCIDR = o.ClusterCIDR
	c.NodePortAddresses = o.NodePortAddresses
	oom := o.OOMScoreAdj
	c.OOMScoreAdj = &oom
	ct := o.Conntrack
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
	c.ConfigSyncPeriod = v1.Duration{Duration: o.ConfigSyncPeriod}
	return c
}

// WriteConfig writes the configuration in effect to path.
func (o *Options) WriteConfig(path string) error {
	b, err := yaml.Marshal(o.toConfig())
	if err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}

// FinishFlags reads --config, once fs has parsed the flags into o: as in
// kube-proxy, the file replaces the kube-proxy flags that were not given
// on the command line.
func FinishFlags(o *Options, fs *pflag.FlagSet) (notes []string, err error) {
	o.ProxyModeSetting = ProxyModeDefault
	if fs.Changed("proxy-mode") {
		o.ProxyModeSetting = ProxyModeFlag
	}
	if o.ConfigFile == "" {
		return nil, nil
	}
	c, warnings, err := readConfigFile(o.ConfigFile)
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
