package pktest

import "fmt"

// Verdict is the return value a case expects from the program. The
// constants carry the program family with the kernel's code, so that a TC
// verdict in an XDP table is caught instead of silently matching the XDP
// action with the same number (TC_ACT_OK and XDP_ABORTED are both 0), and
// so that a case that forgets its verdict (the zero Verdict) is an error
// rather than an expectation of 0.
type Verdict uint32

const (
	familyXDP Verdict = 1 << 16
	familyTC  Verdict = 2 << 16
	codeMask  Verdict = 0xffff
)

// XDP actions (enum xdp_action in linux/bpf.h).
const (
	XDPAborted  = familyXDP
	XDPDrop     = familyXDP | 1
	XDPPass     = familyXDP | 2
	XDPTX       = familyXDP | 3
	XDPRedirect = familyXDP | 4
)

// TC actions (TC_ACT_* in linux/pkt_cls.h). TCActUnspec is -1, stored in
// 16 bits like every code.
const (
	TCActUnspec     = familyTC | 0xffff
	TCActOK         = familyTC
	TCActReclassify = familyTC | 1
	TCActShot       = familyTC | 2
	TCActPipe       = familyTC | 3
	TCActStolen     = familyTC | 4
	TCActQueued     = familyTC | 5
	TCActRepeat     = familyTC | 6
	TCActRedirect   = familyTC | 7
	TCActTrap       = familyTC | 8
)

var verdictNames = map[Verdict]string{
	XDPAborted:      "XDP_ABORTED",
	XDPDrop:         "XDP_DROP",
	XDPPass:         "XDP_PASS",
	XDPTX:           "XDP_TX",
	XDPRedirect:     "XDP_REDIRECT",
	TCActUnspec:     "TC_ACT_UNSPEC",
	TCActOK:         "TC_ACT_OK",
	TCActReclassify: "TC_ACT_RECLASSIFY",
	TCActShot:       "TC_ACT_SHOT",
	TCActPipe:       "TC_ACT_PIPE",
	TCActStolen:     "TC_ACT_STOLEN",
	TCActQueued:     "TC_ACT_QUEUED",
	TCActRepeat:     "TC_ACT_REPEAT",
	TCActRedirect:   "TC_ACT_REDIRECT",
	TCActTrap:       "TC_ACT_TRAP",
}

// String returns the kernel's name of the verdict, such as "XDP_TX".
func (v Verdict) String() string {
	if n, ok := verdictNames[v]; ok {
		return n
	}
	switch v &^ codeMask {
	case 0:
		if v == 0 {
			return "unset verdict"
		}
	case familyXDP:
		return fmt.Sprintf("XDP action %d", v.Code())
	case familyTC:
		return fmt.Sprintf("TC action %d", v.Code())
	}
	return fmt.Sprintf("Verdict(%#x)", uint32(v))
}

// Code returns the value the program returns for this verdict.
func (v Verdict) Code() int32 {
	return int32(int16(v & codeMask))
}

func (v Verdict) isXDP() bool { return v&^codeMask == familyXDP }
func (v Verdict) isTC() bool  { return v&^codeMask == familyTC }

// forwards reports whether the packet goes on after the program: its
// checksums then matter to whoever receives it. A dropped or consumed
// packet's do not.
func (v Verdict) forwards() bool {
	switch v {
	case XDPPass, XDPTX, XDPRedirect,
		TCActUnspec, TCActOK, TCActReclassify, TCActPipe, TCActRepeat, TCActRedirect:
		return true
	}
	return false
}

func xdpVerdict(ret uint32) Verdict { return familyXDP | Verdict(ret)&codeMask }
func tcVerdict(ret uint32) Verdict  { return familyTC | Verdict(ret)&codeMask }
