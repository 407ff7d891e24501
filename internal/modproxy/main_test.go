package main

import (
	"slices"
	"testing"
)

// TestModuleZip: the files a module zip holds and the go.sum hash of that zip
// are those golang.org/x/mod/zip.CreateFromDir and dirhash.HashZip give for
// the same tree (computed with them once; the value is theirs). A different
// hash would make every go.sum line this proxy produced wrong for users.
func TestModuleZip(t *testing.T) {
	tree := map[string][]byte{
		"go.mod":        []byte("module example.com/m\n"),
		"a.go":          []byte("package m\n"),
		"sub/b.go":      []byte("package sub\n"),
		"nested/go.mod": []byte("module example.com/m/nested\n"), // another module
		"nested/c.go":   []byte("package nested\n"),
		"vendor/v/d.go": []byte("package v\n"),
	}
	files := moduleFiles(tree, ".")
	var names []string
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{"a.go", "go.mod", "sub/b.go"}; !slices.Equal(names, want) {
		t.Errorf("module files %q, want %q", names, want)
	}
	if got, want := hashZip("example.com/m@v1.0.0", files), "h1:Zm8pR5RP2JYxVZ0UERLcxQkNi1H43SlifoD2tNj6hq0="; got != want {
		t.Errorf("hash %s, want %s", got, want)
	}

	nested := moduleFiles(tree, "nested")
	if len(nested) != 2 || nested["go.mod"] == nil || nested["c.go"] == nil {
		t.Errorf("the nested module's files: %v", nested)
	}
}

func TestEscapePath(t *testing.T) {
	if got := escapePath("github.com/BurntSushi/toml"); got != "github.com/!burnt!sushi/toml" {
		t.Errorf("got %s", got)
	}
}
