// Command modproxy writes the workspace's modules into a directory laid out as
// a Go module proxy (GOPROXY=file://DIR), so that CI can check what a user
// gets from `go install github.com/redlimit/redlimit/cmd/redlimit@VERSION`
// and what `go mod tidy` makes of each module's requires, without publishing
// anything.
//
//	go run ./internal/modproxy DIR
//
// It writes two kinds of versions, and prints the second one's name:
//
//   - every version of a workspace module that a workspace go.mod requires
//     (github.com/redlimit/redlimit v0.0.0-TIME-COMMIT), built from that
//     commit with git, byte for byte what the public proxy would build, so
//     that the hashes in the modules' go.sum files check;
//   - every workspace module as the working tree has it (tracked and
//     untracked files that git does not ignore), at one new pseudo-version
//     v0.0.0-NOW-000000000000: what would be published next.
//
// The modules outside the library require it at a real commit rather than
// through a replace directive, which `go install pkg@version` refuses; go.work
// puts the working tree in its place for development. To move a module onto a
// newer commit of the library (once that commit is on main):
//
//	go run ./internal/modproxy -pin
//
// rewrites each workspace module's require of another to HEAD's
// pseudo-version and runs `go mod tidy` against the proxy it writes.
// `go mod tidy` ignores go.work, so run by hand in otel/, bench/ or
// cmd/redlimit/ it needs the pinned library too: from the module cache once
// CI or -pin has run here, or from this proxy with
// GOPROXY=file://DIR,$(go env GOPROXY) GONOSUMDB=github.com/redlimit/redlimit.
//
// Only the standard library, so that the library's go.mod stays as it is: the
// zip layout and hashes follow golang.org/x/mod/zip and
// golang.org/x/mod/sumdb/dirhash (main_test.go holds a hash they computed).
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	pin := flag.Bool("pin", false, "require the other workspace modules at HEAD's pseudo-version, and tidy")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./internal/modproxy DIR\n       go run ./internal/modproxy -pin\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	var err error
	switch {
	case *pin && flag.NArg() == 0:
		err = pinHead()
	case !*pin && flag.NArg() == 1:
		var version string
		version, err = writeProxy(flag.Arg(0))
		if err == nil {
			fmt.Println(version)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

// A module of the workspace: its path and its directory relative to the root
// of the git repository ("." for the library).
type module struct {
	path, dir string
}

// pseudoVersion matches the versions this tool can rebuild: v0.0.0 pseudo-
// versions, which name their commit.
var pseudoVersion = regexp.MustCompile(`^v0\.0\.0-(\d{14})-([0-9a-f]{12})$`)

// writeProxy writes the proxy into dir and returns the working tree's version.
func writeProxy(dir string) (string, error) {
	root, mods, err := workspace()
	if err != nil {
		return "", err
	}
	// The working tree is no commit: its version names none (000000000000),
	// so it can never be mistaken for a pinned commit, and is new each run.
	dev := "v0.0.0-" + time.Now().UTC().Format("20060102150405") + "-000000000000"
	written := map[string]bool{}
	for _, m := range mods {
		files, err := worktreeFiles(root, m.dir)
		if err != nil {
			return "", err
		}
		if err := writeVersion(dir, m.path, dev, files); err != nil {
			return "", err
		}
		// What this module requires of the others, rebuilt from git.
		for _, req := range workspaceRequires(files["go.mod"], mods) {
			p := pseudoVersion.FindStringSubmatch(req.version)
			if p == nil || written[req.path+"@"+req.version] {
				continue
			}
			written[req.path+"@"+req.version] = true
			files, err := commitFiles(root, p[2], req.mod.dir)
			if err != nil {
				return "", fmt.Errorf("%s requires %s@%s: %w", m.path, req.path, req.version, err)
			}
			if err := writeVersion(dir, req.path, req.version, files); err != nil {
				return "", err
			}
		}
	}
	return dev, nil
}

// pinHead requires every workspace module another one requires at HEAD's
// pseudo-version, without replace directives, then tidies the modules it
// changed against a proxy that serves HEAD. Only HEAD's committed files are
// pinned, whatever the working tree holds.
func pinHead() error {
	root, mods, err := workspace()
	if err != nil {
		return err
	}
	head, err := headVersion(root)
	if err != nil {
		return err
	}
	var pinned []module
	for _, m := range mods {
		// A module git does not track yet is someone's work in progress:
		// leave its go.mod alone.
		if _, err := git(root, "ls-files", "--error-unmatch", path.Join(m.dir, "go.mod")); err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s is not committed; not pinned\n", m.path)
			continue
		}
		gomod, err := os.ReadFile(filepath.Join(root, m.dir, "go.mod"))
		if err != nil {
			return err
		}
		reqs := workspaceRequires(gomod, mods)
		for _, req := range reqs {
			// A replace directive makes `go install pkg@version` refuse the
			// module; go.work does its job in development.
			if err := goCmd(filepath.Join(root, m.dir), nil, "mod", "edit", "-dropreplace="+req.path, "-require="+req.path+"@"+head); err != nil {
				return err
			}
		}
		if len(reqs) > 0 {
			pinned = append(pinned, m)
		}
	}
	dir, err := os.MkdirTemp("", "modproxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := writeProxy(dir); err != nil {
		return err
	}
	env := append(proxyEnv(dir), "GOWORK=off")
	for _, m := range pinned {
		if err := goCmd(filepath.Join(root, m.dir), env, "mod", "tidy"); err != nil {
			return err
		}
	}
	fmt.Println("required at", head)
	return nil
}

// proxyEnv points the go command at dir first and at the usual proxy for
// everything else. The checksum database has never seen these versions.
func proxyEnv(dir string) []string {
	out, _ := exec.Command("go", "env", "GOPROXY").Output()
	upstream := strings.TrimSpace(string(out))
	if upstream == "" || upstream == "off" {
		upstream = "https://proxy.golang.org,direct"
	}
	abs, _ := filepath.Abs(dir)
	return []string{
		"GOPROXY=file://" + filepath.ToSlash(abs) + "," + upstream,
		"GONOSUMDB=github.com/redlimit/redlimit",
	}
}

func goCmd(dir string, env []string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s in %s: %w", strings.Join(args, " "), dir, err)
	}
	return nil
}

// workspace lists the modules of go.work, relative to the git root.
func workspace() (root string, mods []module, err error) {
	out, err := git(".", "rev-parse", "--show-toplevel")
	if err != nil {
		return "", nil, err
	}
	root = strings.TrimSpace(string(out))
	cmd := exec.Command("go", "list", "-m", "-json")
	cmd.Stderr = os.Stderr
	if out, err = cmd.Output(); err != nil {
		return "", nil, fmt.Errorf("go list -m: %w", err)
	}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var m struct{ Path, Dir string }
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			return "", nil, err
		}
		rel, err := filepath.Rel(root, m.Dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			return "", nil, fmt.Errorf("module %s at %s is outside the repository %s", m.Path, m.Dir, root)
		}
		mods = append(mods, module{path: m.Path, dir: filepath.ToSlash(rel)})
	}
	if len(mods) < 2 {
		return "", nil, errors.New("no workspace: run from the repository, with go.work in use")
	}
	return root, mods, nil
}

type requirement struct {
	path, version string
	mod           module
}

// workspaceRequires returns what a go.mod requires of the workspace modules.
// A require line is "path version" in a require block or after "require".
func workspaceRequires(gomod []byte, mods []module) []requirement {
	var reqs []requirement
	for _, line := range strings.Split(string(gomod), "\n") {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(fields) < 2 {
			continue
		}
		for _, m := range mods {
			if fields[0] == m.path {
				reqs = append(reqs, requirement{path: m.path, version: fields[1], mod: m})
			}
		}
	}
	return reqs
}

// headVersion is the pseudo-version naming HEAD: v0.0.0-TIME-COMMIT, TIME
// the commit time in UTC, as the go command names an untagged commit.
func headVersion(root string) (string, error) {
	out, err := git(root, "log", "-1", "--format=%H %ct", "HEAD")
	if err != nil {
		return "", err
	}
	var hash string
	var unix int64
	if _, err := fmt.Sscan(string(out), &hash, &unix); err != nil {
		return "", fmt.Errorf("reading HEAD: %w", err)
	}
	return "v0.0.0-" + time.Unix(unix, 0).UTC().Format("20060102150405") + "-" + hash[:12], nil
}

// commitFiles reads a module's files at a commit, as the public proxy would
// (git archive: committed files only).
func commitFiles(root, commit, dir string) (map[string][]byte, error) {
	if _, err := git(root, "cat-file", "-e", commit+"^{commit}"); err != nil {
		return nil, fmt.Errorf("commit %s is not in this clone (a shallow clone? git fetch --unshallow)", commit)
	}
	out, err := git(root, "archive", "--format=tar", commit)
	if err != nil {
		return nil, err
	}
	all := map[string][]byte{}
	for tr := tar.NewReader(bytes.NewReader(out)); ; {
		h, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue // directories, and symlinks, which module zips leave out
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		all[h.Name] = b
	}
	return moduleFiles(all, dir), nil
}

// worktreeFiles reads a module's files from the working tree: what git
// tracks or would track, as they are on disk.
func worktreeFiles(root, dir string) (map[string][]byte, error) {
	out, err := git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	all := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted but not yet committed, or a symlink
		}
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return nil, err
		}
		all[name] = b
	}
	return moduleFiles(all, dir), nil
}

// moduleFiles keeps the files of the module in dir, named relative to it:
// not those of a nested module (a directory with its own go.mod) nor of a
// vendor directory, as golang.org/x/mod/zip decides.
func moduleFiles(all map[string][]byte, dir string) map[string][]byte {
	prefix := ""
	if dir != "." {
		prefix = dir + "/"
	}
	nested := map[string]bool{}
	for name := range all {
		if rel, ok := strings.CutPrefix(name, prefix); ok && path.Base(rel) == "go.mod" && rel != "go.mod" {
			nested[path.Dir(rel)] = true
		}
	}
	files := map[string][]byte{}
	for name, b := range all {
		rel, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		if excluded(rel, nested) {
			continue
		}
		files[rel] = b
	}
	return files
}

func excluded(rel string, nested map[string]bool) bool {
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		if nested[d] || path.Base(d) == "vendor" {
			return true
		}
	}
	return false
}

// writeVersion writes $module/@v/$version.{info,mod,zip} and adds the version
// to $module/@v/list. The zip holds the files under module@version/, as the
// go command expects.
func writeVersion(dir, modPath, version string, files map[string][]byte) error {
	if files["go.mod"] == nil {
		return fmt.Errorf("%s@%s has no go.mod", modPath, version)
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escapePath(modPath)), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		w, err := zw.Create(modPath + "@" + version + "/" + name)
		if err != nil {
			return err
		}
		if _, err := w.Write(files[name]); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, versionTime(version)})
	if err != nil {
		return err
	}
	base := filepath.Join(vdir, version)
	for name, b := range map[string][]byte{".info": info, ".mod": files["go.mod"], ".zip": buf.Bytes()} {
		if err := os.WriteFile(base+name, b, 0o644); err != nil {
			return err
		}
	}
	list, _ := os.ReadFile(filepath.Join(vdir, "list"))
	if !slices.Contains(strings.Fields(string(list)), version) {
		list = append(list, version+"\n"...)
	}
	if err := os.WriteFile(filepath.Join(vdir, "list"), list, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "modproxy: %s@%s %s\n", modPath, version, hashZip(modPath+"@"+version, files))
	return nil
}

func versionTime(version string) time.Time {
	if p := pseudoVersion.FindStringSubmatch(version); p != nil {
		t, _ := time.Parse("20060102150405", p[1])
		return t
	}
	return time.Time{}
}

// hashZip is dirhash.Hash1 of the module zip: what go.sum records.
func hashZip(prefix string, files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, prefix+"/"+name)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, name := range names {
		fmt.Fprintf(h, "%x  %s\n", sha256.Sum256(files[strings.TrimPrefix(name, prefix+"/")]), name)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// escapePath is the proxy protocol's case encoding: an upper-case letter
// becomes '!' and its lower case.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
