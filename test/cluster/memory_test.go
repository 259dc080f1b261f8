package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// memoryRoom is the part of its memory limit the agent's container may use
// at its peak: what is left is for a cluster larger than the test's.
const memoryRoom = 0.8

// podMemory is the memory of the agent's pod as its cgroup counts
// it, which is what the container's limit applies to (the pod has one
// container), in bytes.
type podMemory struct {
	current, peak uint64
	// anon is the processes' own memory; kernel is the kernel's memory
	// charged to the cgroup, the BPF maps the agent made among it.
	anon, kernel uint64
	// limit is the container's memory limit, 0 if it has none.
	// restarts is how often the container restarted.
	limit    uint64
	restarts int32
}

func (m podMemory) String() string {
	mib := func(n uint64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }
	return fmt.Sprintf("current %s MiB, peak %s MiB (anonymous %s MiB, kernel %s MiB), limit %s MiB, %d restarts",
		mib(m.current), mib(m.peak), mib(m.anon), mib(m.kernel), mib(m.limit), m.restarts)
}

// agentPod returns the agent's one pod, whose one container has started.
func (e *env) agentPod() corev1.Pod {
	e.t.Helper()
	pods, err := e.n.Clientset().CoreV1().Pods("kube-system").List(e.ctx, metav1.ListOptions{
		LabelSelector: "k8s-app=ebpf-proxy", FieldSelector: "spec.nodeName=" + e.n.Name})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		e.fatalf("want one agent pod with one container on %s: %v", e.n.Name, err)
	}
	return pods.Items[0]
}

// agentMemory reads the memory of the agent's pod from its cgroup (the
// test runs on the node, as root): the pod's, the parent of its
// container's, which keeps the charge of the maps a container made after
// that container is gone (a restart, a liveness probe's kill).
func (e *env) agentMemory() (podMemory, error) {
	var m podMemory
	pod := e.agentPod()
	if l, ok := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; ok {
		m.limit = uint64(l.Value())
	}
	m.restarts = pod.Status.ContainerStatuses[0].RestartCount
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := e.n.Ctr(e.ctx, "tasks", "ls")
	if err != nil {
		return m, err
	}
	pid := ""
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid = f[1]
		}
	}
	if pid == "" {
		return m, fmt.Errorf("no task of container %s in:\n%s", id, out)
	}
	cg, err := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	if err != nil {
		return m, err
	}
	path, ok := strings.CutPrefix(strings.TrimSpace(string(cg)), "0::")
	if !ok {
		return m, fmt.Errorf("not a cgroup v2 membership: %q", cg)
	}
	dir := filepath.Dir(filepath.Join("/sys/fs/cgroup", path))
	for name, dst := range map[string]*uint64{"memory.current": &m.current, "memory.peak": &m.peak} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return m, err
		}
		if *dst, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return m, fmt.Errorf("%s/%s: %w", dir, name, err)
		}
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return m, err
	}
	for line := range strings.SplitSeq(string(stat), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "anon":
			m.anon = n
		case "kernel":
			m.kernel = n
		}
	}
	return m, nil
}

// memoryWithinLimit returns the check that the agent's container on this
// node has a memory limit and has used at most memoryRoom of it; which
// names the agent in the cluster-memory: line it prints.
func (e *env) memoryWithinLimit(which string) func() error {
	return func() error { return e.agentMemoryWithinLimit(which) }
}

func (e *env) agentMemoryWithinLimit(which string) error {
	m, err := e.agentMemory()
	if err != nil {
		return err
	}
	// The figure docs/INSTALL.md's Resources quotes.
	fmt.Printf("cluster-memory: %s agent pod %s\n", which, m)
	if m.limit == 0 {
		return fmt.Errorf("the agent's container has no memory limit (%s)", m)
	}
	if float64(m.peak) > memoryRoom*float64(m.limit) {
		return fmt.Errorf("the agent's container peaked at more than %.0f%% of its limit: %s", memoryRoom*100, m)
	}
	return nil
}

// notRestarted checks that the agent's container has not restarted: its
// probes ask the agent itself, also while kube-proxy still holds the
// health check port.
func (e *env) notRestarted() error {
	pods, err := e.n.Clientset().CoreV1().Pods("kube-system").List(e.ctx, metav1.ListOptions{LabelSelector: "k8s-app=ebpf-proxy"})
	if err != nil {
		return err
	}
	if len(pods.Items) != len(e.nodes) {
		return fmt.Errorf("%d agent pods, want one on each of the %d nodes", len(pods.Items), len(e.nodes))
	}
	for _, pod := range pods.Items {
		for _, st := range pod.Status.ContainerStatuses {
			if st.RestartCount != 0 {
				return fmt.Errorf("the agent's container on %s restarted %d times (last state %+v)", pod.Spec.NodeName, st.RestartCount, st.LastTerminationState)
			}
		}
	}
	return nil
}
