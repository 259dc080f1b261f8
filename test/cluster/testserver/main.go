// Command testserver is the one program in the cluster test's pods
// (test/cluster): a backend that says who it is, clients that report what
// they got as JSON, and the pod sandbox's pause process.
//
//	testserver serve --tcp 8080 --udp 8080      answer "<name> <client ip:port>\n"
//	testserver probe --proto tcp --count 10 --timeout 2s 10.96.0.10:80
//	testserver loop --interval 100ms --max-duration 10m 10.96.0.10:80
//	testserver pause
//	testserver outside --listen 192.168.50.1:7070
//
// serve takes its name from $POD_NAME, else the hostname. probe prints one
// JSON object with every attempt; loop connects until its standard input
// ends (`kubectl exec -i` closed) or --max-duration passes and prints one
// JSON summary. Both exit 0 whatever the attempts gave, 2 on bad usage.
// outside runs the same clients at a test's request over HTTP (Outside).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = `usage:
  testserver serve [--tcp PORT[,PORT...]] [--udp PORT[,PORT...]] [--linger D]
  testserver probe [--proto tcp|udp] [--count N] [--timeout D] ADDR
  testserver loop [--interval D] [--timeout D] [--max-duration D] ADDR
  testserver pause
  testserver outside --listen ADDR
`

// errUsage is returned for bad usage; the program exits 2.
var errUsage = errors.New("bad usage")

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("testserver: ")
	err := run(os.Args[1:], os.Stdin, os.Stdout)
	switch {
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "testserver: %v\n%s", err, usage)
		os.Exit(2)
	case err != nil:
		log.Print(err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no subcommand", errUsage)
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	parse := func(nargs int) error {
		if err := fs.Parse(args); err != nil {
			return fmt.Errorf("%w: %s: %v", errUsage, cmd, err)
		}
		if fs.NArg() != nargs {
			return fmt.Errorf("%w: %s takes %d argument(s), got %q", errUsage, cmd, nargs, fs.Args())
		}
		return nil
	}
	switch cmd {
	case "serve":
		tcp := fs.String("tcp", "", "TCP ports to answer on, comma-separated")
		udp := fs.String("udp", "", "UDP ports to answer on, comma-separated")
		linger := fs.Duration("linger", 10*time.Second, "how long a TCP connection waits for the client to close it")
		if err := parse(0); err != nil {
			return err
		}
		tcpPorts, err := ports(*tcp)
		if err != nil {
			return fmt.Errorf("%w: --tcp: %v", errUsage, err)
		}
		udpPorts, err := ports(*udp)
		if err != nil {
			return fmt.Errorf("%w: --udp: %v", errUsage, err)
		}
		if len(tcpPorts)+len(udpPorts) == 0 {
			return fmt.Errorf("%w: serve needs --tcp or --udp", errUsage)
		}
		s := &Server{Name: serverName(), Linger: *linger}
		return s.Serve(ctx, tcpPorts, udpPorts)
	case "probe":
		proto := fs.String("proto", "tcp", "tcp or udp")
		count := fs.Int("count", 1, "number of attempts")
		timeout := fs.Duration("timeout", 2*time.Second, "time allowed for each attempt")
		if err := parse(1); err != nil {
			return err
		}
		if *proto != "tcp" && *proto != "udp" {
			return fmt.Errorf("%w: --proto %q: tcp or udp", errUsage, *proto)
		}
		if *count < 1 || *timeout <= 0 {
			return fmt.Errorf("%w: --count and --timeout must be positive", errUsage)
		}
		return printJSON(stdout, Probe(ctx, *proto, fs.Arg(0), *count, *timeout))
	case "loop":
		interval := fs.Duration("interval", 100*time.Millisecond, "time between the starts of two attempts")
		timeout := fs.Duration("timeout", time.Second, "time allowed for each attempt")
		maxDuration := fs.Duration("max-duration", 10*time.Minute, "stop after this long even if standard input is still open")
		if err := parse(1); err != nil {
			return err
		}
		if *interval < 0 || *timeout <= 0 || *maxDuration <= 0 {
			return fmt.Errorf("%w: --timeout and --max-duration must be positive", errUsage)
		}
		eof := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			close(eof)
		}()
		return printJSON(stdout, Loop(ctx, fs.Arg(0), *interval, *timeout, *maxDuration, eof))
	case "outside":
		listen := fs.String("listen", "", "address and port to answer on")
		if err := parse(0); err != nil {
			return err
		}
		if *listen == "" {
			return fmt.Errorf("%w: outside needs --listen", errUsage)
		}
		l, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		return (&Outside{}).Serve(ctx, l)
	case "pause":
		if err := parse(0); err != nil {
			return err
		}
		stop() // Pause handles the signals itself.
		Pause()
		return nil
	}
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, cmd)
}

// serverName is $POD_NAME, else the hostname.
func serverName() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "unknown"
}

// ports parses a comma-separated list of ports; "" is none.
func ports(s string) ([]int, error) {
	var ps []int
	if s == "" {
		return nil, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("%q is not a port", f)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
