package main

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/guptarohit/asciigraph"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
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

// Colours of the image: what was granted, in the last interval, and the limit.
var (
	offeredColour = color.RGBA{R: 120, G: 120, B: 120, A: 255}
	grantedColour = color.RGBA{R: 66, G: 133, B: 244, A: 255}
	rollingColour = color.RGBA{R: 219, G: 68, B: 55, A: 255}
	limitColour   = color.RGBA{A: 255}
)

// saveImage draws the comparison to a PNG or SVG file (by its extension):
// the offered traffic on top, then one panel per algorithm, on one scale;
// with leases, a column for the run without and one for the run with.
func (c comparison) saveImage(path string) error {
	format := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	top := float64(2 * c.cfg.Rate)
	for _, r := range slices.Concat(c.results, c.leased) {
		top = max(top, float64(slicesMax(r.rolling)))
	}
	top *= 1.5 // room for the legend above the highest line

	offered := c.panel(c.headline(), max(top, float64(slicesMax(c.offered))*1.5),
		steps(c.offered, c.tick.Seconds(), offeredColour, "requests offered per "+c.tick.String()))
	granted := func(title string, r algorithmResult) *plot.Plot {
		return c.panel(title, top,
			steps(r.granted, c.tick.Seconds(), grantedColour, "granted per "+c.tick.String()),
			line(floats(r.rolling), c.tick.Seconds(), rollingColour, nil, "granted in the last "+c.cfg.Interval.String()),
			line(constant(float64(c.cfg.Rate), len(r.granted)), c.tick.Seconds(), limitColour, []vg.Length{vg.Points(6), vg.Points(4)}, "limit"),
		)
	}
	var rows [][]*plot.Plot
	for i, r := range c.results {
		if c.leased == nil {
			rows = append(rows, []*plot.Plot{granted(r.about+"\n"+c.measured(r), r)})
			continue
		}
		rows = append(rows, []*plot.Plot{
			granted(r.about+"\nwithout leases: "+c.measured(r), r),
			granted("with leases of "+c.lease.String()+": "+c.measured(c.leased[i]), c.leased[i]),
		})
	}
	cols := len(rows[0])

	// The offered traffic spans the columns: it is the same for both runs.
	rowHeight := 2.6 * vg.Inch
	width, height := vg.Length(cols)*10*vg.Inch, vg.Length(len(rows)+1)*rowHeight
	canvas, err := draw.NewFormattedCanvas(width, height, format)
	if err != nil {
		return err
	}
	whole := draw.New(canvas)
	tiles := func(rows, cols int) draw.Tiles {
		return draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 8, PadY: vg.Millimeter * 6,
			PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 5}
	}
	rows[len(rows)-1][0].X.Label.Text = "seconds"
	if cols > 1 {
		rows[len(rows)-1][1].X.Label.Text = "seconds"
	}
	offered.Draw(plot.Align([][]*plot.Plot{{offered}}, tiles(1, 1), draw.Crop(whole, 0, 0, height-rowHeight, 0))[0][0])
	canvases := plot.Align(rows, tiles(len(rows), cols), draw.Crop(whole, 0, 0, 0, -rowHeight))
	for i := range rows {
		for j := range rows[i] {
			rows[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// series is one thing drawn in a panel, with its legend entry.
type series struct {
	plotter plot.Plotter
	thumb   plot.Thumbnailer
	legend  string
}

func (c comparison) panel(title string, top float64, items ...series) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Y.Label.Text = "requests"
	p.X.Min, p.X.Max = 0, float64(len(c.offered))*c.tick.Seconds()
	p.Y.Min, p.Y.Max = 0, top
	p.X.Tick.Marker = plot.ConstantTicks(secondTicks(p.X.Max, c.cfg.Interval.Seconds()))
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.Padding = vg.Points(2)
	p.Legend.XOffs = -vg.Millimeter * 2
	for _, s := range items {
		p.Add(s.plotter)
		p.Legend.Add(s.legend, s.thumb)
	}
	return p
}

// steps draws counts per tick as filled steps, i.e. bars with no gaps.
func steps(counts []int, tick float64, c color.Color, legend string) series {
	xys := make(plotter.XYs, len(counts)+1)
	for i, n := range counts {
		xys[i] = plotter.XY{X: float64(i) * tick, Y: float64(n)}
	}
	xys[len(counts)] = plotter.XY{X: float64(len(counts)) * tick, Y: float64(counts[len(counts)-1])}
	l, _ := plotter.NewLine(xys) // cannot fail: the values are finite
	l.StepStyle = plotter.PostStep
	l.FillColor = lighter(c)
	l.LineStyle.Color = c
	l.LineStyle.Width = vg.Points(0.5)
	return series{l, l, legend}
}

// line draws one value per tick at the tick's end.
func line(values []float64, tick float64, c color.Color, dashes []vg.Length, legend string) series {
	xys := make(plotter.XYs, len(values))
	for i, v := range values {
		xys[i] = plotter.XY{X: float64(i+1) * tick, Y: v}
	}
	l, _ := plotter.NewLine(xys)
	l.LineStyle.Color = c
	l.LineStyle.Width = vg.Points(2)
	l.LineStyle.Dashes = dashes
	return series{l, l, legend}
}

func lighter(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	mix := func(v uint32) uint8 { return uint8((v>>8)/2 + 128) }
	return color.RGBA{R: mix(r), G: mix(g), B: mix(b), A: 255}
}

func secondTicks(until, every float64) []plot.Tick {
	var ticks []plot.Tick
	for x := 0.0; x <= until+1e-9; x += every {
		ticks = append(ticks, plot.Tick{Value: x, Label: fmt.Sprintf("%g", x)})
	}
	return ticks
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
