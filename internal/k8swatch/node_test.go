package k8swatch

import (
	"strings"
	"testing"
)

func TestInvalidReasonKeepsTheCause(t *testing.T) {
	if got := InvalidReason("invalid externalIP: \"1.2.3\" is not an IP"); got != "invalid externalIP" {
		t.Errorf("got %q", got)
	}
	if got := InvalidReason(strings.Repeat("x", 100)); len(got) > 40 {
		t.Errorf("unbounded label %q", got)
	}
}
