package main

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/guptarohit/asciigraph"
)

// isTerminal reports whether w is a terminal, to decide on colours and on
// progress redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// terminalChart draws, per algorithm, what it granted per tick and in the
// last interval against the limit, all on one scale so the panels compare;
// with leases, the leased run's right below the run without.
func (c comparison) terminalChart(colour bool) string {
	var b strings.Builder
	seconds := float64(len(c.offered)) * c.tick.Seconds()
	top := float64(2 * c.cfg.Rate)
	for _, r := range slices.Concat(c.results, c.leased) {
		top = max(top, float64(max(slicesMax(r.rolling), slicesMax(c.offered))))
	}
	// The limit is drawn first, so the lines drawn over it stay visible.
	chars := []string{"=", "─", "*"}
	colours := []asciigraph.AnsiColor{asciigraph.Green, asciigraph.Blue, asciigraph.Red}
	plot := func(heading string, first int, series [][]float64, legends ...string) {
		b.WriteString(heading + "\n")
		o := []asciigraph.Option{
			asciigraph.Height(8), asciigraph.LowerBound(0), asciigraph.UpperBound(top), asciigraph.Precision(0),
			asciigraph.XAxisRange(0, seconds), asciigraph.XAxisTickCount(int(seconds/c.cfg.Interval.Seconds()) + 1),
			asciigraph.XAxisValueFormatter(func(x float64) string { return fmt.Sprintf("%gs", x) }),
		}
		if colour {
			o = append(o, asciigraph.SeriesColors(colours[first:first+len(series)]...), asciigraph.SeriesLegends(legends...))
		} else {
			// Without colour the characters tell the series apart, and the
			// legend is ours: asciigraph's is made of colour codes.
			sets := []asciigraph.CharSet{asciigraph.CreateCharSet("="), asciigraph.DefaultCharSet, asciigraph.CreateCharSet("*")}
			o = append(o, asciigraph.SeriesChars(sets[first:first+len(series)]...))
		}
		b.WriteString(asciigraph.PlotMany(series, o...) + "\n")
		if !colour {
			for i, l := range legends {
				fmt.Fprintf(&b, "   %s %s", chars[first+i], l)
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}

	plot(c.headline()+".\n", 1, [][]float64{floats(c.offered)}, "requests offered per "+c.tick.String())
	limit := constant(float64(c.cfg.Rate), len(c.offered))
	for i, r := range c.results {
		runs := []string{r.about + "\n" + c.measured(r) + ":"}
		granted := []algorithmResult{r}
		if c.leased != nil {
			runs[0] = r.about + "\nwithout leases: " + c.measured(r) + ":"
			runs = append(runs, "with leases of "+c.lease.String()+": "+c.measured(c.leased[i])+":")
			granted = append(granted, c.leased[i])
		}
		for j, heading := range runs {
			plot(heading, 0,
				[][]float64{limit, floats(granted[j].granted), floats(granted[j].rolling)},
				"limit", "granted per "+c.tick.String(), "granted in the last "+c.cfg.Interval.String())
		}
	}
	return b.String()
}

// headline says what was offered to whom.
func (c comparison) headline() string {
	s := fmt.Sprintf("Traffic %q: %s. Limit: %v for every algorithm", c.pattern, patterns[c.pattern].about, c.cfg)
	if c.instances > 1 {
		s += fmt.Sprintf(", shared by %d instances taking the requests in turn", c.instances)
	}
	return s
}

// Colours of the image: what was offered, granted, granted in the last
// interval, and the limit.
var (
	offeredColour = color.RGBA{R: 120, G: 120, B: 120, A: 255}
	grantedColour = color.RGBA{R: 66, G: 133, B: 244, A: 255}
	rollingColour = color.RGBA{R: 219, G: 68, B: 55, A: 255}
	limitColour   = color.RGBA{A: 255}
	gridColour    = color.RGBA{R: 225, G: 225, B: 225, A: 255}
	axisColour    = color.RGBA{R: 80, G: 80, B: 80, A: 255}
	textColour    = color.RGBA{A: 255}
)

// The image's layout, in pixels. A column is about 100 characters wide, so
// that a panel's title, with its numbers, takes a line or two.
const (
	columnWidth = 1240
	imageMargin = 16
	plotLeft    = 90 // from a column's edge: room for the y axis's numbers and "requests"
	plotRight   = 28
	plotHeight  = 180
	rowGap      = 26
	lineWidth   = 2.5 // a series' line: 2 points at 96 dots per inch
)

// levelDashes dash the limit's line, which the others often run along.
var levelDashes = []float64{8, 5}

// saveImage draws the comparison to a PNG or SVG file (by its extension):
// the offered traffic on top, then one panel per algorithm, on one scale;
// with leases, a column for the run without and one for the run with.
func (c comparison) saveImage(path string) error {
	f := c.figure()
	var out bytes.Buffer
	var err error
	if strings.EqualFold(filepath.Ext(path), ".svg") {
		err = f.writeSVG(&out)
	} else {
		err = f.writePNG(&out)
	}
	if err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// A panel is one chart of the image: a title, a legend, and series on axes
// from 0 to the run's length and from 0 to top.
type panel struct {
	title  []string // lines, wrapped to the panel's width
	top    float64
	series []series
}

// A series is one thing a panel draws, with its legend entry.
type series struct {
	legend string
	kind   seriesKind
	values []float64 // per tick; a level's is its one value
	colour color.RGBA
}

type seriesKind int

const (
	bars  seriesKind = iota // a count per tick, as bars with no gaps
	line                    // a value at each tick's end, joined
	level                   // a constant across the panel, dashed
)

// figure lays the comparison out: the offered traffic across the top,
// then a row per algorithm, with a column per run.
func (c comparison) figure() *figure {
	top := float64(2 * c.cfg.Rate)
	for _, r := range slices.Concat(c.results, c.leased) {
		top = max(top, float64(slicesMax(r.rolling)))
	}
	cols := 1
	if c.leased != nil {
		cols = 2
	}
	titleWidth := float64(columnWidth - 2*imageMargin)
	granted := func(title string, r algorithmResult) panel {
		return panel{title: wrap(title, titleWidth), top: top, series: []series{
			{"granted per " + c.tick.String(), bars, floats(r.granted), grantedColour},
			{"granted in the last " + c.cfg.Interval.String(), line, floats(r.rolling), rollingColour},
			{"limit", level, []float64{float64(c.cfg.Rate)}, limitColour},
		}}
	}
	// The offered traffic spans the columns: it is the same for both runs.
	rows := [][]panel{{{
		title: wrap(c.headline(), float64(cols)*titleWidth), top: max(top, float64(slicesMax(c.offered))),
		series: []series{{"requests offered per " + c.tick.String(), bars, floats(c.offered), offeredColour}},
	}}}
	for i, r := range c.results {
		if c.leased == nil {
			rows = append(rows, []panel{granted(r.about+"\n"+c.measured(r), r)})
			continue
		}
		rows = append(rows, []panel{
			granted(r.about+"\nwithout leases: "+c.measured(r), r),
			granted("with leases of "+c.lease.String()+": "+c.measured(c.leased[i]), c.leased[i]),
		})
	}

	// A row's titles take as many lines as its longest, then come the
	// legend, the plot and the axis's numbers; the last row says "seconds"
	// under its axes.
	titleLines := make([]int, len(rows))
	rowHeight := func(i int) int {
		return (titleLines[i]+1)*lineHeight + 6 + plotHeight + 8 + lineHeight + rowGap
	}
	f := &figure{width: cols * columnWidth, height: 2*imageMargin - rowGap + lineHeight}
	for i, row := range rows {
		for _, p := range row {
			titleLines[i] = max(titleLines[i], len(p.title))
		}
		f.height += rowHeight(i)
	}

	y := float64(imageMargin)
	for i, row := range rows {
		width := float64(f.width) / float64(len(row))
		for j, p := range row {
			left := float64(j) * width
			for k, text := range p.title {
				f.add(label{x: left + width/2, y: y + float64(k*lineHeight+textAscent), text: text, anchor: atMiddle, colour: textColour})
			}
			area := rectangle{left + plotLeft, y + float64((titleLines[i]+1)*lineHeight+6), width - plotLeft - plotRight, plotHeight}
			c.plot(f, p, area, i == len(rows)-1)
		}
		y += float64(rowHeight(i))
	}
	return f
}

// rectangle is a panel's plotting area.
type rectangle struct{ x, y, w, h float64 }

// plot draws a panel's series in area, its axes around it and its legend
// just above it; xLabel names the x axis.
func (c comparison) plot(f *figure, p panel, area rectangle, xLabel bool) {
	seconds := float64(len(c.offered)) * c.tick.Seconds()
	tick := c.tick.Seconds()
	yStep := niceStep(p.top / 4)
	yTop := math.Ceil(p.top*1.1/yStep) * yStep // a little room above the highest line
	at := func(s, v float64) point {
		return point{area.x + s/seconds*area.w, area.y + area.h - v/yTop*area.h}
	}
	// Grid lines on the pixel's centre, so that they are one pixel, sharp.
	crisp := func(v float64) float64 { return math.Floor(v) + 0.5 }
	// Numbered every interval, or every few when that would crowd them;
	// counted in durations, so that 0.3 does not read 0.30000000000000004.
	var xTicks, yTicks []float64
	every := time.Duration(labelEvery(area.w*c.cfg.Interval.Seconds()/seconds, 60)) * c.cfg.Interval
	for t := time.Duration(0); t <= time.Duration(len(c.offered))*c.tick; t += every {
		xTicks = append(xTicks, t.Seconds())
	}
	for k := 0; float64(k)*yStep <= yTop+1e-9; k++ {
		yTicks = append(yTicks, float64(k)*yStep)
	}
	for _, s := range xTicks {
		x := crisp(at(s, 0).x)
		f.add(stroke{points: []point{{x, area.y}, {x, area.y + area.h}}, colour: gridColour, width: 1})
	}
	for _, v := range yTicks {
		y := crisp(at(0, v).y)
		f.add(stroke{points: []point{{area.x, y}, {area.x + area.w, y}}, colour: gridColour, width: 1})
	}

	for _, s := range p.series {
		switch s.kind {
		case bars:
			var outline []point
			for i, n := range s.values {
				// Bars on whole pixels: adjacent ones would show a seam
				// where a viewer anti-aliases their shared edge.
				from, to := at(float64(i)*tick, n), at(float64(i+1)*tick, n)
				from.x, to.x, from.y = math.Round(from.x), math.Round(to.x), math.Round(from.y)
				if n > 0 {
					f.add(box{from.x, from.y, to.x - from.x, math.Round(at(0, 0).y) - from.y, lighter(s.colour)})
				}
				outline = append(outline, from, to)
			}
			f.add(stroke{points: outline, colour: s.colour, width: 1})
		case line:
			var points []point
			for i, v := range s.values {
				points = append(points, at(float64(i+1)*tick, v))
			}
			f.add(stroke{points: points, colour: s.colour, width: lineWidth})
		case level:
			f.add(stroke{points: []point{at(0, s.values[0]), at(seconds, s.values[0])}, colour: s.colour, width: lineWidth, dash: levelDashes})
		}
	}

	// The axes, their ticks and their numbers.
	bottom, left := crisp(area.y+area.h), crisp(area.x)
	f.add(stroke{points: []point{{left, area.y}, {left, bottom}, {area.x + area.w, bottom}}, colour: axisColour, width: 1})
	for _, s := range xTicks {
		x := crisp(at(s, 0).x)
		f.add(stroke{points: []point{{x, bottom}, {x, bottom + 5}}, colour: axisColour, width: 1},
			label{x: x, y: bottom + 8 + textAscent, text: strconv.FormatFloat(s, 'f', -1, 64), anchor: atMiddle, colour: textColour})
	}
	for _, v := range yTicks {
		y := crisp(at(0, v).y)
		f.add(stroke{points: []point{{left - 5, y}, {left, y}}, colour: axisColour, width: 1},
			label{x: left - 9, y: y + textAscent/2, text: strconv.FormatFloat(v, 'f', -1, 64), anchor: atEnd, colour: textColour})
	}
	f.add(label{x: area.x - plotLeft + 6 + textAscent, y: area.y + area.h/2, text: "requests", anchor: atMiddle, colour: textColour, vertical: true})
	if xLabel {
		f.add(label{x: area.x + area.w/2, y: bottom + 8 + lineHeight + textAscent, text: "seconds", anchor: atMiddle, colour: textColour})
	}

	// The legend, in one line above the plot, where it hides nothing.
	x, baseline := area.x, area.y-8
	for _, s := range p.series {
		swatch := point{x, baseline - textAscent/2}
		switch s.kind {
		case bars:
			f.add(box{swatch.x, swatch.y - 6, 28, 12, lighter(s.colour)},
				stroke{points: []point{{swatch.x, swatch.y - 6}, {swatch.x + 28, swatch.y - 6}}, colour: s.colour, width: 1})
		case line:
			f.add(stroke{points: []point{swatch, {swatch.x + 28, swatch.y}}, colour: s.colour, width: lineWidth})
		case level:
			f.add(stroke{points: []point{swatch, {swatch.x + 28, swatch.y}}, colour: s.colour, width: lineWidth, dash: levelDashes})
		}
		f.add(label{x: x + 36, y: baseline, text: s.legend, colour: textColour})
		x += 36 + labelWidth(s.legend) + 28
	}
}

// niceStep returns the smallest of 1, 2, 5, 10, 20, 50… no less than least.
func niceStep(least float64) float64 {
	if least <= 1 {
		return 1
	}
	magnitude := math.Pow(10, math.Floor(math.Log10(least)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*magnitude >= least-1e-9 {
			return m * magnitude
		}
	}
	return 10 * magnitude
}

// labelEvery returns how many intervals apart the x axis's numbers go, 1, 2,
// 5, 10…, so that they are at least apart pixels apart, where an interval
// is perInterval pixels wide.
func labelEvery(perInterval, apart float64) int {
	return int(niceStep(apart / perInterval))
}

// wrap breaks text into lines (at its newlines, and between words) that
// fit width pixels in the bitmap font.
func wrap(text string, width float64) []string {
	var lines []string
	for para := range strings.SplitSeq(text, "\n") {
		line := ""
		for _, word := range strings.Fields(para) {
			if line != "" && labelWidth(line+" "+word) > width {
				lines = append(lines, line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += word
		}
		lines = append(lines, line)
	}
	return lines
}

func lighter(c color.RGBA) color.RGBA {
	mix := func(v uint8) uint8 { return v/2 + 128 }
	return color.RGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: 255}
}

func floats(counts []int) []float64 {
	f := make([]float64, len(counts))
	for i, n := range counts {
		f[i] = float64(n)
	}
	return f
}

func constant(v float64, n int) []float64 {
	f := make([]float64, n)
	for i := range f {
		f[i] = v
	}
	return f
}

func slicesMax(counts []int) int {
	most := 0
	for _, n := range counts {
		most = max(most, n)
	}
	return most
}
