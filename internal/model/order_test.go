package model_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

func portName(ns, name, port string, proto model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

func TestServicePortOrder(t *testing.T) {
	// In the order every dataplane programs them.
	want := []model.ServicePortName{
		portName("default", "web", "", model.TCP),
		portName("default", "web", "http", model.TCP),
		portName("default", "web", "https", model.TCP),
		portName("default", "web2", "", model.TCP),
		// Protocols by number, as in the IP header: TCP, UDP, SCTP.
		portName("kube-system", "dns", "dns", model.TCP),
		portName("kube-system", "dns", "dns", model.UDP),
		portName("kube-system", "dns", "dns", model.SCTP),
		portName("kube-system", "dns-tcp", "", model.TCP),
	}
	for i := range want {
		for j := range want {
			if got, exp := want[i].Compare(want[j]), cmp.Compare(i, j); got != exp {
				t.Errorf("%s.Compare(%s) = %d, want %d", want[i], want[j], got, exp)
			}
		}
	}
	m := map[model.ServicePortName]int{}
	for i, n := range slices.Backward(want) {
		m[n] = i
	}
	if got := model.SortedNames(m); !slices.Equal(got, want) {
		t.Errorf("SortedNames = %v, want %v", got, want)
	}
	if got := model.SortedNames(model.ChangeSet{}); len(got) != 0 {
		t.Errorf("SortedNames of an empty set = %v", got)
	}
}
