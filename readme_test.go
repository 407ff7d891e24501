package redlimit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// snippetPreamble gives the documentation's snippets what they take as given.
const snippetPreamble = `package snippets

import (
	"context"
	"errors"
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
	rdb    = redis.NewClient(&redis.Options{})
	client = redlimit.New(rdb)
	mux    = http.NewServeMux()

	_, _, _, _, _ = netip.MustParsePrefix, time.Second, httplimit.FromContext, redlimit.PerSecond, errors.Is
)
`

// otherModules marks a snippet that imports a module of its own (gRPC's
// interceptors, the OpenTelemetry adapter): the library's module does not
// require them, so they are left to those packages' examples, which compile
// with their modules.
var otherModules = regexp.MustCompile(`grpc|redlimitotel`)

// Every Go snippet in the README and in docs/*.md compiles as written,
// unused variables and all: each becomes a function of a package go vet
// checks, under a //line directive, so that an error names the page and
// line of the snippet.
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet")
	}
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, pages, "docs/*.md")
	pages = append([]string{"README.md"}, pages...)
	wd, err := os.Getwd() // the //line directives name pages by absolute path: vet reads them from the snippets' folder
	require.NoError(t, err)
	var src strings.Builder
	src.WriteString(snippetPreamble)
	snippets := map[string]int{}
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	for _, page := range pages {
		text, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, m := range block.FindAllSubmatchIndex(text, -1) {
			body := string(text[m[2]:m[3]])
			if otherModules.MatchString(body) {
				continue
			}
			snippets[page]++
			line := 1 + strings.Count(string(text[:m[2]]), "\n")
			fmt.Fprintf(&src, "\nfunc _() {\n//line %s:%d\n%s}\n", filepath.ToSlash(filepath.Join(wd, page)), line, body)
		}
	}
	t.Logf("snippets compiled: %v", snippets)
	require.GreaterOrEqual(t, snippets["README.md"], 2, "the README's tour")
	require.GreaterOrEqual(t, len(snippets), 8, "pages with Go snippets")
	dir, err := os.MkdirTemp(".", "readme-snippets-") // inside the module, so its imports resolve
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(dir+"/snippets.go", []byte(src.String()), 0o644))
	out, err := exec.Command("go", "vet", "./"+dir).CombinedOutput()
	require.NoError(t, err, "documentation snippets:\n%s", out)
}
