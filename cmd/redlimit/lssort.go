package main

import (
	"bufio"
	"cmp"
	"container/heap"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"slices"
)

// lineSorter puts ls's lines in order of their names with a bounded
// memory: it holds up to runBytes of them, and past that sorts them and
// spills them to a temporary file (a run), to merge the runs at the end.
// A million limiters with long names take hundreds of megabytes as lines;
// ls holds a few.
type lineSorter struct {
	lines []sortLine
	held  int
	runs  []*os.File
}

type sortLine struct{ name, text string }

// runBytes is how much of its lines the sorter holds before it spills; a
// variable so that tests can spill small lists.
var runBytes = 4 << 20

// spillHook, when set, is called as a run is about to be written: a test's
// look at the memory held at its fullest.
var spillHook func()

func (s *lineSorter) add(name, text string) error {
	s.lines = append(s.lines, sortLine{name, text})
	s.held += len(name) + len(text) + 48 // and the headers of the strings and the line
	if s.held < runBytes {
		return nil
	}
	return s.spill()
}

func compareLines(a, b sortLine) int {
	return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.text, b.text))
}

// spill writes the lines held to a new run, sorted: each its name's and
// its text's lengths (uvarints) and bytes. The file is unlinked at once:
// it goes with the command, however that ends.
func (s *lineSorter) spill() error {
	if spillHook != nil {
		spillHook()
	}
	slices.SortFunc(s.lines, compareLines)
	f, err := os.CreateTemp("", "redlimit-ls-*")
	if err != nil {
		return err
	}
	_ = os.Remove(f.Name())
	s.runs = append(s.runs, f)
	w := bufio.NewWriter(f)
	var n [binary.MaxVarintLen64]byte
	for _, l := range s.lines {
		for _, part := range []string{l.name, l.text} {
			w.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
			w.WriteString(part)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	clear(s.lines) // the strings go now, not when overwritten
	s.lines, s.held = s.lines[:0], 0
	return nil
}

// write writes every line, by name, then flushes w.
func (s *lineSorter) write(w *bufio.Writer) error {
	if len(s.runs) == 0 {
		slices.SortFunc(s.lines, compareLines)
		for _, l := range s.lines {
			w.WriteString(l.text)
		}
		return w.Flush()
	}
	if len(s.lines) > 0 {
		if err := s.spill(); err != nil {
			return err
		}
	}
	var h runHeap
	for _, f := range s.runs {
		r := &spilledRun{r: bufio.NewReader(f)}
		if ok, err := r.next(); err != nil {
			return err
		} else if ok {
			h = append(h, r)
		}
	}
	heap.Init(&h)
	for len(h) > 0 {
		r := h[0]
		if _, err := w.WriteString(r.line.text); err != nil {
			return err
		}
		ok, err := r.next()
		switch {
		case err != nil:
			return err
		case ok:
			heap.Fix(&h, 0)
		default:
			heap.Pop(&h)
		}
	}
	return w.Flush()
}

// close drops the runs.
func (s *lineSorter) close() {
	for _, f := range s.runs {
		_ = f.Close()
	}
	s.runs = nil
}

// spilledRun reads a spilled run back, a line at a time.
type spilledRun struct {
	r    *bufio.Reader
	line sortLine
}

// next reads the run's next line; false at its end.
func (r *spilledRun) next() (bool, error) {
	var parts [2]string
	for i := range parts {
		n, err := binary.ReadUvarint(r.r)
		if i == 0 && errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r.r, b); err != nil {
			return false, err
		}
		parts[i] = string(b)
	}
	r.line = sortLine{parts[0], parts[1]}
	return true, nil
}

// runHeap orders the runs by their next line.
type runHeap []*spilledRun

func (h runHeap) Len() int           { return len(h) }
func (h runHeap) Less(i, j int) bool { return compareLines(h[i].line, h[j].line) < 0 }
func (h runHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *runHeap) Push(x any)        { *h = append(*h, x.(*spilledRun)) }
func (h *runHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}
