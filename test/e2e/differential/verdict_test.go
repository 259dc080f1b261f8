package differential

import (
	"testing"
)

// The scenario table is checked before anything runs; a broken table
// must not cost a whole run.
func TestScenarioTableIsWellFormed(t *testing.T) {
	if err := check(scenarios); err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name string
		sc   []Scenario
	}{
		{"two scenarios with one name", []Scenario{{Name: "x", Steps: []Step{{Probes: probe(tcp, clientA, cip("web", 80))}}},
			{Name: "x", Steps: []Step{{Probes: probe(tcp, clientA, cip("web", 80))}}}}},
		{"a step that probes nothing", []Scenario{{Name: "x", Steps: []Step{{Name: "silent"}}}}},
		{"an unknown client", []Scenario{{Name: "x", Steps: []Step{{Probes: probe(tcp, "node-c", cip("web", 80))}}}}},
		{"no steps", []Scenario{{Name: "x"}}},
	}
	for _, tt := range bad {
		if err := check(tt.sc); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
}

func TestFailuresAreNamedByErrno(t *testing.T) {
	tests := []struct{ errno, want string }{
		{"ECONNREFUSED", "REJECT"},
		{"ETIMEDOUT", "DROP"},
		{"EHOSTUNREACH", "UNREACHABLE"},
		{"ENETUNREACH", "UNREACHABLE"},
		{"EACCES", "UNREACHABLE"},
		{"ECONNRESET", "RESET"},
		{"EPERM", "ERROR EPERM"},
	}
	for _, tt := range tests {
		if got := failure(tt.errno); got != tt.want {
			t.Errorf("failure(%s) = %q, want %q", tt.errno, got, tt.want)
		}
	}
}

func TestVerdictsDoNotDependOnCounts(t *testing.T) {
	tests := []struct {
		name   string
		tally  tally
		sticky bool
		want   string
	}{
		{"endpoints sorted, counts dropped",
			tally{reached: map[string]int{"b1:8080 sees client": 30, "a1:8080 sees client": 18}, servers: map[string]int{"a1:8080": 18, "b1:8080": 30}},
			false, "{a1:8080 sees client, b1:8080 sees client}"},
		{"a refusal", tally{failures: map[string]int{"REJECT": 3}}, false, "REJECT"},
		{"answers and drops both show",
			tally{reached: map[string]int{"a1:8080 sees client": 1}, servers: map[string]int{"a1:8080": 1}, failures: map[string]int{"DROP": 2}},
			false, "{a1:8080 sees client} + DROP"},
		{"one endpoint for a sticky probe",
			tally{reached: map[string]int{"b2:8080 sees client": 48}, servers: map[string]int{"b2:8080": 48}}, true, "STICKY to one endpoint"},
		{"two endpoints for a sticky probe are listed",
			tally{reached: map[string]int{"a1:8080 sees client": 40, "b2:8080 sees client": 8}, servers: map[string]int{"a1:8080": 40, "b2:8080": 8}},
			true, "{a1:8080 sees client, b2:8080 sees client}"},
		{"a wrong peer address is noted",
			tally{reached: map[string]int{"a1:8080 sees client": 3}, servers: map[string]int{"a1:8080": 3}, notes: map[string]int{"getpeername 10.244.1.10:8080": 3}},
			false, "{a1:8080 sees client} + [getpeername 10.244.1.10:8080]"},
		{"health check status", tally{http: map[string]int{"HTTP 503": 3}}, false, "HTTP 503"},
		{"nothing at all", tally{}, false, "NO RESULT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.tally.verdict(tt.sticky); got != tt.want {
				t.Errorf("verdict = %q, want %q", got, tt.want)
			}
		})
	}
}

// A scenario where ebpf-proxy keeps the client's address reads upstream's
// masqueraded verdicts with node addresses as the client's, and nothing else.
func TestUnmasqueradedReadsOnlyNodeAddressesAsTheClient(t *testing.T) {
	tests := []struct{ in, want string }{
		{"{a1:8080 sees node-a/br0}", "{a1:8080 sees client}"},
		{"{a1:8080 sees node-a/br0, b1:8080 sees node-a}", "{a1:8080 sees client, b1:8080 sees client}"},
		{"{b1:8080 sees node-b} + DROP", "{b1:8080 sees client} + DROP"},
		{"{a1:8080 sees ext}", "{a1:8080 sees ext}"},
		{"{a1:8080 sees a2}", "{a1:8080 sees a2}"},
		{"{a1:8080 sees node-ab}", "{a1:8080 sees node-ab}"},
		{"REJECT", "REJECT"},
	}
	for _, tt := range tests {
		if got := unmasqueraded(tt.in); got != tt.want {
			t.Errorf("unmasqueraded(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// Only a node's bridge address, upstream's masquerade to a local endpoint,
// reads as the client's for traffic delivered on the receiving node.
func TestLocalUnmasqueradedReadsOnlyBridgeAddresses(t *testing.T) {
	tests := []struct{ in, want string }{
		{"{a1:8080 sees node-a/br0, b1:8080 sees node-a}", "{a1:8080 sees client, b1:8080 sees node-a}"},
		{"{a1:8080 sees node-b, b1:8080 sees node-b/br0}", "{a1:8080 sees node-b, b1:8080 sees client}"},
		{"{a1:8080 sees ext}", "{a1:8080 sees ext}"},
	}
	for _, tt := range tests {
		if got := localUnmasqueraded(tt.in); got != tt.want {
			t.Errorf("localUnmasqueraded(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
