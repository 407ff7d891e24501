package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"image/color"
	"image/png"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// TestGlyphArt: every glyph is drawn in its grid, five pixels by at most
// nine rows, so that a typo in the art cannot shift a glyph unseen.
func TestGlyphArt(t *testing.T) {
	for r, art := range glyphArt {
		rows := strings.Fields(art)
		if len(rows) > glyphRows {
			t.Errorf("%q: %d rows, want at most %d", r, len(rows), glyphRows)
		}
		for _, row := range rows {
			if len(row) != glyphWidth || strings.Trim(row, ".#") != "" {
				t.Errorf("%q: row %q, want %d of '.' and '#'", r, row, glyphWidth)
			}
		}
	}
	for r := rune(' '); r <= '~'; r++ {
		if _, ok := glyphs[r]; !ok {
			t.Errorf("no glyph for %q", r)
		}
	}
}

// comparisons simulates a run of each pattern, and one with a further rate,
// several instances and leases: every kind of chart compare draws.
func comparisons(t *testing.T) []comparison {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	scenarios := []scenario{{pattern: "steady", cfg: redlimit.PerSecond(10).And(redlimit.Per(25, 4*time.Second)), length: 8 * time.Second,
		instances: 3, lease: 500 * time.Microsecond}}
	for _, pattern := range patternNames() {
		scenarios = append(scenarios, scenario{pattern: pattern, cfg: redlimit.PerSecond(10), length: 4 * time.Second, instances: 1})
	}
	var cs []comparison
	for _, s := range scenarios {
		c, err := simulate(context.Background(), rdb, s)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

// TestChartText: the image says what the terminal chart says, every panel's
// reading and numbers, and the PNG's font has every character of it.
func TestChartText(t *testing.T) {
	for _, c := range comparisons(t) {
		var svg bytes.Buffer
		if err := c.figure().writeSVG(&svg); err != nil {
			t.Fatal(err)
		}
		var text []string // the SVG's text elements, unescaped
		for d := xml.NewDecoder(&svg); ; {
			tok, err := d.Token()
			if err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: not XML: %v", c.pattern, err)
			}
			if s, ok := tok.(xml.CharData); ok && strings.TrimSpace(string(s)) != "" {
				text = append(text, string(s))
			}
		}
		all := strings.Join(text, " ")
		want := []string{c.headline(), "requests offered per 100ms", "granted per 100ms", "granted in the last 1s", "limit", "requests", "seconds"}
		for i, r := range c.results {
			want = append(want, r.about, c.measured(r))
			if c.leased != nil {
				want = append(want, c.measured(c.leased[i]))
			}
		}
		for _, w := range want {
			// Titles are wrapped: compare word by word.
			if !strings.Contains(all, strings.Join(strings.Fields(w), " ")) {
				t.Errorf("%s: the chart lacks %q", c.pattern, w)
			}
		}
		for _, r := range all {
			if _, ok := glyphs[r]; !ok {
				t.Errorf("%s: no glyph for %q", c.pattern, r)
			}
		}
	}
}

// TestChartPNG: the PNG shows each series in its colour, and two runs side
// by side are twice as wide.
func TestChartPNG(t *testing.T) {
	cs := comparisons(t)
	for _, c := range cs {
		var out bytes.Buffer
		if err := c.figure().writePNG(&out); err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(&out)
		if err != nil {
			t.Fatal(err)
		}
		want := map[color.RGBA]string{
			lighter(offeredColour): "offered bars", lighter(grantedColour): "granted bars",
			rollingColour: "the last interval's line", limitColour: "the limit (and text)",
		}
		seen := map[color.RGBA]int{}
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				r, g, bl, a := img.At(x, y).RGBA()
				seen[color.RGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(bl >> 8), A: uint8(a >> 8)}]++
			}
		}
		for colour, what := range want {
			if seen[colour] < 100 {
				t.Errorf("%s: %d pixels of %s", c.pattern, seen[colour], what)
			}
		}
		if columns := 1 + min(len(c.leased), 1); b.Dx() != columns*columnWidth {
			t.Errorf("%s: %d pixels wide, want %d", c.pattern, b.Dx(), columns*columnWidth)
		}
	}
}

func TestDashes(t *testing.T) {
	s := stroke{points: []point{{0, 0}, {10, 0}, {10, 16}}, dash: []float64{8, 5}}
	// 26 long: on to 8, off to 13, on to 21 (across the corner), off.
	want := [][2]point{{{0, 0}, {8, 0}}, {{10, 3}, {10, 11}}}
	if got := s.segments(); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestNiceStep(t *testing.T) {
	for least, want := range map[float64]float64{0.2: 1, 1: 1, 1.5: 2, 3: 5, 5: 5, 6: 10, 12.5: 20, 30: 50, 75: 100, 250: 500} {
		if got := niceStep(least); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", least, got, want)
		}
	}
}

func TestWrap(t *testing.T) {
	// 12 pixels a character: 10 characters fit 119 pixels.
	got := wrap("one two three\nfour", 119)
	if want := []string{"one two", "three", "four"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
