package redlimit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

//go:generate env REDLIMIT_WRITE_SCRIPTS=1 go test -run TestAssembledScriptsAreCommitted .

// Each script Redis runs is committed as assembled, in scripts/assembled,
// so that a reader, and a Redis error naming a line of a script, see the
// script itself. A change to scripts/*.lua or to what Go declares fails here
// until go generate writes them again.
func TestAssembledScriptsAreCommitted(t *testing.T) {
	write := os.Getenv("REDLIMIT_WRITE_SCRIPTS") == "1"
	for _, s := range []*script{tokenBucket.script, funnel.script, fixedWindow.script, slidingWindow.script, batchScript, inflightScript} {
		path := filepath.Join("scripts", "assembled", s.name+".lua")
		if write {
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte(s.src), 0o644))
			continue
		}
		committed, err := os.ReadFile(path)
		require.NoError(t, err, "run go generate")
		require.Equal(t, s.src, string(committed), "%s differs from the script Redis runs: run go generate", path)
	}
}
