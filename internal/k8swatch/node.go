package k8swatch

import (
	"fmt"
	"os"
	"strings"
)

// NodeName is the name of the node the agent runs on: --hostname-override,
// else the host name, lowercased as the Node object's.
func NodeName(override string) (string, error) {
	if override != "" {
		return strings.ToLower(strings.TrimSpace(override)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

// InvalidReason keeps the invalid-objects metric's label set small: the first words of a
// reason, which the translator words as a fixed prefix followed by detail.
func InvalidReason(reason string) string {
	const max = 40
	for i, r := range reason {
		if r == ':' || i >= max {
			return reason[:i]
		}
	}
	return reason
}
