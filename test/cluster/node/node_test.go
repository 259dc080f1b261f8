package node

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestContainerdRefImpliesDockerHub(t *testing.T) {
	for ref, want := range map[string]string{
		"ebpf-proxy:v1":                     "docker.io/library/ebpf-proxy:v1",
		"someone/tool:v2":                   "docker.io/someone/tool:v2",
		"registry.k8s.io/kube-proxy:v1.33":  "registry.k8s.io/kube-proxy:v1.33",
		"localhost/x:1":                     "localhost/x:1",
		"localhost:5000/x:1":                "localhost:5000/x:1",
		"docker.io/library/ebpf-proxy:next": "docker.io/library/ebpf-proxy:next",
	} {
		if got := containerdRef(ref); got != want {
			t.Errorf("containerdRef(%q) = %q, want %q", ref, got, want)
		}
	}
}

func TestUsageLineSumsCommandsAndSortsByCPU(t *testing.T) {
	meminfo := []byte("MemTotal:        4030000 kB\nMemFree:          100000 kB\nMemAvailable:     512000 kB\n")
	loadavg := []byte("3.10 2.50 1.20 5/300 4242\n")
	stat := func(pid int, comm string, utime, stime int) []byte {
		return fmt.Appendf(nil, "%d (%s) S 1 1 1 0 -1 4194560 100 0 0 0 %d %d 0 0 20 0 8 0 100 0 0", pid, comm, utime, stime)
	}
	stats := [][]byte{
		stat(10, "kube-apiserver", 9000, 3000),
		stat(11, "etcd", 2000, 1000),
		stat(12, "ebpf-proxy", 100, 40000), // the verifier's time is system time
		stat(13, "containerd-shim", 50, 50),
		stat(14, "containerd-shim", 50, 50),
		stat(15, "odd) name (x", 1, 0),
		[]byte("16 (truncated"),
	}
	got := usageLine(meminfo, loadavg, stats, 3)
	want := "guest: memory available 500 of 3935 MiB, load 3.10 2.50 1.20, CPU s: ebpf-proxy 401 kube-apiserver 120 etcd 30"
	if got != want {
		t.Errorf("usageLine:\n got %s\nwant %s", got, want)
	}
	if got := usageLine(meminfo, loadavg, stats, 10); !strings.Contains(got, "containerd-shim 2 odd) name (x 0") {
		t.Errorf("usageLine with every command: %s", got)
	}
}

// TestKubeletConfigClusterDNS checks the kubelet's DNS settings: absent
// unless asked for (the cluster test runs no DNS server), and a list of
// nameservers with the domain when asked (the conformance run's CoreDNS).
func TestKubeletConfigClusterDNS(t *testing.T) {
	var plain map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig("/run/c.sock", nil, "")), &plain); err != nil {
		t.Fatal(err)
	}
	if _, ok := plain["clusterDNS"]; ok {
		t.Errorf("clusterDNS set without being asked for: %v", plain)
	}
	if _, ok := plain["clusterDomain"]; ok {
		t.Errorf("clusterDomain set without being asked for: %v", plain)
	}
	if plain["containerRuntimeEndpoint"] != "unix:///run/c.sock" {
		t.Errorf("containerRuntimeEndpoint %v", plain["containerRuntimeEndpoint"])
	}
	var withDNS struct {
		ClusterDNS    []string `json:"clusterDNS"`
		ClusterDomain string   `json:"clusterDomain"`
		CgroupDriver  string   `json:"cgroupDriver"`
	}
	conf := kubeletConfig("/run/c.sock", []netip.Addr{netip.MustParseAddr("10.96.0.10")}, "cluster.local")
	if err := yaml.Unmarshal([]byte(conf), &withDNS); err != nil {
		t.Fatal(err)
	}
	if len(withDNS.ClusterDNS) != 1 || withDNS.ClusterDNS[0] != "10.96.0.10" || withDNS.ClusterDomain != "cluster.local" || withDNS.CgroupDriver != "cgroupfs" {
		t.Errorf("with DNS: %+v\n%s", withDNS, conf)
	}
}

func TestNthNumbersNodesAddressesAndPodRanges(t *testing.T) {
	for i, want := range map[int]Config{
		1: {Name: "node1", IP: DefaultIP, PodCIDR: DefaultPodCIDR},
		2: {Name: "node2", IP: netip.MustParsePrefix("192.168.50.11/24"), PodCIDR: "10.244.1.0/24"},
	} {
		got, err := Nth(i)
		if err != nil || got.Name != want.Name || got.IP != want.IP || got.PodCIDR != want.PodCIDR {
			t.Errorf("Nth(%d) = %+v, %v; want %+v", i, got, err, want)
		}
		if !netip.MustParsePrefix(ClusterCIDR).Contains(netip.MustParsePrefix(got.PodCIDR).Addr()) {
			t.Errorf("Nth(%d)'s pod range %s is outside the cluster's %s", i, got.PodCIDR, ClusterCIDR)
		}
	}
	for _, i := range []int{0, -1, 17} {
		if c, err := Nth(i); err == nil {
			t.Errorf("Nth(%d) = %+v, want an error", i, c)
		}
	}
}
