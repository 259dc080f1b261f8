package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The kinds of failure an attempt reports, in Attempt.Error.
const (
	// KindRefused: a TCP RST to the SYN, or ICMP port unreachable for
	// UDP (a REJECT rule, or no one listening).
	KindRefused = "refused"
	// KindTimeout: no answer within the timeout (a DROP, or no backend
	// that answers).
	KindTimeout = "timeout"
	// KindUnreachable: ICMP host or network unreachable, or no route.
	KindUnreachable = "unreachable"
	// KindReset: the connection was reset after it was set up.
	KindReset = "reset"
	// KindEOF: the connection closed before the server's line came.
	KindEOF = "eof"
	// KindBadAnswer: something came back that is not a server's line.
	KindBadAnswer = "bad-answer"
	// KindCanceled: the attempt was cut short by the program stopping.
	KindCanceled = "canceled"
	// KindOther is any other error; Attempt.Detail says which.
	KindOther = "other"
)

// Attempt is the outcome of one connection or datagram.
type Attempt struct {
	// Server is the name in the answer, empty when there was none.
	Server string `json:"server"`
	// Peer is the address the server saw the client at.
	Peer string `json:"peer"`
	// Error is the kind of failure (Kind...), empty on success.
	Error string `json:"error,omitempty"`
	// Detail is the error's text.
	Detail string `json:"detail,omitempty"`
	// ElapsedMS is the time from the start of the attempt to the answer
	// or the failure, in milliseconds.
	ElapsedMS float64 `json:"elapsed_ms"`
	// StalledMS is the part of ElapsedMS in which the client did not run
	// (see watchdog), in milliseconds.
	StalledMS float64 `json:"stalled_ms,omitempty"`
	// Socket is what the kernel said of a failed TCP attempt's socket.
	Socket *SocketInfo `json:"socket,omitempty"`
}

// ProbeReport is what `probe` prints.
type ProbeReport struct {
	Proto    string    `json:"proto"`
	Addr     string    `json:"addr"`
	OK       int       `json:"ok"`
	Failed   int       `json:"failed"`
	Attempts []Attempt `json:"attempts"`
}

// Probe makes count attempts at addr over proto ("tcp" or "udp"), one
// after the other, each within timeout.
func Probe(ctx context.Context, proto, addr string, count int, timeout time.Duration) ProbeReport {
	r := ProbeReport{Proto: proto, Addr: addr, Attempts: []Attempt{}}
	for range count {
		a := attempt(ctx, proto, addr, timeout)
		if a.Error == "" {
			r.OK++
		} else {
			r.Failed++
		}
		r.Attempts = append(r.Attempts, a)
	}
	return r
}

// attempt connects (TCP) or sends a datagram (UDP) and reads the answer,
// within timeout of the time it ran (see watchdog).
func attempt(ctx context.Context, proto, addr string, timeout time.Duration) Attempt {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := watchdog(timeout, func() { cancel(errNoAnswer) })
	// A failed TCP attempt is described by its socket, read through a
	// second descriptor: the dial's own is closed when the dial fails.
	kept := -1
	a := func() Attempt {
		c, k, err := dialKept(ctx, proto, addr)
		kept = k
		if err != nil {
			return failed(err)
		}
		defer c.Close()
		// A read does not watch ctx: a deadline in the past ends it when
		// the time is up or the caller gives up.
		defer context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })()
		if proto == "udp" {
			if _, err := c.Write([]byte("probe\n")); err != nil {
				return failed(err)
			}
			buf := make([]byte, 1024)
			n, err := c.Read(buf)
			if err != nil {
				return failed(err)
			}
			return parseAnswer(string(buf[:n]))
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		switch {
		case err == nil:
			return parseAnswer(line)
		case line == "" && errors.Is(err, io.EOF):
			return Attempt{Error: KindEOF, Detail: "closed before the answer"}
		case line == "":
			return failed(err)
		}
		return Attempt{Error: KindBadAnswer, Detail: "incomplete answer " + quote(line) + ": " + err.Error()}
	}()
	stalled := stopWatch()
	if kept >= 0 {
		if a.Error != "" {
			a.Socket = socketInfo(kept)
		}
		_ = unix.Close(kept)
	}
	if a.Error != "" {
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, errNoAnswer):
			a.Error = KindTimeout
			a.Detail = fmt.Sprintf("no answer in %v of running time: %s", timeout, a.Detail)
		case errors.Is(cause, context.Canceled):
			a.Error = KindCanceled
		}
	}
	a.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
	a.StalledMS = float64(stalled.Microseconds()) / 1000
	return a
}

// parseAnswer parses "<name> <ip:port>\n".
func parseAnswer(line string) Attempt {
	name, peer, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if !ok || name == "" || strings.Contains(peer, " ") {
		return Attempt{Error: KindBadAnswer, Detail: "answer " + quote(line)}
	}
	if _, _, err := net.SplitHostPort(peer); err != nil {
		return Attempt{Error: KindBadAnswer, Detail: "answer " + quote(line)}
	}
	return Attempt{Server: name, Peer: peer}
}

func quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "..."
	}
	return "\"" + strings.ReplaceAll(s, "\n", "\\n") + "\""
}

func failed(err error) Attempt {
	return Attempt{Error: errorKind(err), Detail: err.Error()}
}

// errorKind classifies a dial, read or write error.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return KindRefused
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ETIMEDOUT), errors.As(err, &ne) && ne.Timeout():
		return KindTimeout
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return KindUnreachable
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return KindReset
	case errors.Is(err, io.EOF):
		return KindEOF
	}
	return KindOther
}
