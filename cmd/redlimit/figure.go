package main

import (
	"fmt"
	"html"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"
)

// A figure is a picture made of three kinds of marks, placed in pixels once
// and written either as SVG (text the viewer draws, in a monospace font) or as
// PNG (drawn here, with font.go's bitmap font). That is all compare's charts
// need: a plotting library brought ~50 packages and their fonts into the
// first `go run` of a demo that prints text.
type figure struct {
	width, height int
	marks         []mark
}

type mark interface {
	svg(w io.Writer)
	draw(r *raster)
}

// A box is a filled rectangle.
type box struct {
	x, y, w, h float64
	fill       color.RGBA
}

// A stroke is a polyline; with dash, drawn dash[0] on, dash[1] off.
type stroke struct {
	points []point
	colour color.RGBA
	width  float64
	dash   []float64
}

type point struct{ x, y float64 }

// A label is one line of text; y is its baseline, or with vertical set it
// reads upwards and x is its baseline.
type label struct {
	x, y     float64
	text     string
	anchor   anchor
	colour   color.RGBA
	vertical bool
}

// anchor is the point of a label its x (or, vertical, its y) gives.
type anchor int

const (
	atStart anchor = iota
	atMiddle
	atEnd
)

// textScale enlarges the bitmap font's pixels: 9 rows become 18, about the
// size of 13-point text at 96 dots per inch.
const (
	textScale  = 2
	textHeight = glyphRows * textScale
	textAscent = glyphAscent * textScale // from a label's top to its baseline
	lineHeight = textHeight + 4
)

// labelWidth is how wide a label is drawn in the PNG, and in the SVG: its
// monospace font, at 20 pixels, advances 0.6 em (12 pixels) a character, as
// the bitmap font does, so one layout serves both.
func labelWidth(s string) float64 { return float64(textWidth(s) * textScale) }

func (f *figure) add(m ...mark) { f.marks = append(f.marks, m...) }

// writeSVG writes the figure as an SVG document.
func (f *figure) writeSVG(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %[1]d %[2]d" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="20">`+"\n", f.width, f.height)
	fmt.Fprintln(ew, `<rect width="100%" height="100%" fill="#ffffff"/>`)
	for _, m := range f.marks {
		m.svg(ew)
	}
	fmt.Fprintln(ew, "</svg>")
	return ew.err
}

// errWriter keeps the first error, so that the SVG writer checks once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (b box) svg(w io.Writer) {
	fmt.Fprintf(w, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(b.x), num(b.y), num(b.w), num(b.h), hexColour(b.fill))
}

func (s stroke) svg(w io.Writer) {
	var pts []string
	for _, p := range s.points {
		pts = append(pts, num(p.x)+","+num(p.y))
	}
	dash := ""
	if len(s.dash) == 2 {
		dash = fmt.Sprintf(` stroke-dasharray="%s %s"`, num(s.dash[0]), num(s.dash[1]))
	}
	fmt.Fprintf(w, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%s" stroke-linejoin="round"%s/>`+"\n",
		strings.Join(pts, " "), hexColour(s.colour), num(s.width), dash)
}

func (l label) svg(w io.Writer) {
	where := fmt.Sprintf(`x="%s" y="%s"`, num(l.x), num(l.y))
	if l.vertical {
		where = fmt.Sprintf(`transform="translate(%s,%s) rotate(-90)"`, num(l.x), num(l.y))
	}
	fmt.Fprintf(w, `<text %s text-anchor="%s" fill="%s">%s</text>`+"\n",
		where, [...]string{"start", "middle", "end"}[l.anchor], hexColour(l.colour), html.EscapeString(l.text))
}

// num writes a coordinate to a hundredth of a pixel: finer changes nothing
// a viewer shows, and the file stays small.
func num(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

func hexColour(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// writePNG draws the figure and writes it as a PNG.
func (f *figure) writePNG(w io.Writer) error {
	r := &raster{img: image.NewRGBA(image.Rect(0, 0, f.width, f.height))}
	r.cover = make([]float32, f.width*f.height)
	draw.Draw(r.img, r.img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	for _, m := range f.marks {
		m.draw(r)
	}
	return png.Encode(w, r.img)
}

// raster is a PNG being drawn. cover holds the coverage of the stroke being
// drawn, pixel by pixel, so that where its segments meet a pixel is painted
// once, as much as the segment nearest it covers: painting per segment
// would darken every joint of an anti-aliased line.
type raster struct {
	img   *image.RGBA
	cover []float32
}

func (b box) draw(r *raster) {
	rect := image.Rect(int(math.Round(b.x)), int(math.Round(b.y)), int(math.Round(b.x+b.w)), int(math.Round(b.y+b.h)))
	draw.Draw(r.img, rect, image.NewUniform(b.fill), image.Point{}, draw.Src)
}

func (s stroke) draw(r *raster) {
	dirty := image.Rectangle{}
	for _, seg := range s.segments() {
		dirty = dirty.Union(r.coverSegment(seg[0], seg[1], s.width))
	}
	dirty = dirty.Intersect(r.img.Bounds())
	for y := dirty.Min.Y; y < dirty.Max.Y; y++ {
		for x := dirty.Min.X; x < dirty.Max.X; x++ {
			i := y*r.img.Bounds().Dx() + x
			if a := r.cover[i]; a > 0 {
				r.blend(x, y, s.colour, a)
				r.cover[i] = 0
			}
		}
	}
}

// segments cuts the polyline into the pieces that are drawn: all of it, or
// its dashes, which run on across its corners as SVG's do.
func (s stroke) segments() [][2]point {
	var out [][2]point
	if len(s.dash) != 2 {
		for i := 1; i < len(s.points); i++ {
			out = append(out, [2]point{s.points[i-1], s.points[i]})
		}
		return out
	}
	on, left := true, s.dash[0] // drawing or not, and for how much longer
	for i := 1; i < len(s.points); i++ {
		a, b := s.points[i-1], s.points[i]
		length := math.Hypot(b.x-a.x, b.y-a.y)
		for done := 0.0; done < length; {
			step := min(left, length-done)
			if on {
				from, to := done/length, (done+step)/length
				out = append(out, [2]point{
					{a.x + (b.x-a.x)*from, a.y + (b.y-a.y)*from},
					{a.x + (b.x-a.x)*to, a.y + (b.y-a.y)*to},
				})
			}
			done += step
			if left -= step; left <= 1e-9 {
				on, left = !on, s.dash[1]
				if on {
					left = s.dash[0]
				}
			}
		}
	}
	return out
}

// coverSegment records how much of each pixel a segment of width w covers,
// from the distance of the pixel's centre to it (a pixel wide edge of
// anti-aliasing), and returns the pixels it touched.
func (r *raster) coverSegment(a, b point, w float64) image.Rectangle {
	reach := w/2 + 1
	touched := image.Rect(
		int(math.Floor(min(a.x, b.x)-reach)), int(math.Floor(min(a.y, b.y)-reach)),
		int(math.Ceil(max(a.x, b.x)+reach)), int(math.Ceil(max(a.y, b.y)+reach)),
	).Intersect(r.img.Bounds())
	dx, dy := b.x-a.x, b.y-a.y
	lengthSq := dx*dx + dy*dy
	stride := r.img.Bounds().Dx()
	for y := touched.Min.Y; y < touched.Max.Y; y++ {
		for x := touched.Min.X; x < touched.Max.X; x++ {
			px, py := float64(x)+0.5, float64(y)+0.5
			t := 0.0
			if lengthSq > 0 {
				t = max(0, min(1, ((px-a.x)*dx+(py-a.y)*dy)/lengthSq))
			}
			d := math.Hypot(px-(a.x+t*dx), py-(a.y+t*dy))
			if c := float32(max(0, min(1, w/2+0.5-d))); c > r.cover[y*stride+x] {
				r.cover[y*stride+x] = c
			}
		}
	}
	return touched
}

// blend paints c over pixel (x, y) with opacity a.
func (r *raster) blend(x, y int, c color.RGBA, a float32) {
	old := r.img.RGBAAt(x, y)
	mix := func(from, to uint8) uint8 { return uint8(math.Round(float64(float32(from)*(1-a) + float32(to)*a))) }
	r.img.SetRGBA(x, y, color.RGBA{R: mix(old.R, c.R), G: mix(old.G, c.G), B: mix(old.B, c.B), A: 255})
}

func (l label) draw(r *raster) {
	width := labelWidth(l.text)
	along := [...]float64{0, width / 2, width}[l.anchor] // from the anchor back to the start
	u := -along                                          // along the text, from the anchor
	for _, c := range l.text {
		g := glyphOf(c)
		for row := range glyphRows {
			for col := range glyphWidth {
				if g[row]>>(glyphWidth-1-col)&1 == 0 {
					continue
				}
				// v: across the text, from the baseline down.
				gu, v := u+float64(col*textScale), float64((row-glyphAscent)*textScale)
				x, y := l.x+gu, l.y+v
				if l.vertical { // turned a quarter anticlockwise about the anchor
					x, y = l.x+v, l.y-gu-textScale
				}
				ix, iy := int(math.Round(x)), int(math.Round(y))
				draw.Draw(r.img, image.Rect(ix, iy, ix+textScale, iy+textScale), image.NewUniform(l.colour), image.Point{}, draw.Src)
			}
		}
		u += float64((glyphWidth + 1) * textScale)
	}
}
