package model

import (
	"cmp"
	"slices"
	"strings"
)

// Compare orders ServicePortNames by namespace, name, port name and then
// protocol number (TCP, UDP, SCTP). Every dataplane programs ServicePorts
// in this order, so that the ids they hand out, the order of their rules
// and their golden files never depend on the order of a Go map.
func (n ServicePortName) Compare(o ServicePortName) int {
	if c := strings.Compare(n.Namespace, o.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(n.Name, o.Name); c != 0 {
		return c
	}
	if c := strings.Compare(n.Port, o.Port); c != 0 {
		return c
	}
	return cmp.Compare(n.Protocol, o.Protocol)
}

// SortedNames returns the ServicePortNames that key m (a State's Services,
// a ChangeSet, a dataplane's record of what it applied) in Compare order.
func SortedNames[V any](m map[ServicePortName]V) []ServicePortName {
	names := make([]ServicePortName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, ServicePortName.Compare)
	return names
}
