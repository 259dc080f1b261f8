package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Versions of the control-plane binaries. They must equal the versions pinned
// in test/e2e/tools/go.mod, from which build-binaries.sh builds them; a test
// in this package checks that they do.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.0"
)

// BuildCommand builds the binaries into the cache; error messages name it.
const BuildCommand = "make k8s-binaries (runs test/e2e/build-binaries.sh, about 8 minutes on 2 cores the first time)"

// ErrBinariesMissing is returned by FindBinaries and Start when the cache does
// not hold a completed build of the pinned versions.
var ErrBinariesMissing = errors.New("control-plane binaries are not built")

// Binaries holds the absolute paths of the control-plane binaries.
type Binaries struct {
	Etcd          string
	KubeAPIServer string
	KubeProxy     string
	Kubectl       string
}

// CacheDir is the directory build-binaries.sh builds into: $EBPF_PROXY_CACHE,
// or /var/cache/ebpf-proxy when that is unset.
func CacheDir() string {
	if d := os.Getenv("EBPF_PROXY_CACHE"); d != "" {
		return d
	}
	return "/var/cache/ebpf-proxy"
}

// FindBinaries returns the cached binaries of the pinned versions. It returns
// an error wrapping ErrBinariesMissing, naming BuildCommand, when a build is
// absent or was interrupted (build-binaries.sh writes its .complete marker
// only after every binary of a version is in place).
func FindBinaries() (Binaries, error) {
	etcdDir := filepath.Join(CacheDir(), "etcd", EtcdVersion)
	k8sDir := filepath.Join(CacheDir(), "k8s", KubernetesVersion)
	b := Binaries{
		Etcd:          filepath.Join(etcdDir, "etcd"),
		KubeAPIServer: filepath.Join(k8sDir, "kube-apiserver"),
		KubeProxy:     filepath.Join(k8sDir, "kube-proxy"),
		Kubectl:       filepath.Join(k8sDir, "kubectl"),
	}
	for _, dir := range []string{etcdDir, k8sDir} {
		if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
			return Binaries{}, fmt.Errorf("%w: no completed build in %s: run %s", ErrBinariesMissing, dir, BuildCommand)
		}
	}
	for _, p := range []string{b.Etcd, b.KubeAPIServer, b.KubeProxy, b.Kubectl} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode()&0o111 == 0 {
			return Binaries{}, fmt.Errorf("%w: %s is missing or not executable: run %s", ErrBinariesMissing, p, BuildCommand)
		}
	}
	return b, nil
}

// NodeBinaries holds the absolute paths of what a real node runs besides the
// control plane of Binaries: the kubelet, and the controller-manager and
// scheduler that pods need (service-account CA ConfigMaps, DaemonSet and
// Deployment controllers, EndpointSlices, binding).
type NodeBinaries struct {
	Kubelet               string
	KubeControllerManager string
	KubeScheduler         string
}

// NodeBuildCommand builds NodeBinaries into the cache.
const NodeBuildCommand = "make node-binaries (runs test/e2e/build-binaries.sh node)"

// FindNodeBinaries returns the cached node binaries of the pinned version,
// or an error wrapping ErrBinariesMissing that names NodeBuildCommand.
func FindNodeBinaries() (NodeBinaries, error) {
	dir := filepath.Join(CacheDir(), "k8s-node", KubernetesVersion)
	b := NodeBinaries{
		Kubelet:               filepath.Join(dir, "kubelet"),
		KubeControllerManager: filepath.Join(dir, "kube-controller-manager"),
		KubeScheduler:         filepath.Join(dir, "kube-scheduler"),
	}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		return NodeBinaries{}, fmt.Errorf("%w: no completed build in %s: run %s", ErrBinariesMissing, dir, NodeBuildCommand)
	}
	for _, p := range []string{b.Kubelet, b.KubeControllerManager, b.KubeScheduler} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode()&0o111 == 0 {
			return NodeBinaries{}, fmt.Errorf("%w: %s is missing or not executable: run %s", ErrBinariesMissing, p, NodeBuildCommand)
		}
	}
	return b, nil
}
