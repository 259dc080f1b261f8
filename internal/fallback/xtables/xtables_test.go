package xtables

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestRuleTextSurvivesTheRoundTripThroughWords(t *testing.T) {
	tests := []struct {
		name  string
		words []string
		text  string
	}{
		{"plain words", []string{"-p", "tcp", "-j", "ACCEPT"}, "-p tcp -j ACCEPT"},
		{"comment with spaces is quoted as iptables-save does", []string{"-m", "comment", "--comment", "default/web:http cluster IP", "-j", "X"},
			`-m comment --comment "default/web:http cluster IP" -j X`},
		{"comment without spaces stays bare", []string{"--comment", "default/web:http/TCP"}, "--comment default/web:http/TCP"},
		{"quotes inside a word are escaped", []string{"--comment", `say "hi"`}, `--comment "say \"hi\""`},
		{"empty word is kept", []string{"--comment", ""}, `--comment ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Rule(tt.words...); got != tt.text {
				t.Errorf("Rule(%q) = %q, want %q", tt.words, got, tt.text)
			}
			if got := Words(tt.text); !slices.Equal(got, tt.words) {
				t.Errorf("Words(%q) = %q, want %q", tt.text, got, tt.words)
			}
		})
	}
}

func TestTargetFindsJumpAndGoto(t *testing.T) {
	tests := []struct{ spec, want string }{
		{`-m comment --comment "x -j Y" -j EBPFPROXY-SERVICES`, "EBPFPROXY-SERVICES"},
		{"-s 10.0.0.0/8 -g EBPFPROXY-SVC-A", "EBPFPROXY-SVC-A"},
		{"-p tcp -j DNAT --to-destination 10.0.0.1:80", "DNAT"},
		{"-p tcp", ""},
	}
	for _, tt := range tests {
		if got := Target(tt.spec); got != tt.want {
			t.Errorf("Target(%q) = %q, want %q", tt.spec, got, tt.want)
		}
	}
}

func TestTransactionOrdersDeclarationsRulesAndDeletions(t *testing.T) {
	var tx Transaction
	nat := tx.Table("nat")
	nat.Append("A", "-j B")
	nat.Chain("A")
	nat.DeleteChain("OLD")
	nat.Chain("OLD")
	nat.Delete("A", "-j OLD")
	nat.Insert("A", "-j C")
	tx.Table("filter") // untouched: left out
	want := "*nat\n:A - [0:0]\n:OLD - [0:0]\n-A A -j B\n-D A -j OLD\n-I A 1 -j C\n-X OLD\nCOMMIT\n"
	if got := string(tx.Bytes()); got != want {
		t.Errorf("transaction:\n%s\nwant:\n%s", got, want)
	}
	if got := tx.Rules("nat"); got != 2 {
		t.Errorf("Rules(nat) = %d, want 2 (appends and inserts)", got)
	}
	if tx.Empty() {
		t.Errorf("Empty() = true for a transaction with changes")
	}
	var empty Transaction
	empty.Table("nat")
	if !empty.Empty() || len(empty.Bytes()) != 0 {
		t.Errorf("a transaction without changes renders %q", empty.Bytes())
	}
}

func TestDetectRejectsUnknownBackends(t *testing.T) {
	_, err := Detect(context.Background(), "", "ebtables")
	if err == nil || errors.Is(err, ErrNoBackend) {
		t.Errorf("Detect(ebtables) = %v, want a configuration error", err)
	}
}
