package dump

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Output formats (-o).
const (
	OutputTable   = "table"
	OutputWide    = "wide"
	OutputJSON    = "json"
	OutputEntries = "entries"
)

// Options are dump's flags, parsed.
type Options struct {
	BPFFSPath string
	APISocket string
	Output    string
	// Service is namespace/name, empty for every Service.
	Service model.ServiceName
	// Address keeps the frontends on it or with a backend on it.
	Address netip.Addr
	// Protocol is 0 for every protocol.
	Protocol model.Protocol
}

// Flags are dump's flags as given, before ParseOptions.
type Flags struct {
	BPFFSPath, APISocket, Output, Service, Address, Protocol string
}

// ParseOptions checks the flags; its error says which is wrong and why.
func ParseOptions(f Flags) (Options, error) {
	o := Options{BPFFSPath: f.BPFFSPath, APISocket: f.APISocket, Output: f.Output}
	switch f.Output {
	case OutputTable, OutputWide, OutputJSON, OutputEntries:
	default:
		return o, fmt.Errorf("-o %q: want table, wide, json or entries", f.Output)
	}
	if f.Service != "" {
		ns, name, ok := strings.Cut(f.Service, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return o, fmt.Errorf("--service %q: want namespace/name", f.Service)
		}
		o.Service = model.ServiceName{Namespace: ns, Name: name}
	}
	if f.Address != "" {
		a, err := netip.ParseAddr(f.Address)
		if err != nil {
			return o, fmt.Errorf("--address %q: not an IP address", f.Address)
		}
		o.Address = a.Unmap()
	}
	if f.Protocol != "" {
		p, err := model.ParseProtocol(strings.ToUpper(f.Protocol))
		if err != nil {
			return o, fmt.Errorf("--protocol %q: want tcp, udp or sctp", f.Protocol)
		}
		o.Protocol = p
	}
	if f.Output == OutputEntries && (f.Service != "" || f.Address != "" || f.Protocol != "") {
		return o, fmt.Errorf("--service, --address and --protocol do not apply to -o entries")
	}
	return o, nil
}

// Filter keeps the Services and frontends o selects: the Service named,
// the protocol, the frontends on the address or with a backend on it.
func Filter(r Report, o Options) Report {
	out := r
	out.Services = []Service{}
	for _, s := range r.Services {
		if o.Service.Name != "" && (s.Namespace != o.Service.Namespace || s.Name != o.Service.Name) {
			continue
		}
		if o.Protocol != 0 && s.Protocol != o.Protocol.String() {
			continue
		}
		if o.Address.IsValid() {
			var fes []Frontend
			for _, f := range s.Frontends {
				if f.Address == o.Address || hasBackend(f, o.Address) {
					fes = append(fes, f)
				}
			}
			if len(fes) == 0 {
				continue
			}
			s.Frontends = fes
		}
		out.Services = append(out.Services, s)
	}
	return out
}

func hasBackend(f Frontend, a netip.Addr) bool {
	for _, b := range f.Backends {
		if b.Address == a {
			return true
		}
	}
	return false
}

// WriteJSON writes r as Report's schema, indented.
func WriteJSON(w io.Writer, r Report) error { return writeJSON(w, r) }

func writeJSON(w io.Writer, r any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes one line per frontend in aligned columns: the
// Service (namespace/name, or svc=ID when the agent did not name it), its
// port name, the frontend, its kind, the backend count (with the verdict
// when not forwarding) and the backends with their states. wide adds the
// maps' ids, the traffic policy, the affinity and the entry's flags, and
// each backend's id.
func WriteTable(w io.Writer, r Report, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "SERVICE\tPORT\tFRONTEND\tKIND\tBACKENDS\tADDRESSES"
	if wide {
		head = "SERVICE\tPORT\tFRONTEND\tKIND\tSVC-ID\tREVNAT-ID\tPOLICY\tAFFINITY\tFLAGS\tBACKENDS\tADDRESSES"
	}
	fmt.Fprintln(tw, head)
	for _, s := range r.Services {
		for _, f := range s.Frontends {
			name, port := s.Namespace+"/"+s.Name, s.Port
			if !s.Named() {
				name = "svc=" + strconv.FormatUint(uint64(f.ServiceID), 10)
			}
			if port == "" {
				port = "-"
			}
			kind := f.Kind
			if f.Scope == ScopeInternal {
				kind += "/internal"
			}
			count := strconv.Itoa(len(f.Backends))
			if f.Verdict != VerdictForward {
				count += " (" + f.Verdict + ")"
			}
			cols := []string{name, port, netip.AddrPortFrom(f.Address, f.Port).String() + "/" + s.Protocol, kind}
			if wide {
				policy, affinity := f.TrafficPolicy, "-"
				if policy == "" {
					policy = "-"
				}
				if f.AffinityTimeoutSeconds != 0 {
					affinity = strconv.Itoa(f.AffinityTimeoutSeconds) + "s"
				}
				cols = append(cols, strconv.FormatUint(uint64(f.ServiceID), 10), strconv.FormatUint(uint64(f.RevNatID), 10),
					policy, affinity, f.Flags)
			}
			cols = append(cols, count, backendList(f.Backends, wide))
			fmt.Fprintln(tw, strings.Join(cols, "\t"))
		}
	}
	return tw.Flush()
}

// backendList is "10.244.1.3:8080 ready local, 10.244.2.3:8080
// terminating", or "-" for none.
func backendList(bs []Backend, wide bool) string {
	if len(bs) == 0 {
		return "-"
	}
	parts := make([]string, len(bs))
	for i, b := range bs {
		var s string
		if wide {
			s = "#" + strconv.FormatUint(uint64(b.ID), 10) + " "
		}
		if b.Missing {
			parts[i] = s + "missing"
			continue
		}
		s += netip.AddrPortFrom(b.Address, b.Port).String() + " " + b.State
		if b.Local {
			s += " local"
		}
		parts[i] = s
	}
	return strings.Join(parts, ", ")
}
