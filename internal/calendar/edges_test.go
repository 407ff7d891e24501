package calendar

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rule every window edge keeps: a day begins at the first instant whose
// local date is that day (or later, for a date the zone skipped whole); a
// week or a month at the first instant of its first date. The tests below
// check the windows against an answer found the slow way, by
// reading the zone's clock at every quarter hour, and at every second
// around each of its transitions.

// dayNumber is the days from 1970-01-01 to a date; dayDate the date back.
func dayNumber(y int, m time.Month, d int) int64 {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / (24 * 3600)
}

func dayDate(n int64) time.Time { return time.Unix(n*24*3600, 0).UTC() }

// referenceClock is what reading a zone's clock from one instant to
// another found: when each date began, and the instants whose clock read a
// date earlier than one it had already reached (the clocks went back
// across midnight), which are in the window of the latest date reached.
type referenceClock struct {
	first  int64       // the date start[0] is of
	start  []time.Time // start[i]: the first instant reading date first+i or later
	behind []behindInstant
	odd    []string // quarter hours the scan could not account for
}

type behindInstant struct {
	at     time.Time
	latest int64 // the latest date read before at
}

// begins is when date d began, and whether the scan saw it.
func (r *referenceClock) begins(d int64) (time.Time, bool) {
	if i := d - r.first; i >= 0 && i < int64(len(r.start)) {
		return r.start[i], true
	}
	return time.Time{}, false
}

// scanClock reads loc's clock at every quarter hour from `from` to `to`.
// Where the offset is the same at both ends of a quarter hour the clock ran
// with UTC through it, and a date it reached there began at its midnight;
// where not, every second of it is read (offsets, transitions and midnights
// all fall on whole seconds, and no zone changes its offset twice in a
// quarter hour). It knows nothing of how this package searches.
func scanClock(loc *time.Location, from, to time.Time) *referenceClock {
	localDay := func(t time.Time) int64 {
		_, off := t.In(loc).Zone()
		s := t.Unix() + int64(off)
		return (s - ((s%86400)+86400)%86400) / 86400
	}
	r := &referenceClock{first: localDay(from) + 1}
	latest := r.first - 1
	const step = 15 * time.Minute
	_, prevOff := from.In(loc).Zone()
	for t := from.Add(step); !t.After(to); t = t.Add(step) {
		_, off := t.In(loc).Zone()
		if off != prevOff {
			for s := t.Add(-step + time.Second); !s.After(t); s = s.Add(time.Second) {
				d := localDay(s)
				for ; latest < d; latest++ {
					r.start = append(r.start, s)
				}
				if d < latest && localDay(s.Add(-time.Second)) >= latest {
					r.behind = append(r.behind, behindInstant{s, latest}) // the first second of a run
				}
			}
		} else {
			d := localDay(t)
			for ; latest < d; latest++ {
				at := time.Unix((latest+1)*86400-int64(off), 0)
				if !at.After(t.Add(-step)) || at.After(t) {
					r.odd = append(r.odd, fmt.Sprintf("%v: date %v begins at %v, outside the quarter hour", t, dayDate(latest+1), at))
				}
				r.start = append(r.start, at)
			}
			if d < latest {
				r.behind = append(r.behind, behindInstant{t, latest})
			}
		}
		prevOff = off
	}
	return r
}

// checkEdges checks c's windows whose first dates are anchors[i] (sorted;
// the last only ends one): at a window's first instant and at its last,
// c.window answers that window, and at an instant behind, the window of
// the latest date read before it. It returns how many windows it checked,
// and gives up on c after three failures.
func checkEdges(t *testing.T, c Rule, ref *referenceClock, anchors []int64) int {
	t.Helper()
	failures := 0
	fail := func(format string, a ...any) bool {
		t.Helper()
		t.Errorf("%v: "+format, append([]any{c}, a...)...)
		failures++
		return failures < 3
	}
	expect := func(at, start, end time.Time) bool {
		t.Helper()
		if s, e := c.Window(at); !s.Equal(start) || !e.Equal(end) {
			return fail("window(%v) = [%v, %v), want [%v, %v)", at.UTC(), s.UTC(), e.UTC(), start.UTC(), end.UTC())
		}
		return true
	}
	checked := 0
	for i := 0; i+1 < len(anchors); i++ {
		start, ok1 := ref.begins(anchors[i])
		end, ok2 := ref.begins(anchors[i+1])
		if !ok1 || !ok2 {
			fail("the scan does not reach %v..%v", dayDate(anchors[i]), dayDate(anchors[i+1])) // Errorf: this runs off the test's goroutine
			return checked
		}
		if !start.Before(end) {
			continue // every date of it skipped: its start is the next one's
		}
		if !expect(start, start, end) || !expect(end.Add(-time.Nanosecond), start, end) {
			return checked
		}
		checked++
	}
	for _, b := range ref.behind {
		i, found := slices.BinarySearch(anchors, b.latest)
		if !found {
			i--
		}
		if i < 0 || i+1 >= len(anchors) {
			continue
		}
		start, _ := ref.begins(anchors[i])
		end, _ := ref.begins(anchors[i+1])
		if !expect(b.at, start, end) {
			return checked
		}
	}
	return checked
}

// TestCalendarEdgesEveryZone checks every window of every zone in the
// machine's database whose first date is in 2000–2030: every day, the weeks
// from each weekday, and the months from the 1st, 15th and 28th to 31st.
// Go's own database, read where the machine has none, has slimmer files:
// most zones' offsets come from their rules there, and the sweep takes
// about twice as long.
func TestCalendarEdgesEveryZone(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole zone database over 31 years (15 to 25 s on 2 busy cores); TestCalendarEdgesAnomalies checks the known anomalies")
	}
	zones, names := zoneDatabase(t)
	from, to := dayNumber(2000, 1, 1), dayNumber(2030, 12, 31)
	// The scan runs on past both ends, for the windows around them.
	scanFrom, scanTo := dayDate(from-40), dayDate(to+45)
	var daily []int64
	for d := from; d <= to+1; d++ {
		daily = append(daily, d)
	}
	anchorsFrom := func(keep func(day time.Time) bool) []int64 {
		var anchors []int64
		for d := from - 31; d <= to+32; d++ {
			if keep(dayDate(d)) {
				anchors = append(anchors, d)
			}
		}
		return anchors
	}
	var weekly [7][]int64
	for wd := range weekly {
		weekly[wd] = anchorsFrom(func(day time.Time) bool { return day.Weekday() == time.Weekday(wd) })
	}
	billingDays := []int{1, 15, 28, 29, 30, 31}
	monthly := make([][]int64, len(billingDays))
	for i, billing := range billingDays {
		monthly[i] = anchorsFrom(func(day time.Time) bool { return day.Day() == min(billing, daysIn(day.Year(), day.Month())) })
	}
	began := time.Now()
	var days, weeks, months, behind atomic.Int64
	work := make(chan *time.Location)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for loc := range work {
				ref := scanClock(loc, scanFrom, scanTo)
				for _, odd := range ref.odd {
					t.Errorf("%v: the scan: %s", loc, odd)
				}
				behind.Add(int64(len(ref.behind)))
				days.Add(int64(checkEdges(t, Rule{Period: Daily, Location: loc}, ref, daily)))
				for wd, anchors := range weekly {
					weeks.Add(int64(checkEdges(t, Rule{Period: Weekly, Location: loc, Weekday: time.Weekday(wd)}, ref, anchors)))
				}
				for i, anchors := range monthly {
					months.Add(int64(checkEdges(t, Rule{Period: Monthly, Location: loc, Day: billingDays[i]}, ref, anchors)))
				}
			}
		})
	}
	for _, loc := range zones {
		work <- loc
	}
	close(work)
	wg.Wait()
	t.Logf("%d zones (%d names): %d days, %d weeks, %d months checked, and %d instants whose clock went back a date, in %v",
		len(zones), names, days.Load(), weeks.Load(), months.Load(), behind.Load(), time.Since(began).Round(time.Second))
}

// zoneDatabase loads each zone of the machine's database once (a link, US/Eastern
// for America/New_York, is the same bytes), and counts the names. Without
// /usr/share/zoneinfo it reads Go's own database, the one time/tzdata embeds.
func zoneDatabase(t *testing.T) (zones []*time.Location, names int) {
	t.Helper()
	seen := map[string]bool{}
	add := func(name string, b []byte) {
		if !bytes.HasPrefix(b, []byte("TZif")) {
			return // zone.tab, leapseconds, tzdata.zi
		}
		names++
		if seen[string(b)] {
			return
		}
		seen[string(b)] = true
		loc, err := time.LoadLocationFromTZData(name, b)
		require.NoError(t, err, name)
		zones = append(zones, loc)
	}
	const root = "/usr/share/zoneinfo"
	if _, err := os.Stat(root); err == nil {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name, _ := filepath.Rel(root, path)
			switch {
			case d.IsDir() && (name == "posix" || name == "right"):
				return fs.SkipDir // copies of the zones, and the same with leap seconds counted
			case d.IsDir() || name == "localtime" || name == "posixrules":
				return nil
			}
			b, err := os.ReadFile(path)
			add(name, b)
			return err
		})
		require.NoError(t, err)
		return zones, names
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skipf("no %s, and no GOROOT for Go's zoneinfo.zip: %v", root, err)
	}
	z, err := zip.OpenReader(filepath.Join(strings.TrimSpace(string(goroot)), "lib", "time", "zoneinfo.zip"))
	require.NoError(t, err)
	defer z.Close()
	for _, f := range z.File {
		r, err := f.Open()
		require.NoError(t, err)
		b, err := io.ReadAll(r)
		require.NoError(t, err)
		add(f.Name, b)
	}
	return zones, names
}

// TestCalendarEdgesAnomalies: windows at the kinds of local-time anomaly
// the zone database has had since 2000, each pinned by hand (from the
// zones' rules, in UTC) and by the scan of the zone's clock around it.
func TestCalendarEdgesAnomalies(t *testing.T) {
	const day = 24 * time.Hour
	at := func(y int, m time.Month, d, hour, minute int) time.Time {
		return time.Date(y, m, d, hour, minute, 0, 0, time.UTC)
	}
	daily := func(zone string) Rule { return Rule{Period: Daily, Location: calendarZone(t, zone)} }
	weekly := func(zone string, first time.Weekday) Rule {
		return Rule{Period: Weekly, Location: calendarZone(t, zone), Weekday: first}
	}
	monthly := func(zone string, billing int) Rule {
		return Rule{Period: Monthly, Location: calendarZone(t, zone), Day: billing}
	}
	cases := []windowCase{
		// Midnight twice, east of UTC: the review's case. Amman went back
		// from 01:00 +03 to 00:00 +02 at 22:00 UTC on 28 October 2021; the
		// 29th began at the first midnight, 21:00 UTC, and lasted 25 hours.
		{"Amman/2021-10-29 first 00:30", daily("Asia/Amman"), at(2021, 10, 28, 21, 30), at(2021, 10, 28, 21, 0), at(2021, 10, 29, 22, 0), 25 * time.Hour},
		{"Amman/2021-10-29 second 00:30", daily("Asia/Amman"), at(2021, 10, 28, 22, 30), at(2021, 10, 28, 21, 0), at(2021, 10, 29, 22, 0), 25 * time.Hour},
		{"Amman/2021-10-28 last ns", daily("Asia/Amman"), at(2021, 10, 28, 21, 0).Add(-time.Nanosecond), at(2021, 10, 27, 21, 0), at(2021, 10, 28, 21, 0), day},
		{"Jerusalem/2004-09-22 first 00:30", daily("Asia/Jerusalem"), at(2004, 9, 21, 21, 30), at(2004, 9, 21, 21, 0), at(2004, 9, 22, 22, 0), 25 * time.Hour},
		// Colombo went from +06 to +05:30 at 00:30: half an hour of midnight twice.
		{"Colombo/2006-04-15 first 00:15", daily("Asia/Colombo"), at(2006, 4, 14, 18, 15), at(2006, 4, 14, 18, 0), at(2006, 4, 15, 18, 30), day + 30*time.Minute},
		// Casey from +11 to +08 at 03:00, Magadan from +12 to +10 at 02:00:
		// three and two hours of the new day twice, days of 27 and 26 hours.
		{"Casey/2010-03-05 first 01:00", daily("Antarctica/Casey"), at(2010, 3, 4, 14, 0), at(2010, 3, 4, 13, 0), at(2010, 3, 5, 16, 0), 27 * time.Hour},
		{"Magadan/2014-10-26 first 00:30", daily("Asia/Magadan"), at(2014, 10, 25, 12, 30), at(2014, 10, 25, 12, 0), at(2014, 10, 26, 14, 0), 26 * time.Hour},
		// Midnight twice, west of UTC: Havana from 01:00 CDT to 00:00 CST.
		{"Havana/2012-11-04 first 00:30", daily("America/Havana"), at(2012, 11, 4, 4, 30), at(2012, 11, 4, 4, 0), at(2012, 11, 5, 5, 0), 25 * time.Hour},
		// Back across midnight at 00:01 (Atlantic Canada until 2010): from
		// 00:01 ADT on the 29th to 23:01 AST on the 28th. The 29th began at
		// its first midnight; the 28th's second 23:01 to 23:59 is in it.
		{"Goose_Bay/2006-10-29 00:00:30 ADT", daily("America/Goose_Bay"), at(2006, 10, 29, 3, 0).Add(30 * time.Second), at(2006, 10, 29, 3, 0), at(2006, 10, 30, 4, 0), 25 * time.Hour},
		{"Goose_Bay/2006-10-28 23:30 AST is the 29th's", daily("America/Goose_Bay"), at(2006, 10, 29, 3, 30), at(2006, 10, 29, 3, 0), at(2006, 10, 30, 4, 0), 25 * time.Hour},
		{"Goose_Bay/2006-10-28 last ns", daily("America/Goose_Bay"), at(2006, 10, 29, 3, 0).Add(-time.Nanosecond), at(2006, 10, 28, 3, 0), at(2006, 10, 29, 3, 0), day},
		{"St_Johns/2006-10-28 23:30 NST is the 29th's", daily("America/St_Johns"), at(2006, 10, 29, 3, 0), at(2006, 10, 29, 2, 30), at(2006, 10, 30, 3, 30), 25 * time.Hour},
		// No midnight, east and west: 24:00 to 01:00.
		{"Amman/2021-03-26 begins at 01:00", daily("Asia/Amman"), at(2021, 3, 25, 22, 0), at(2021, 3, 25, 22, 0), at(2021, 3, 26, 21, 0), 23 * time.Hour},
		{"Sao_Paulo/2018-11-04 begins at 01:00", daily("America/Sao_Paulo"), at(2018, 11, 4, 3, 0), at(2018, 11, 4, 3, 0), at(2018, 11, 5, 2, 0), 23 * time.Hour},
		// Casey from +08 to +11 at midnight: the day began at 03:00.
		{"Casey/2016-10-22 begins at 03:00", daily("Antarctica/Casey"), at(2016, 10, 21, 16, 0), at(2016, 10, 21, 16, 0), at(2016, 10, 22, 13, 0), 21 * time.Hour},
		// A date skipped whole: Tokelau went from -11 to +13 at 11:00 UTC
		// on 30 December 2011, from the 29th to the 31st.
		{"Fakaofo/2011-12-29", daily("Pacific/Fakaofo"), at(2011, 12, 30, 10, 59), at(2011, 12, 29, 11, 0), at(2011, 12, 30, 11, 0), day},
		{"Fakaofo/2011-12-31", daily("Pacific/Fakaofo"), at(2011, 12, 30, 11, 0), at(2011, 12, 30, 11, 0), at(2011, 12, 31, 11, 0), day},

		// Weeks and months from a repeated midnight.
		{"Amman/the week from Friday 2021-10-29", weekly("Asia/Amman", time.Friday), at(2021, 10, 28, 21, 30), at(2021, 10, 28, 21, 0), at(2021, 11, 4, 22, 0), 7*day + time.Hour},
		{"Amman/the month from 2021-10-29", monthly("Asia/Amman", 29), at(2021, 10, 28, 21, 30), at(2021, 10, 28, 21, 0), at(2021, 11, 28, 22, 0), 31*day + time.Hour},
		{"Gaza/October 2004", monthly("Asia/Gaza", 1), at(2004, 9, 30, 21, 30), at(2004, 9, 30, 21, 0), at(2004, 10, 31, 22, 0), 31*day + time.Hour},
		{"Goose_Bay/the week from Sunday 2006-10-29", weekly("America/Goose_Bay", time.Sunday), at(2006, 10, 29, 3, 30), at(2006, 10, 29, 3, 0), at(2006, 11, 5, 4, 0), 7*day + time.Hour},
		{"Goose_Bay/the month from 2006-10-29", monthly("America/Goose_Bay", 29), at(2006, 10, 29, 3, 30), at(2006, 10, 29, 3, 0), at(2006, 11, 29, 4, 0), 31*day + time.Hour},
	}
	// The rows' edges are where the scan finds dates begin.
	t.Run("scan", func(t *testing.T) {
		for _, tc := range cases {
			ref := scanClock(tc.cal.Location, tc.start.Add(-3*day), tc.end.Add(3*day))
			require.Empty(t, ref.odd, tc.name)
			for _, edge := range []time.Time{tc.start, tc.end} {
				_, off := edge.In(tc.cal.Location).Zone()
				begins, ok := ref.begins((edge.Unix() + int64(off)) / 86400)
				require.True(t, ok, tc.name)
				assert.Equal(t, edge, begins.UTC(), "%s: the date the clock reads at %v begins at %v", tc.name, edge, begins.UTC())
			}
		}
	})
	checkWindows(t, cases)
}

// TestCalendarEdgesPastListedTransitions: past a zone's last listed
// transition (2037 in fat zone files, years earlier in slim ones such as
// time/tzdata's) Go works its offsets out from the zone's rule, and there
// ZoneBounds ends the stretch that holds the last UTC day of a leap year
// before that day (golang/go#81583). The edges around two such New Years
// are the scan's all the same.
func TestCalendarEdgesPastListedTransitions(t *testing.T) {
	for _, name := range []string{"America/New_York", "Europe/Berlin", "Australia/Sydney"} {
		loc := calendarZone(t, name)
		for _, year := range []int{2028, 2040} {
			ref := scanClock(loc, time.Date(year, 11, 25, 0, 0, 0, 0, time.UTC), time.Date(year+1, 1, 10, 0, 0, 0, 0, time.UTC))
			require.Empty(t, ref.odd)
			var days []int64
			for d := dayNumber(year, 12, 24); d <= dayNumber(year+1, 1, 5); d++ {
				days = append(days, d)
			}
			assert.Equal(t, len(days)-1, checkEdges(t, Rule{Period: Daily, Location: loc}, ref, days), "%s, %d", name, year)
			months := []int64{dayNumber(year, 12, 1), dayNumber(year+1, 1, 1)}
			assert.Equal(t, 1, checkEdges(t, Rule{Period: Monthly, Location: loc, Day: 1}, ref, months), "%s, %d", name, year)
		}
	}
	// By hand: New Year 2041 in New York, at midnight EST.
	ny := Rule{Period: Daily, Location: calendarZone(t, "America/New_York")}
	start, end := ny.Window(time.Date(2040, 12, 31, 12, 0, 0, 0, time.UTC))
	assert.Equal(t, time.Date(2040, 12, 31, 5, 0, 0, 0, time.UTC), start.UTC())
	assert.Equal(t, time.Date(2041, 1, 1, 5, 0, 0, 0, time.UTC), end.UTC())
}

// BenchmarkCalendarArg is a decision's cost for its calendar rates on the
// common path: a clock inside the window the edges were last worked out for.
func BenchmarkCalendarArg(b *testing.B) {
	s, ok := NewSet("1=day:0:Europe/Berlin,2=month:31:America/New_York")
	if !ok {
		b.Fatal("spec")
	}
	now := time.Date(2026, 6, 10, 12, 0, 0, 0, time.UTC)
	s.Arg(now)
	b.ReportAllocs()
	for b.Loop() {
		s.Arg(now)
	}
}

// BenchmarkCalendarArgNewWindow is the cost of working the edges out: a
// clock a day on at every call, so that no call finds them cached.
func BenchmarkCalendarArgNewWindow(b *testing.B) {
	s, ok := NewSet("1=day:0:Europe/Berlin,2=month:31:America/New_York")
	if !ok {
		b.Fatal("spec")
	}
	from := time.Date(2000, 1, 1, 12, 0, 0, 0, time.UTC)
	now := from
	b.ReportAllocs()
	for b.Loop() {
		s.Arg(now)
		if now = now.Add(25 * time.Hour); now.Year() > 2030 {
			now = from
		}
	}
}

// BenchmarkCalendarWindow is one window of each period, at instants 25
// hours apart over 2000–2030.
func BenchmarkCalendarWindow(b *testing.B) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []Rule{
		{Period: Daily, Location: ny},
		{Period: Weekly, Location: ny, Weekday: time.Monday},
		{Period: Monthly, Location: ny, Day: 31},
	} {
		b.Run(c.Spec(), func(b *testing.B) {
			from := time.Date(2000, 1, 1, 12, 0, 0, 0, time.UTC)
			now := from
			b.ReportAllocs()
			for b.Loop() {
				c.Window(now)
				if now = now.Add(25 * time.Hour); now.Year() > 2030 {
					now = from
				}
			}
		})
	}
}
