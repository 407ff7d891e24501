package generations

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A key found in the previous generation moves to the current one; the
// current one flips once it holds perGeneration and both flipAt, and the
// generation dropped is returned; a value kept already is kept.
func TestGenerations(t *testing.T) {
	m := New[int, string](2, 4)
	for k, v := range []string{"a", "b", "c"} {
		kept, dropped := m.Keep(k, v)
		assert.Equal(t, v, kept)
		assert.Nil(t, dropped, "2 + 0 < 4: no flip yet")
	}
	kept, _ := m.Keep(0, "other")
	assert.Equal(t, "a", kept, "the value kept stays")
	_, dropped := m.Keep(3, "d")
	assert.Empty(t, dropped, "3 + 0 < 4: no flip") // current holds 0..3 now
	_, dropped = m.Keep(4, "e")
	assert.Empty(t, dropped, "the first flip drops an empty generation")
	assert.Equal(t, 5, m.Len())

	v, found, current := m.Get(1)
	assert.Equal(t, "b", v)
	assert.True(t, found)
	assert.False(t, current, "in the previous generation")
	m.Keep(1, v) // moves it
	_, _, current = m.Get(1)
	assert.True(t, current)

	_, dropped = m.Keep(5, "f") // current {4, 1}, previous {0, 2, 3}: 2 + 3 >= 4 flips before 5 goes in
	assert.Equal(t, map[int]string{0: "a", 2: "c", 3: "d"}, dropped, "the previous generation, less the key moved")
	_, found, _ = m.Get(0)
	assert.False(t, found)
	for k, want := range map[int]string{4: "e", 1: "b", 5: "f"} {
		v, found, _ := m.Get(k)
		assert.True(t, found, "%d", k)
		assert.Equal(t, want, v)
	}
	assert.Equal(t, 3, m.Len())
}

// Many keys passing through never hold more than perGeneration + flipAt.
func TestGenerationsBound(t *testing.T) {
	m := New[int, int](100, 200)
	most := 0
	for k := range 10_000 {
		m.Keep(k, k)
		most = max(most, m.Len())
	}
	assert.LessOrEqual(t, most, 300)
}
