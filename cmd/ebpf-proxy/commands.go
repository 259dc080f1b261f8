package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/trace"
)

// execute runs the command line args (without the program name) and
// returns the exit code: 0, 1 when the agent or a subcommand failed (it
// said why), 2 for a command line it refused before touching anything (an
// unknown subcommand, a stray word, a bad flag).
func execute(args []string, stdout, stderr io.Writer) int {
	cmd := newCommand(stdout, stderr)
	cmd.SetArgs(args)
	err := cmd.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	fmt.Fprintf(stderr, "Error: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
	return 2
}

// newCommand is the command tree: the agent (no subcommand, or agent) and
// its subcommands. Flags are kube-proxy's where the meaning is the same.
func newCommand(stdout, stderr io.Writer) *cobra.Command {
	root := agentCommand("ebpf-proxy", "A kube-proxy replacement that serves Services with BPF programs", false, modes.NewOptions())
	root.Long = `ebpf-proxy serves Kubernetes Services on a node as kube-proxy does: it watches
Services, EndpointSlices and its own Node and translates ClusterIP, NodePort,
ExternalIP and LoadBalancer traffic with BPF programs (socket hooks, TC and
XDP), or with nftables, iptables or IPVS where the kernel cannot run them.

Without a subcommand it runs the agent, as "ebpf-proxy agent" does.`
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(stdout)
	root.SetErr(stderr)
	showVersion := root.Flags().Bool("version", false, "Print the version and exit.")
	runRoot := root.RunE
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if *showVersion {
			return printVersion(stdout)
		}
		return runRoot(cmd, args)
	}
	root.AddCommand(agentCommand("agent", "Run the agent (the same as no subcommand)", false, modes.NewOptions()),
		agentCommand("cleanup", "Remove what every proxy mode created, then exit (kube-proxy's --cleanup)", true, modes.NewOptions()),
		versionCommand(stdout), dumpCommand(stdout, stderr), traceCommand(stdout, stderr), probeCommand(stdout, stderr))
	return root
}

// agentCommand runs the agent with the agent's flags, parsed into opts;
// cleanup sets --cleanup.
func agentCommand(use, short string, cleanup bool, opts *config.Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use + " [flags]",
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Cleanup = opts.Cleanup || cleanup
			return runAgent(opts, cmd.Flags())
		},
	}
	opts.AddFlags(cmd.Flags())
	return cmd
}

// probeCommand asks the running agent for its health through its local API
// socket: the DaemonSet's liveness and readiness probes, which must reach
// this agent's verdict even while another proxy holds the health check
// port (kube-proxy, during a migration).
func probeCommand(stdout, stderr io.Writer) *cobra.Command {
	socket := api.DefaultSocket
	timeout := 5 * time.Second
	paths := map[string]string{"livez": api.LivezPath, "healthz": api.HealthzPath}
	cmd := &cobra.Command{
		Use:   "probe (livez|healthz) [flags]",
		Short: "Ask the running agent whether it is live (livez) or ready (healthz), as its /livez and /healthz answer; exits 0 if so, 1 if not",
		Long: `probe asks the agent on this node, through its local API socket, what its
/livez or /healthz on the health check port would answer, and prints the
answer. It exits 0 when the agent answers 200, 1 otherwise (503, or no
agent listening). The DaemonSet's liveness and readiness probes run it:
during a migration kube-proxy still holds the health check port, and an
HTTP probe there would ask kube-proxy.`,
		ValidArgs: []string{"livez", "healthz"},
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if socket == "" {
				return errors.New("--api-socket is empty: probe needs the agent's socket")
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: want a positive duration", timeout)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			code, body, err := api.Probe(ctx, socket, paths[args[0]])
			if err != nil {
				fmt.Fprintf(stderr, "probe %s: no answer from the agent at %s: %v\n", args[0], socket, err)
				return exitError{code: 1}
			}
			fmt.Fprintln(stdout, strings.TrimSpace(body))
			if code != http.StatusOK {
				fmt.Fprintf(stderr, "probe %s: the agent answers %d %s\n", args[0], code, http.StatusText(code))
				return exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "api-socket", socket, "The agent's local API socket (its --api-socket).")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "How long to wait for the answer.")
	return cmd
}

func versionCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the commit, the Go version and the hash of the BPF objects",
		Args:  noArgs,
		RunE:  func(*cobra.Command, []string) error { return printVersion(stdout) },
	}
}

func dumpCommand(stdout, stderr io.Writer) *cobra.Command {
	var f dump.Flags
	cmd := &cobra.Command{
		Use:   "dump [flags]",
		Short: "Print the Services, their frontends and backends as the pinned maps hold them, named by the agent",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := dump.ParseOptions(f)
			if err != nil {
				return err
			}
			if code := dump.Run(cmd.Context(), o, stdout, stderr); code != 0 {
				return exitError{code: code}
			}
			return nil
		},
	}
	// The views inherit dump's flags.
	addDumpFlags(cmd.PersistentFlags(), &f)
	for _, v := range []struct{ view, short string }{
		{dump.ViewConntrack, "Print the TC and XDP programs' connection tracking entries, named by Service"},
		{dump.ViewAffinity, "Print the session affinity entries: client, Service, chosen backend and age"},
		{dump.ViewMaglev, "Print the Maglev tables: per Service, the table size and the slots each backend holds"},
		{dump.ViewSourceRanges, "Print the loadBalancerSourceRanges of each LoadBalancer frontend"},
		{dump.ViewCounters, "Print the BPF programs' event counters: what each counts and how often it happened"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   v.view + " [flags]",
			Short: v.short,
			Args:  noArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				o, err := dump.ParseViewOptions(v.view, f)
				if err != nil {
					return err
				}
				if code := dump.RunView(cmd.Context(), v.view, o, stdout, stderr); code != 0 {
					return exitError{code: code}
				}
				return nil
			},
		})
	}
	return cmd
}

func traceCommand(stdout, stderr io.Writer) *cobra.Command {
	var f trace.Flags
	cmd := &cobra.Command{
		Use:   "trace (--pod IP | --netns PATH | --node | --source IP --device DEV) DESTINATION[/PROTOCOL]",
		Short: "Explain what the BPF datapath does with a connection from a client to an address:port, step by step",
		Long: `trace reads the pinned maps as the programs read them and says what the
datapath does with a new connection from the client to DESTINATION
(address:port, [IPv6]:port; protocol tcp by default): which frontend
matches and in which scope, the verdict (forward, reject, drop, untouched)
and the rule behind it, the candidate backends and how one is chosen
(random, Maglev slot, session affinity entry and its age), source NAT, and
an existing connection tracking entry. Run it on the node (in the agent's
pod): devices and routes are read in its network namespace.`,
		Example: `  ebpf-proxy trace --pod 10.244.0.5 10.96.0.10:53/udp
  ebpf-proxy trace --netns /proc/1234/ns/net 10.96.0.80:80
  ebpf-proxy trace --source 198.51.100.7 --device eth0 --source-port 40112 192.168.1.10:30080 -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("%q takes one destination, address:port[/protocol]; got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			f.Dest = args[0]
			o, err := trace.ParseOptions(f)
			if err != nil {
				return err
			}
			if code := trace.Run(cmd.Context(), o, stdout, stderr); code != 0 {
				return exitError{code: code}
			}
			return nil
		},
	}
	addTraceFlags(cmd.Flags(), &f)
	return cmd
}

// noArgs refuses positional arguments, as kube-proxy does: a stray word
// never starts the agent.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.HasSubCommands() {
		return fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return fmt.Errorf("unexpected argument %q: %q takes flags only", args[0], cmd.CommandPath())
}
