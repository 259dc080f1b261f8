// Package ebpfproxy holds only the code generation of the BPF objects and
// their Go bindings (internal/bpfobj). Run `make generate`; it sets the
// compiler and its flags.
package ebpfproxy

//go:generate go tool bpf2go -go-package bpfobj -output-dir internal/bpfobj -target bpfel -type lb4_key -type lb4_service -type lb4_backend -type lb4_reverse_nat -type sock4_revnat_key -type sock4_revnat -type lb4_affinity_key -type lb4_affinity -type lb4_member_key -type sock4_udp_key -type sock4_udp -type lb6_key -type lb6_backend -type lb6_reverse_nat -type sock6_revnat_key -type sock6_revnat -type lb6_affinity_key -type lb6_src_range_key -type sock6_udp_key -type lb_metric Sock bpf/sock.c
//go:generate go tool bpf2go -go-package sample -output-dir internal/testing/pktest/sample -target bpfel -type nat_key -type nat_val -type event Sample bpf/test/pktest_sample.c
//go:generate go tool bpf2go -go-package bpfobj -output-dir internal/bpfobj -target bpfel -type ct4_key -type ct4_entry -type tc4_snat_addr -type ct6_key -type ct6_entry -type tc6_snat_addr -type nh4_key -type nh6_key -type nh_entry -type nh4_slot -type nh6_slot -type lb_metric Tc bpf/tc.c
//go:generate go tool bpf2go -go-package bpfobj -output-dir internal/bpfobj -target bpfel -type lb_metric Xdp bpf/xdp.c
