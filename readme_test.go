package redlimit

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// snippetPreamble gives README snippets what they take as given.
const snippetPreamble = `package snippets

import (
	"context"
	"net/http"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

var (
	ctx    = context.Background()
	id     = "42"
	client = redlimit.New(redis.NewClient(&redis.Options{}))
	mux    = http.NewServeMux()

	_, _, _, _ = netip.MustParsePrefix, time.Second, httplimit.FromContext, redlimit.PerSecond
)
`

// Every Go snippet in the README compiles as written, unused variables and
// all: each becomes a function of a package go vet checks. (The gRPC
// snippet's module is a separate one; grpclimit's Example covers it.)
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet")
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var src strings.Builder
	src.WriteString(snippetPreamble)
	snippets := 0
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		if strings.Contains(m[1], "grpc") {
			continue
		}
		snippets++
		src.WriteString("\nfunc _() {\n" + m[1] + "}\n")
	}
	require.GreaterOrEqual(t, snippets, 4)
	dir, err := os.MkdirTemp(".", "readme-snippets-") // inside the module, so its imports resolve
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(dir+"/snippets.go", []byte(src.String()), 0o644))
	out, err := exec.Command("go", "vet", "./"+dir).CombinedOutput()
	require.NoError(t, err, "README snippets:\n%s", out)
}
