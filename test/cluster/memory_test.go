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

// containerMemory is the memory of a container as its cgroup counts it,
// which is what its limit applies to, in bytes.
type containerMemory struct {
	current, peak uint64
	// anon is the processes' own memory; kernel is the kernel's memory
	// charged to the cgroup, the BPF maps the agent made among it.
	anon, kernel uint64
	// limit is the container's memory limit, 0 if it has none.
	limit uint64
}

func (m containerMemory) String() string {
	mib := func(n uint64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }
	return fmt.Sprintf("current %s MiB, peak %s MiB (anonymous %s MiB, kernel %s MiB), limit %s MiB",
		mib(m.current), mib(m.peak), mib(m.anon), mib(m.kernel), mib(m.limit))
}

// agentPod returns the agent's one pod, whose one container has started.
func (e *env) agentPod() corev1.Pod {
	e.t.Helper()
	pods, err := e.n.Clientset().CoreV1().Pods("kube-system").List(e.ctx, metav1.ListOptions{LabelSelector: "k8s-app=ebpf-proxy"})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		e.fatalf("want one agent pod with one container: %v", err)
	}
	return pods.Items[0]
}

// agentMemory reads the memory of the agent's container from its cgroup
// (the test runs on the node, as root).
func (e *env) agentMemory() (containerMemory, error) {
	var m containerMemory
	pod := e.agentPod()
	if l, ok := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; ok {
		m.limit = uint64(l.Value())
	}
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
	dir := filepath.Join("/sys/fs/cgroup", path)
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

// memoryWithinLimit checks that the agent's container has a memory limit
// and has used at most memoryRoom of it.
func (e *env) memoryWithinLimit() error {
	m, err := e.agentMemory()
	if err != nil {
		return err
	}
	e.t.Logf("agent memory: %s", m)
	e.agentPeak = m.peak
	if m.limit == 0 {
		return fmt.Errorf("the agent's container has no memory limit (%s)", m)
	}
	if float64(m.peak) > memoryRoom*float64(m.limit) {
		return fmt.Errorf("the agent's container peaked at more than %.0f%% of its limit: %s", memoryRoom*100, m)
	}
	return nil
}
