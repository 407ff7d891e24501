// Command redlimit shows the redlimit library at work: service instances
// sharing one limit through Redis (demo), redis-cell's CL.THROTTLE without the
// module (throttle), and the four algorithms side by side (compare).
//
// Every command runs on an embedded Redis (miniredis) unless --redis or
// --cluster names a real one, so it needs nothing but Go:
//
//	go run ./cmd/redlimit demo
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

const usage = `redlimit shows the redlimit library at work: rate limits shared through Redis.

Usage:

	redlimit demo [flags]
		N service instances share one limit for a few seconds of bursty
		traffic; shows who got what and checks that the limit held
	redlimit throttle [flags] KEY MAX_BURST COUNT PERIOD [QUANTITY]
		answers as redis-cell's CL.THROTTLE, without the module
	redlimit compare [flags]
		one traffic pattern through the four algorithms, as a chart

Without --redis or --cluster, a command runs on an embedded Redis (miniredis).
Run "redlimit COMMAND -h" for a command's flags.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes, as the go command uses them.
const (
	exitOK    = 0
	exitFail  = 1 // the command ran and failed (or the limit did not hold)
	exitUsage = 2 // bad command line
)

// run is the whole program, separate from main so that tests can call it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	commands := map[string]func(context.Context, []string, io.Writer, io.Writer) int{
		"demo":     demo,
		"throttle": throttle,
		"compare":  compare,
	}
	switch cmd := args[0]; {
	case cmd == "-h" || cmd == "-help" || cmd == "--help" || cmd == "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case commands[cmd] != nil:
		return commands[cmd](ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "redlimit: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
}

// newFlagSet returns a flag set for a command that reports its own errors
// (run turns them into exit codes) and prints its usage on -h.
func newFlagSet(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: redlimit %s\n\n%s\nFlags:\n", synopsis, about)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and says what run should return when it fails:
// exitOK for -h (the usage is printed), exitUsage for a bad flag.
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK, false
	case err != nil:
		return exitUsage, false
	}
	return 0, true
}

// usageError prints a command-line mistake with the command's usage.
func usageError(fs *flag.FlagSet, format string, a ...any) int {
	// One prefix: the library's errors start with "redlimit: " too.
	msg := strings.TrimPrefix(fmt.Sprintf(format, a...), "redlimit: ")
	fmt.Fprintf(fs.Output(), "redlimit %s: %s\n", fs.Name(), msg)
	fs.Usage()
	return exitUsage
}

// backend is where a command's limiters live: --redis, --cluster or, by
// default, an embedded miniredis.
type backend struct {
	url     string
	cluster string

	embedded *miniredis.Miniredis
	opts     *redis.Options
	cOpts    *redis.ClusterOptions
}

func (b *backend) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&b.url, "redis", "", "a Redis server, as a URL: redis://[user:password@]host:port[/db]")
	fs.StringVar(&b.cluster, "cluster", "", "a Redis Cluster, as comma-separated host:port seed nodes")
}

// check reads --redis and --cluster: a mistake there is a bad command line
// (exit 2), found before anything is started or dialled.
func (b *backend) check() error {
	switch {
	case b.url != "" && b.cluster != "":
		return errors.New("--redis and --cluster cannot be used together")
	case b.url != "":
		opts, err := redis.ParseURL(b.url)
		if err != nil {
			return fmt.Errorf("--redis %q: %w", b.url, err)
		}
		b.opts = opts
	case b.cluster != "":
		addrs := strings.Split(b.cluster, ",")
		for _, addr := range addrs {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return fmt.Errorf("--cluster %q: %w", b.cluster, err)
			}
		}
		b.cOpts = &redis.ClusterOptions{Addrs: addrs}
	}
	return nil
}

// open connects to what check read (or starts the embedded Redis); close
// releases the embedded server. A failure here is the command failing (exit
// 1): the command line was fine.
func (b *backend) open(ctx context.Context) error {
	if b.opts == nil && b.cOpts == nil {
		m, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("starting the embedded Redis: %w", err)
		}
		b.embedded = m
		b.opts = &redis.Options{Addr: m.Addr()}
	}
	rdb := b.newClient()
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		b.close()
		return fmt.Errorf("cannot reach %s: %w", b, err)
	}
	return nil
}

// newClient returns a new connection pool: one per simulated instance, as
// separate processes would have.
func (b *backend) newClient() redis.UniversalClient {
	if b.cOpts != nil {
		return redis.NewClusterClient(b.cOpts)
	}
	return redis.NewClient(b.opts)
}

func (b *backend) close() {
	if b.embedded != nil {
		b.embedded.Close()
	}
}

func (b *backend) String() string {
	switch {
	case b.cOpts != nil:
		return "the Redis Cluster at " + b.cluster
	case b.embedded != nil:
		return "an embedded Redis (miniredis)"
	}
	return "Redis at " + b.opts.Addr
}

// uniqueName keeps runs against a shared Redis apart.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
