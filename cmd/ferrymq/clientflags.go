package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/core/client"
)

// Defaults of the flags every client command shares.
const (
	defaultServer  = "127.0.0.1:10911"
	defaultTimeout = 10 * time.Second
	envServer      = "FERRYMQ_SERVER"
	envToken       = "FERRYMQ_TOKEN"
)

// clientOptions are the flags of every command that talks to a server.
type clientOptions struct {
	server   string
	token    string
	timeout  time.Duration
	logLevel string
}

func (o *clientOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.server, "server", defaultServer, "core address of the server, host:port; also read from "+envServer)
	f.StringVar(&o.token, "token", "", "token the server requires; default: "+envToken+", else the file data/token that serve writes when it generates one")
	f.DurationVar(&o.timeout, "timeout", defaultTimeout, "bound on connecting and on each request")
	f.StringVar(&o.logLevel, "log-level", "disabled", "client log level on stderr: debug, info, warn, error, disabled")
}

// resolve applies the environment to flags left at their defaults and
// checks what can be checked without a server.
func (o *clientOptions) resolve(cmd *cobra.Command) error {
	if v := getenv(envServer); v != "" && !cmd.Flags().Changed("server") {
		o.server = v
	}
	if v := getenv(envToken); v != "" && !cmd.Flags().Changed("token") {
		o.token = v
	}
	if o.token == "" && !cmd.Flags().Changed("token") {
		o.token = readTokenFile("data") // what `serve` generated in its default data folder
	}
	if o.server == "" {
		return errors.New("--server is empty")
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %s", o.timeout)
	}
	return nil
}

// dial connects to the server. The caller closes the client.
func (o *clientOptions) dial(cmd *cobra.Command) (*client.Client, error) {
	return dialWith(o, cmd, func(ctx context.Context, co client.Options) (*client.Client, error) {
		co.Addr, co.Discover = o.server, true // one address finds the others
		return client.Dial(ctx, co)
	})
}

// dialCluster connects to every node of the cluster --server leads to
// (discovery), each behind a circuit breaker: sends go to a node their
// sharding key ranks first among the healthy ones and are tried again on
// others (up to 3 tries) when a node fails or stalls (client.Cluster).
func (o *clientOptions) dialCluster(cmd *cobra.Command) (*client.Cluster, error) {
	return dialWith(o, cmd, func(ctx context.Context, co client.Options) (*client.Cluster, error) {
		var addrs []string
		for _, a := range strings.Split(o.server, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		return client.DialCluster(ctx, client.ClusterOptions{Addrs: addrs, Discover: true, AttemptTimeout: o.timeout, Client: co})
	})
}

// dialWith resolves the flags and dials with dial, given the client
// options they make, within --timeout.
func dialWith[T any](o *clientOptions, cmd *cobra.Command, dial func(context.Context, client.Options) (T, error)) (T, error) {
	var zero T
	if err := o.resolve(cmd); err != nil {
		return zero, err
	}
	log, err := o.logger(cmd)
	if err != nil {
		return zero, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	c, err := dial(ctx, client.Options{Token: o.token, DialTimeout: o.timeout, RequestTimeout: o.timeout, Logger: &log})
	if err != nil {
		return zero, fmt.Errorf("connect to %s: %w", o.server, dialCause(err))
	}
	return c, nil
}

// dialCause strips what "connect to ADDR" already says from a dial error:
// "dial ADDR: dial tcp ADDR: connect: connection refused" becomes
// "connection refused".
func dialCause(err error) error {
	var op *net.OpError
	if !errors.As(err, &op) {
		return err
	}
	var sys *os.SyscallError
	if errors.As(op.Err, &sys) {
		return sys.Err
	}
	return op.Err
}

// logger is the client's logger: console lines on stderr, off by default.
func (o *clientOptions) logger(cmd *cobra.Command) (zerolog.Logger, error) {
	log, err := newLogger(cmd.ErrOrStderr(), true, o.logLevel)
	if err != nil {
		return log, fmt.Errorf("--log-level %q: %w", o.logLevel, err)
	}
	return log, nil
}

// call runs one request of a one-shot command under --timeout.
func (o *clientOptions) call(cmd *cobra.Command, f func(ctx context.Context, c *client.Client) error) error {
	c, err := o.dial(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	return f(ctx, c)
}

// runE adapts a command's run function to cobra: its error comes out as one
// clean line ("Error: topic not found: "x"").
func runE(run func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		return oneLine(run(cmd, args))
	}
}

// cliError is an error reworded for the terminal; it still unwraps to the
// original, so errors.Is works.
type cliError struct {
	msg string
	err error
}

func (e *cliError) Error() string { return e.msg }
func (e *cliError) Unwrap() error { return e.err }

var (
	// pkgPrefix matches the "core: ", "group: "… prefixes of the server's
	// and the client's sentinel errors, meaningless to a CLI user.
	pkgPrefix = regexp.MustCompile(`(^|: )(ferrymq|core|client|consumer|group|pop|retry|store|wire): `)
	// codeSuffix matches the wire error code *wire.Error appends.
	codeSuffix = regexp.MustCompile(` \(code \d+\)`)
)

// oneLine rewords err as a single line without package prefixes.
func oneLine(err error) error {
	if err == nil {
		return nil
	}
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	msg = codeSuffix.ReplaceAllString(msg, "")
	for {
		m := pkgPrefix.ReplaceAllString(msg, "$1")
		if m == msg {
			break
		}
		msg = m
	}
	if errors.Is(err, context.DeadlineExceeded) {
		msg += " (see --timeout)"
	}
	return &cliError{msg: msg, err: err}
}

// helpRunE makes a command that only groups subcommands reject unknown
// ones with an error (instead of printing help and exiting 0).
func helpRunE(cmd *cobra.Command, _ []string) error { return cmd.Help() }

// position is where a group starts or is moved to: the earliest or latest
// message, or the first message stored at or after a time.
type position struct {
	latest bool
	at     time.Time // zero: earliest or latest
}

// parsePosition reads earliest, latest or an RFC 3339 time.
func parsePosition(flag, s string) (position, error) {
	switch s {
	case "earliest":
		return position{}, nil
	case "latest":
		return position{latest: true}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return position{}, fmt.Errorf("%s %q: want earliest, latest or an RFC 3339 time like 2006-01-02T15:04:05Z", flag, s)
	}
	return position{at: t}, nil
}
