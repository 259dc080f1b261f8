package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes r as the documented schema (Result), indented.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r for a reader: the answer first (client, frontend,
// verdict, backends, choice, source NAT, flows), then the steps in the
// programs' order.
func WriteTable(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("CLIENT", describeClient(r.Client))
	path := "socket hooks (connect/sendmsg)"
	if r.Path == PathTC {
		path = "TC/XDP at the device"
	}
	row("DESTINATION", fmt.Sprintf("%s/%s (%s, %s)", r.Destination, r.Protocol, r.IPFamily, path))
	if f := r.Frontend; f != nil {
		s := fmt.Sprintf("%s %s", f.Service, f.Kind)
		if f.Scope == "internal" {
			s += " (internal entry)"
		}
		if f.TrafficPolicy != "" {
			s += ", policy " + f.TrafficPolicy
		}
		if f.AffinityTimeoutSeconds != 0 {
			s += fmt.Sprintf(", affinity %ds", f.AffinityTimeoutSeconds)
		}
		row("FRONTEND", s)
	} else {
		row("FRONTEND", "-")
	}
	row("VERDICT", fmt.Sprintf("%s (%s): %s", r.Verdict, r.Rule, r.Outcome))
	if len(r.Candidates) > 0 {
		var bs []string
		for _, b := range r.Candidates {
			s := describeBackend(b)
			if b.SNAT.IsValid() {
				s += " snat " + b.SNAT.String()
			}
			bs = append(bs, s)
		}
		row("BACKENDS", strings.Join(bs, "; "))
	}
	if s := r.Selection; s != nil {
		v := s.Method
		if s.Backend != nil {
			v += " -> " + s.Backend.AddrPort().String()
		}
		if s.AffinityAgeSeconds != nil {
			v += fmt.Sprintf(", affinity entry %.1fs old (timeout %ds)", *s.AffinityAgeSeconds, s.AffinityTimeoutSeconds)
		}
		if s.MaglevIndex != nil {
			v += fmt.Sprintf(", Maglev index %d of %d", *s.MaglevIndex, s.MaglevTableSize)
		}
		if s.Note != "" {
			v += " (" + s.Note + ")"
		}
		row("CHOICE", v)
	}
	switch {
	case r.SNAT != nil:
		v := r.SNAT.Address.String()
		if r.SNAT.Port != 0 {
			v += ":" + strconv.Itoa(int(r.SNAT.Port))
		}
		if r.SNAT.Device != "" {
			v += " (" + r.SNAT.Device + ")"
		}
		row("SNAT", v)
	case r.Verdict == VerdictForward:
		row("SNAT", "none")
	}
	for _, f := range r.Flows {
		v := fmt.Sprintf("%s -> %s", f.Client, f.Backend)
		if f.SNAT.IsValid() {
			v += " snat " + f.SNAT.String()
		}
		v += fmt.Sprintf(" flags %s, expires in %ds", f.Flags, f.ExpiresInSeconds)
		if f.Holds {
			v += ", holds"
		} else {
			v += ", does not hold"
		}
		row("FLOW", v)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "STEPS")
	for i, s := range r.Steps {
		fmt.Fprintf(w, "  %d. %s: %s\n", i+1, s.Check, s.Result)
	}
	return nil
}

func describeClient(c ClientInfo) string {
	var s string
	switch c.Kind {
	case ClientExternal:
		s = "external " + c.Address.String()
	case ClientNode:
		s = "the node"
	default:
		s = "pod"
		if c.Address.IsValid() {
			s += " " + c.Address.String()
		}
	}
	if c.Port != 0 {
		s += " port " + strconv.Itoa(int(c.Port))
	}
	if c.NetnsCookie != 0 {
		s += " (netns " + strconv.FormatUint(c.NetnsCookie, 10) + ")"
	}
	if c.Device != "" {
		s += " on " + c.Device
	}
	return s
}
