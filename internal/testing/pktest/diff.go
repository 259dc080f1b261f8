package pktest

import (
	"bytes"
	"fmt"
	"strings"
)

// Diff describes how frame got differs from frame want, one line per
// decoded field that differs ("ipv4.dst: got 10.0.0.1 want 10.0.0.2",
// "udp.checksum: got 0x1c47 (bad, want 0x1c46) want 0x1c46 (ok)"), then the
// lengths and the first differing byte with the field it belongs to, so
// that differences in long payloads show too. It returns "" for equal
// frames.
func Diff(got, want []byte) string {
	if bytes.Equal(got, want) {
		return ""
	}
	g, w := Decode(got), Decode(want)
	gv, gorder := fieldValues(g.Fields)
	wv, worder := fieldValues(w.Fields)
	var lines []string
	seen := map[string]bool{}
	for _, k := range append(worder, gorder...) {
		if seen[k] {
			continue
		}
		seen[k] = true
		gval, gok := gv[k]
		wval, wok := wv[k]
		switch {
		case gok && wok && gval == wval:
		case !gok:
			lines = append(lines, fmt.Sprintf("%s: got (absent) want %s", k, wval))
		case !wok:
			lines = append(lines, fmt.Sprintf("%s: got %s want (absent)", k, gval))
		default:
			lines = append(lines, fmt.Sprintf("%s: got %s want %s", k, gval, wval))
		}
	}
	if len(got) != len(want) {
		lines = append(lines, fmt.Sprintf("length: got %d want %d bytes", len(got), len(want)))
	}
	for i := 0; i < min(len(got), len(want)); i++ {
		if got[i] != want[i] {
			lines = append(lines, fmt.Sprintf("first difference at byte %d (%s): got %#02x want %#02x",
				i, fieldAt(w.Fields, i), got[i], want[i]))
			break
		}
	}
	return strings.Join(lines, "\n")
}

// fieldValues indexes fields by name; a name that repeats (such as
// "problem") gets its occurrence appended.
func fieldValues(fs []Field) (map[string]string, []string) {
	vals := map[string]string{}
	var order []string
	count := map[string]int{}
	for _, f := range fs {
		k := f.Name
		if n := count[f.Name]; n > 0 {
			k = fmt.Sprintf("%s#%d", f.Name, n+1)
		}
		count[f.Name]++
		vals[k] = f.Value
		order = append(order, k)
	}
	return vals, order
}

// fieldAt names the field that holds byte i of a frame.
func fieldAt(fs []Field, i int) string {
	name := "beyond the decoded headers"
	for _, f := range fs {
		if f.Len > 0 && f.Off <= i && i < f.Off+f.Len {
			name = f.Name
		}
	}
	return name
}
