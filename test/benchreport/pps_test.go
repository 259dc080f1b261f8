package main

import "testing"

func TestPPSSentBy(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"goos: linux\nnodeport-pps: external client → node-a:30080/udp (NodePort) → pod on node-b; 2000000 64-byte frames of one flow per row " +
			"(sent by an AF_PACKET socket (kernel 6.18.44 refuses live frames: run program: operation not permitted), batch 64, limit 30s); 3 round(s)\nproxy ...",
			"an AF_PACKET socket (kernel 6.18.44 refuses live frames: run program: operation not permitted)"},
		{"nodeport-pps: x (sent by BPF_PROG_TEST_RUN live frames, batch 64, limit 30s)\n", "BPF_PROG_TEST_RUN live frames"},
		// An earlier table's header, before it named the frames' source.
		{"nodeport-pps: x (BPF_PROG_TEST_RUN live frames, batch 64, limit 30s)\n", ""},
		{"BenchmarkSync 1 2 ns/op\n", ""},
	} {
		if got := ppsSentBy(c.text); got != c.want {
			t.Errorf("ppsSentBy(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}
