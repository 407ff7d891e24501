// Package redistest starts throwaway redis-server processes, and a local
// Redis Cluster, for tests (and, with Launch, for the benchmark); and holds
// what the suites of every package share to run on them: a controlled
// Clock, EachBackend and UniqueName.
//
// Everything listens on 127.0.0.1 only, keeps no data on disk and is killed
// when the test (Start, StartCluster) or the test binary (Shared,
// SharedCluster, via Main) finishes, or Launch's stop is called. Servers are started with Pdeathsig, so a
// test binary that crashes does not leave them behind either.
//
// A package using Shared or SharedCluster should have
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure instead of a skip (set it in CI).
const RequireEnv = "REDLIMIT_REQUIRE_REDIS"

const (
	startTimeout = 10 * time.Second // one redis-server from exec to answering INFO
	killTimeout  = 10 * time.Second
	cmdTimeout   = 5 * time.Second // any single admin command
	logTailBytes = 4096
)

// Require reports whether REDLIMIT_REQUIRE_REDIS=1: then a missing
// redis-server is a test failure, not a skip.
func Require() bool { return os.Getenv(RequireEnv) == "1" }

// Main runs the tests, stops every server and cluster this process started
// and exits with the tests' status. os.Exit skips deferred calls, which is why
// the shared servers cannot simply be stopped with a defer in TestMain.
//
// go-redis's own log (failed dials, "failed to initialize
// maintnotifications" for every client of a server without them) is
// silenced: the tests that cause it mean to, and it buried the lines that
// mattered (hundreds of them a run).
func Main(m *testing.M) {
	redis.SetLogger(quiet{})
	code := m.Run()
	stopAll()
	os.Exit(code)
}

// quiet is a go-redis logger that drops everything.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

var (
	// liveMu guards live and tempDirs.
	liveMu sync.Mutex
	// live holds every server that is running, so Main can kill servers
	// whose owner (a shared instance) has no t.Cleanup.
	live = map[*Server]struct{}{}
	// tempDirs are the dirs of shared servers and clusters; t.TempDir cannot
	// be used for them because they outlive the test that started them.
	tempDirs []string

	// sharedMu serialises the first start of the shared instances, so
	// parallel tests calling Shared wait for one server instead of racing
	// to start several.
	sharedMu      sync.Mutex
	shared        *Server
	sharedCluster *Cluster
)

func stopAll() {
	liveMu.Lock()
	servers := make([]*Server, 0, len(live))
	for s := range live {
		servers = append(servers, s)
	}
	dirs := tempDirs
	tempDirs = nil
	liveMu.Unlock()

	killAll(servers)
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

// killAll kills servers concurrently: a cluster has six and each kill waits
// for the process to exit. nil entries (nodes that never started) are
// skipped.
func killAll(servers []*Server) error {
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		if s != nil {
			wg.Go(func() { errs[i] = s.Kill() })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

func sharedTempDir(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	liveMu.Lock()
	tempDirs = append(tempDirs, dir)
	liveMu.Unlock()
	return dir, nil
}

// needBinaries skips t (or fails it under Require) when a Redis binary is
// not installed.
func needBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			if Require() {
				t.Fatalf("redistest: %s not found on PATH and %s=1: %v", name, RequireEnv, err)
			}
			t.Skip(name + " not installed")
		}
	}
}

// Server is one redis-server process on 127.0.0.1.
type Server struct {
	port    int // fixed once the server has started; Restart reuses it
	dir     string
	cluster bool

	// mu serialises start/kill and guards the fields below.
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd has been reaped
	admin   *redis.Client // our own connection for probes and cluster admin
	version string
}

// Shared returns the redis-server shared by all tests of this test binary,
// starting it on first use. Tests sharing it must use their own keys; it is
// never flushed. If a test killed it, it is restarted on the same port.
// It is stopped by Main (or, without Main, when the test binary exits).
func Shared(t testing.TB) *Server {
	t.Helper()
	needBinaries(t, "redis-server")
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		if !shared.running() {
			shared.Restart(t)
		}
		return shared
	}
	dir, err := sharedTempDir("redistest-server-")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s, err := startServer(dir, false)
	if err != nil {
		t.Fatalf("redistest: starting shared redis-server: %v", err)
	}
	shared = s
	return s
}

// Start starts a redis-server for this test only; it is killed in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	needBinaries(t, "redis-server")
	// t.TempDir registers its removal first, so it runs after the kill below.
	s, err := startServer(t.TempDir(), false)
	if err != nil {
		t.Fatalf("redistest: starting redis-server: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Kill(); err != nil {
			t.Errorf("redistest: %v", err)
		}
	})
	return s
}

// Launch starts a redis-server as Start does, for a program that is not a
// test (the benchmark): in a directory of its own, which stop removes
// after killing the server.
func Launch() (s *Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "redistest-server-")
	if err != nil {
		return nil, nil, err
	}
	if s, err = startServer(dir, false); err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	return s, func() { _ = s.Kill(); _ = os.RemoveAll(dir) }, nil
}

// Addr returns the server's "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Version returns redis_version as reported by INFO server, e.g. "7.0.15".
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// LogPath returns the file the server's stdout and stderr go to.
func (s *Server) LogPath() string { return filepath.Join(s.dir, "redis.log") }

// Client returns a go-redis client with default options for the server,
// closed in t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill sends SIGKILL and waits for the process to exit. Killing a server
// that is not running is not an error.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kill()
}

// Restart kills the server and starts it again on the same port, with the
// same directory (so a cluster node keeps its nodes.conf and identity), and
// waits until it answers. Data is lost: there is no persistence.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.kill(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
	var err error
	for range 10 {
		if err = s.launch(); !errors.Is(err, errAddrInUse) {
			break
		}
		// Something grabbed the port between kill and start (e.g. as the
		// local port of an outgoing connection); it is usually short-lived.
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("redistest: restarting redis-server on %s: %v", s.Addr(), err)
	}
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// do runs an admin command on our own connection to the server.
func (s *Server) do(ctx context.Context, args ...any) *redis.Cmd {
	s.mu.Lock()
	admin := s.admin
	s.mu.Unlock()
	if admin == nil {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetErr(fmt.Errorf("redis-server %s is not running", s.Addr()))
		return cmd
	}
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	return admin.Do(ctx, args...)
}

func (s *Server) doString(ctx context.Context, args ...any) (string, error) {
	v, err := s.do(ctx, args...).Text()
	if err != nil {
		return "", fmt.Errorf("%s: %v: %w", s.Addr(), args, err)
	}
	return v, nil
}

var (
	errAddrInUse = errors.New("address already in use")
	// noDebugFlag is set once a redis-server rejected --enable-debug-command
	// (older than 7.0, where DEBUG is always enabled).
	noDebugFlag atomic.Bool
)

// startServer starts a redis-server in dir on a free port.
func startServer(dir string, cluster bool) (*Server, error) {
	return startOnFreePort(dir, cluster, (*Server).launch)
}

// startOnFreePort starts a process with launch (redis-server or
// redis-sentinel) in dir on a free port, trying other ports if the chosen
// one is taken before the process binds it.
func startOnFreePort(dir string, cluster bool, launch func(*Server) error) (*Server, error) {
	var err error
	for range 5 {
		var port int
		if port, err = freePort(cluster); err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: dir, cluster: cluster}
		s.mu.Lock()
		err = launch(s)
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errAddrInUse) {
			return nil, err
		}
	}
	return nil, err
}

// startNodes starts n processes with start at once, each in a directory of
// its own (dir/<name><i>). Those that failed are nil.
func startNodes(dir, name string, n int, start func(dir string) (*Server, error)) ([]*Server, error) {
	nodes, errs := make([]*Server, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			nodeDir := filepath.Join(dir, name+strconv.Itoa(i))
			if errs[i] = os.MkdirAll(nodeDir, 0o755); errs[i] == nil {
				nodes[i], errs[i] = start(nodeDir)
			}
		})
	}
	wg.Wait()
	return nodes, errors.Join(errs...)
}

// startForTest starts a group of servers (a Cluster, a Sentinel) for t
// only, in a directory of t's, says what started, and stops it in
// t.Cleanup.
func startForTest[G interface{ stop() error }](t testing.TB, what string, start func(dir string) (G, error), describe func(G) string) G {
	t.Helper()
	begin := time.Now()
	g, err := start(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: starting %s: %v", what, err)
	}
	t.Logf("redistest: %s up in %v", describe(g), time.Since(begin).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := g.stop(); err != nil {
			t.Errorf("redistest: stopping %s: %v", what, err)
		}
	})
	return g
}

// freePort asks the kernel for a free port. For a cluster node, port+10000
// (its cluster bus port) must be free as well.
func freePort(clusterBus bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := !clusterBus || (port+10000 <= 65535 && portFree(port+10000))
		l.Close()
		if ok {
			return port, nil
		}
	}
	return 0, errors.New("no free port pair (port, port+10000) on 127.0.0.1")
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// launch starts the process and waits until it answers. s.mu must be held.
func (s *Server) launch() error {
	for {
		useDebugFlag := !noDebugFlag.Load()
		err := s.launchOnce(useDebugFlag)
		// Redis < 7 does not know the option (DEBUG is always on there) and
		// exits with "FATAL CONFIG FILE ERROR ... >>> 'enable-debug-command".
		if err != nil && useDebugFlag && strings.Contains(s.logTail(), ">>> 'enable-debug-command") {
			noDebugFlag.Store(true)
			continue
		}
		return err
	}
}

func (s *Server) launchOnce(debugFlag bool) error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		// Replicas (cluster) sync without touching disk, and at once: by
		// default the primary waits 5 s for more replicas to show up.
		"--repl-diskless-sync", "yes",
		"--repl-diskless-sync-delay", "0",
		"--daemonize", "no",
		"--logfile", "", // stdout, which goes to LogPath
	}
	if debugFlag {
		args = append(args, "--enable-debug-command", "yes")
	}
	if s.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout.Milliseconds())),
		)
	}

	return s.spawn("redis-server", args)
}

// spawn starts binary with args in s.dir, logging to LogPath, opens the
// admin connection, registers s with Main and waits until the process
// answers. s.mu must be held.
func (s *Server) spawn(binary string, args []string) error {
	logf, err := os.OpenFile(s.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "\n--- redistest: %s %s %s\n", time.Now().Format(time.RFC3339Nano), binary, strings.Join(args, " "))
	cmd := exec.Command(binary, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	err = startProcess(cmd)
	logf.Close() // the child has its own copy
	if err != nil {
		return fmt.Errorf("starting %s: %w", binary, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	s.admin = redis.NewClient(&redis.Options{
		Addr:            s.Addr(),
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1, // callers poll; a retry would only hide a dead node
		DialTimeout:     time.Second,
		DialerRetries:   1,
		ReadTimeout:     cmdTimeout,
		PoolSize:        2,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	})
	liveMu.Lock()
	live[s] = struct{}{}
	liveMu.Unlock()

	if err := s.waitReady(); err != nil {
		_ = s.kill()
		return err
	}
	return nil
}

// waitReady waits until our process (not some other process that happens to
// own the port) answers INFO.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	pid := strconv.Itoa(s.cmd.Process.Pid)
	var lastErr error
	for {
		select {
		case <-s.exited:
			tail := s.logTail()
			err := fmt.Errorf("redis-server on %s exited during startup (%v); log %s:\n%s",
				s.Addr(), s.cmd.ProcessState, s.LogPath(), indent(tail))
			if strings.Contains(tail, "Address already in use") {
				err = fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return err
		default:
		}
		if lastErr = s.probe(pid); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready after %v (last error: %v); log %s:\n%s",
				s.Addr(), startTimeout, lastErr, s.LogPath(), indent(s.logTail()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) probe(pid string) error {
	// A plain dial first: failed dials through go-redis put its pool into a
	// back-off mode that would slow down every later probe.
	conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return err
	}
	conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := s.admin.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	if got := infoField(info, "process_id"); got != pid {
		return fmt.Errorf("port answered by process_id %s, not our pid %s", got, pid)
	}
	s.version = infoField(info, "redis_version")
	return nil
}

// kill requires s.mu.
func (s *Server) kill() error {
	if s.admin != nil {
		_ = s.admin.Close()
		s.admin = nil
	}
	if s.cmd == nil {
		return nil
	}
	defer func() {
		liveMu.Lock()
		delete(live, s)
		liveMu.Unlock()
	}()
	select {
	case <-s.exited:
		return nil
	default:
	}
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing redis-server %s: %w", s.Addr(), err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("redis-server %s (pid %d) still running %v after SIGKILL", s.Addr(), s.cmd.Process.Pid, killTimeout)
	}
}

func (s *Server) logTail() string {
	f, err := os.Open(s.LogPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	off := max(fi.Size()-logTailBytes, 0)
	buf := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(buf, off)
	return string(buf[:n])
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n\t")
}

// infoField returns one "key:value" field of an INFO or CLUSTER INFO reply.
func infoField(info, key string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

type spawnRequest struct {
	cmd *exec.Cmd
	err chan error
}

var (
	spawnOnce sync.Once
	spawnReqs = make(chan spawnRequest)
)

// startProcess starts cmd from a single OS thread that lives as long as the
// test binary. Pdeathsig fires when the *thread* that forked the child exits,
// not the process (golang/go#27505): forking from whatever thread a goroutine
// happens to run on could kill a server mid-test if that thread later exits
// (as it does when a goroutine exits while locked with LockOSThread).
func startProcess(cmd *exec.Cmd) error {
	setPdeathsig(cmd)
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive the servers
			for r := range spawnReqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnReqs <- spawnRequest{cmd, errc}
	return <-errc
}
