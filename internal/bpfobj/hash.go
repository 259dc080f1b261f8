package bpfobj

import (
	"crypto/sha256"
	"encoding/hex"
)

// ObjectsHash is the SHA-256 of the embedded BPF objects (socket, TC and
// XDP programs, in that order), in hex: two builds with the same hash load
// the same programs.
func ObjectsHash() string {
	h := sha256.New()
	for _, b := range [][]byte{_SockBytes, _TcBytes, _XdpBytes} {
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}
