// Command ebpf-proxy is a drop-in replacement for kube-proxy: it watches
// Services, EndpointSlices and its own Node and programs BPF socket load
// balancing for them. Its flags keep kube-proxy's names where the meaning is
// the same.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// runAgent runs the agent with opts, whose flags fs parsed: it reads
// --config, then does what the flags ask (write the configuration, clean
// up, or serve until SIGINT or SIGTERM).
func runAgent(opts *config.Options, fs *pflag.FlagSet) error {
	notes, err := config.FinishFlags(opts, fs)
	if err != nil {
		return err
	}
	log, err := newLogger(opts.Verbosity, opts.LoggingFormat)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush at exit
	for _, n := range notes {
		log.Warn(n)
	}
	if opts.WriteConfigTo != "" {
		err := modes.Validate(opts)
		if err == nil {
			err = opts.WriteConfig(opts.WriteConfigTo)
		}
		if err != nil {
			log.Error("exiting", zap.Error(err))
			return exitError{code: 1}
		}
		log.Info("wrote the configuration in effect", zap.String("path", opts.WriteConfigTo))
		return nil
	}
	// client-go logs through klog: send it to the same structured log.
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, log); err != nil {
		log.Error("exiting", zap.Error(err))
		return exitError{code: 1}
	}
	return nil
}

// exitError ends the command with code, its cause already reported.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func newLogger(v int, format string) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.Sampling = nil
	// An error is one line, as kube-proxy's are: no Go stack trace.
	cfg.DisableStacktrace = true
	cfg.EncoderConfig.TimeKey = "time"
	cfg.EncoderConfig.EncodeTime = zapISOTime
	if v >= 2 {
		cfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	if format == "text" || strings.EqualFold(os.Getenv("EBPF_PROXY_LOG_FORMAT"), "console") {
		cfg.Encoding = "console"
	}
	return cfg.Build()
}

func zapISOTime(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	enc.AppendString(t.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}
