package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPodsSection: the pod paths with their ratio to TC's baseline where
// the baseline run timed them, and the four ways of BenchmarkPodConnectRate
// with their ratios to direct, each with its run's date.
func TestPodsSection(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"paths.txt": "BenchmarkPaths/tc/miss-2 200 100 ns/op 61.0 ns/pkt\n" +
			"BenchmarkPaths/pod/not_to_a_Service-2 200 398 ns/op 182.0 ns/pkt\n" +
			"BenchmarkPaths/pod_egress/reply_from_the_backend-2 200 3924 ns/op 417.0 ns/pkt 63.15 overhead-ns\n",
		"baseline.txt": "BenchmarkPathsVsBaseline/tc/pod/not_to_a_Service-2 200 50571 ns/op 67.81 baseline-ns/pkt 194.2 path-ns/pkt 2.864 path/baseline\n",
		"pods.txt": "BenchmarkPodConnectRate-2 1 15206353461 ns/op 2908 direct_conn/s 0.9268 packet/direct 2564 packet_conn/s " +
			"1.035 packet_direct/direct 2960 packet_direct_conn/s 1.022 socket/direct 2768 socket_conn/s\n",
		"pods.meta":  "date 2026-12-07T19:56Z\n",
		"paths.meta": "date 2026-12-07T19:58Z\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	writePods(&md, d)
	got := md.String()
	for _, want := range []string{
		"## Pods translated per packet",
		"| pod/not to a Service | 182 | 2.86 |",
		"| pod egress/reply from the backend | 417 | - |",
		"| direct: to the pod's own address, from a pod no program sees (the baseline) | 2908 | 1 |",
		"| socket: to the ClusterIP, translated at connect() (--socket-lb-scope=all) | 2768 | 1.022 |",
		"| 2564 | 0.927 |",
		"| 2960 | 1.035 |",
		"2026-12-07T19:56Z",
		"2026-12-07T19:58Z",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the section lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "tc/miss") {
		t.Errorf("the section lists a path that is not a pod's:\n%s", got)
	}
	var none strings.Builder
	writePods(&none, &data{})
	if none.Len() != 0 {
		t.Errorf("without the runs, the section is %q, want none", none.String())
	}
}
