package evalsha

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/redlimit/redlimit/internal/wire"
)

// The scripts name the contract only through internal/wire's constants
// (the header the assembler writes): a quoted literal in a script that is
// one of the contract's names (a hash field, an op, an algorithm, a key
// suffix, a reply) is a copy that can drift from Go's, and fails here.
func TestScriptsSpellNoContractName(t *testing.T) {
	names := map[string]bool{}
	add := func(ss ...string) {
		for _, s := range ss {
			names[s] = true
		}
	}
	add(wire.ConfigFields...)
	add(wire.HashFields...)
	add(wire.FieldLimit, wire.FieldTTL, wire.InFlightAlgorithm)
	for _, a := range wire.Algorithms {
		add(a.Name)
		add(a.Fields...)
		add(a.State...)
	}
	for _, op := range []wire.Op{wire.OpAllow, wire.OpCharge, wire.OpReserve, wire.OpRelease, wire.OpGet, wire.OpSet,
		wire.OpTrySet, wire.OpReset, wire.OpDelete, wire.OpExpire, wire.OpPersist, wire.OpTTL, wire.OpClients, wire.OpShadow,
		wire.OpDiagnose, wire.OpSettle, wire.OpCheck, wire.OpAcquire, wire.OpRefresh, wire.OpHoldRelease, wire.OpHolders} {
		add(string(op))
	}
	add(string(wire.SourceDefault), string(wire.SourceStored), string(wire.SourceFixed), string(wire.SourceNew))
	add(wire.ReplyPerClient, wire.ReplyAdmin, wire.ReplyMissing, wire.ReplyFullScript)
	literal := regexp.MustCompile(`'([^'\\]*)'`)
	files, err := filepath.Glob("../../scripts/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("scripts: %v", err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			code, _, _ := strings.Cut(line, "--")
			for _, m := range literal.FindAllStringSubmatch(code, -1) {
				if names[m[1]] {
					t.Errorf("%s:%d: %q is internal/wire's: name it by its constant", filepath.Base(file), i+1, m[1])
				}
			}
		}
	}
}
