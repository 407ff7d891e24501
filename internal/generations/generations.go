// Package generations keeps what was used recently in a map of bounded
// size, in two generations: a key found in the previous generation moves
// to the current one, and once the current one is full, it becomes the
// previous one and the previous one is dropped. What is in use so stays,
// however many keys pass through, at a lookup's cost: exact recency (an
// LRU list) would take a lock on every lookup, where this takes a read
// lock (and a plain map with a struct key allocates nothing, where a
// sync.Map boxes the key).
package generations

import "sync"

// Map is a map of recently used values, in two generations. It holds at
// most perGeneration + flipAt entries (New).
type Map[K comparable, V any] struct {
	mu                sync.RWMutex
	current, previous map[K]V
	perGeneration     int
	flipAt            int
}

// New returns a Map whose current generation becomes the previous one once
// it holds perGeneration entries and both together flipAt (at least
// perGeneration): with flipAt twice perGeneration, a set of up to that many
// keys in use is kept whole, as their moves drain the previous generation
// before it flips.
func New[K comparable, V any](perGeneration, flipAt int) *Map[K, V] {
	return &Map[K, V]{current: make(map[K]V), perGeneration: perGeneration, flipAt: max(flipAt, perGeneration)}
}

// Get returns the value under k, whether there is one, and whether it is
// in the current generation: one in the previous generation is moved by
// Keep.
func (m *Map[K, V]) Get(k K) (v V, found, current bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if v, current = m.current[k]; current {
		return v, true, true
	}
	v, found = m.previous[k]
	return v, found, false
}

// Keep puts v under k in the current generation, unless the current
// generation holds a value under k already: it returns the value kept. If
// making room started a new generation, dropped is the generation that
// went (it holds no value under k).
func (m *Map[K, V]) Keep(k K, v V) (kept V, dropped map[K]V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if kept, ok := m.current[k]; ok {
		return kept, nil // another caller's, kept meanwhile
	}
	delete(m.previous, k) // moving to the current generation
	if len(m.current) >= m.perGeneration && len(m.current)+len(m.previous) >= m.flipAt {
		dropped = m.previous
		m.previous, m.current = m.current, make(map[K]V)
	}
	m.current[k] = v
	return v, dropped
}

// Len is the number of entries kept, in both generations.
func (m *Map[K, V]) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.current) + len(m.previous)
}
