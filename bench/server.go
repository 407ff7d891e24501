package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is the redis-server this program starts for itself: loopback only,
// no persistence, killed when the program ends. The benchmark flushes it
// between measurements, which is why it never touches any other Redis.
type server struct {
	addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startServer starts redis-server on a free 127.0.0.1 port and waits until it
// answers PING. A port can be taken between finding it and redis-server
// binding it, so a failed start is tried again on another port.
func startServer(binary string) (*server, error) {
	dir, err := os.MkdirTemp("", "redlimit-bench-")
	if err != nil {
		return nil, err
	}
	for range 5 {
		var port int
		if port, err = freePort(); err != nil {
			break
		}
		var s *server
		if s, err = launch(binary, dir, port); err == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launch(binary, dir string, port int) (*server, error) {
	s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, exited: make(chan struct{})}
	logPath := filepath.Join(dir, "redis.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	s.cmd = exec.Command(binary,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "",
	)
	s.cmd.Dir, s.cmd.Stdout, s.cmd.Stderr = dir, logf, logf
	setPdeathsig(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()

	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			tail, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redis-server on %s exited: %s", s.addr, lastLines(string(tail), 5))
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, fmt.Errorf("redis-server on %s did not answer within 10s: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server and removes its directory. It is safe to call twice.
func (s *server) stop() {
	s.kill()
	os.RemoveAll(s.dir)
}

func (s *server) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

var (
	errNoStat  = errors.New("no cmdstat_evalsha in INFO commandstats")
	errNoField = errors.New("no such INFO field")
)

// evalshaStats reads the calls and average server time of EVALSHA since the
// last CONFIG RESETSTAT: the script's own cost, without network or client
// time.
func evalshaStats(ctx context.Context, admin *redis.Client) (calls int64, usec float64, err error) {
	v, err := infoField(ctx, admin, "commandstats", "cmdstat_evalsha")
	if err == errNoField {
		return 0, 0, errNoStat
	}
	if err != nil {
		return 0, 0, err
	}
	for _, field := range strings.Split(v, ",") {
		name, value, _ := strings.Cut(field, "=")
		switch name {
		case "calls":
			calls, err = strconv.ParseInt(value, 10, 64)
		case "usec_per_call":
			usec, err = strconv.ParseFloat(value, 64)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return calls, usec, nil
}

func evalshaUsec(ctx context.Context, admin *redis.Client) (float64, error) {
	_, usec, err := evalshaStats(ctx, admin)
	return usec, err
}

// infoField returns one "name:value" field of INFO section, or errNoField.
func infoField(ctx context.Context, admin *redis.Client, section, name string) (string, error) {
	info, err := admin.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, nil
		}
	}
	return "", errNoField
}
