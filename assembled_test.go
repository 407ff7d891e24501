package redlimit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/stretchr/testify/require"
)

//go:generate env REDLIMIT_WRITE_SCRIPTS=1 go test -run TestAssembledScriptsAreCommitted .

// Each script Redis runs is committed as assembled, in scripts/assembled,
// so that a reader, and a Redis error naming a line of a script, see the
// script itself. A change to scripts/*.lua or to what Go declares fails here
// until go generate writes them again.
func TestAssembledScriptsAreCommitted(t *testing.T) {
	write := os.Getenv("REDLIMIT_WRITE_SCRIPTS") == "1"
	dir := filepath.Join("scripts", "assembled")
	want := map[string]bool{}
	for _, s := range scripts.All() {
		path := filepath.Join(dir, s.Name+".lua")
		want[s.Name+".lua"] = true
		require.True(t, strings.HasPrefix(s.Source, evalsha.Banner), "%s: every assembled script says it is generated", s.Name)
		if write {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(path, []byte(s.Source), 0o644))
			continue
		}
		committed, err := os.ReadFile(path)
		require.NoError(t, err, "run go generate")
		require.Equal(t, s.Source, string(committed), "%s differs from the script Redis runs: run go generate", path)
	}
	// No script of an earlier layout is left behind.
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if !want[e.Name()] {
			if write {
				require.NoError(t, os.Remove(filepath.Join(dir, e.Name())))
				continue
			}
			t.Errorf("%s: no script Redis runs: run go generate", filepath.Join(dir, e.Name()))
		}
	}
}
