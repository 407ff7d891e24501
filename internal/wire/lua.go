package wire

import (
	"fmt"
	"strings"
)

// LuaHeader declares the contract for the scripts, as Lua locals: what they
// read from here and nowhere else.
func LuaHeader() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("-- The contract, declared by internal/wire.\n")
	w("local A_NOW, A_PERMITS, A_CONFIG, A_CALENDAR, A_ID, A_LOG_WINDOW, A_CLIENT_ID, A_LEAST, A_GRANT_AT, A_GRANT_SIZE = %d, %d, %d, %d, %d, %d, %d, %d, %d, %d\n",
		ArgNow, ArgPermits, ArgConfig, ArgCalendar, ArgID, ArgLogWindow, ArgClientID, ArgLeast, ArgGrantAt, ArgGrantSize)
	w("local AD_ALGORITHM, AD_OP, AD_NOW, AD_VALUE, AD_CONFIG, AD_CLIENT_ID, AD_OTHERS = %d, %d, %d, %d, %d, %d, %d\n",
		AdminAlgorithm, AdminOp, AdminNow, AdminValue, AdminConfig, AdminClientID, AdminOthers)
	w("local REQUEST_HEAD = %d\n", RequestHead)
	w("local OP_ALLOW, OP_CHARGE, OP_RESERVE, OP_RELEASE = %s, %s, %s, %s\n", q(OpAllow), q(OpCharge), q(OpReserve), q(OpRelease))
	w("local SOURCE_DEFAULT, SOURCE_STORED, SOURCE_FIXED, SOURCE_NEW = %s, %s, %s, %s\n", q(SourceDefault), q(SourceStored), q(SourceFixed), q(SourceNew))
	w("local CONFIG_ARG = %s\n", q(configArg))
	w("local H_RATE, H_INTERVAL, H_TYPE, H_KEEPALIVE, H_ALGORITHM, H_MORE, H_SHADOW, H_OWN = 1, 2, 3, 4, 5, 6, 7, %d\n", len(HashFields)+1)
	w("local CONFIG_FIELDS = %s\n", list(ConfigFields))
	w("local MAX_RATES, DEFAULT_BUCKETS, MAX_BUCKETS, MAX_DEBT, MAX_LOG_RATE = %d, %d, %d, %d, %d\n", MaxRates, DefaultBuckets, MaxBuckets, MaxDebt, MaxLogRate)
	suffixes := make([]string, MaxRates)
	for i := range suffixes {
		suffixes[i] = RateSuffix(i)
	}
	w("local RATE_SUFFIX = %s\n", list(suffixes))
	w("local STATE_FIELDS = %s\n", list(StateFields()))
	// OwnerOf's shapes, in its order: the algorithm whose flat state a
	// string at a limiter's key can be.
	w("local FLAT_SHAPES = {")
	for _, a := range Algorithms {
		if a.flat != "" {
			w(" { %s, %s },", q(a.Name), q("^["+strings.Replace(a.flat, "0123456789", "%d", 1)+"]+$"))
		}
	}
	w(" }\n")
	w("local ALGORITHMS = {\n")
	for _, a := range Algorithms {
		own := "nil"
		if a.Own != "" {
			own = q(a.Own)
		}
		w("  %s = { name = %s, in_config = %t, records = %t, charges = %t, calendar = %t, own = %s,\n", a.Name, q(a.Name), a.InConfig, a.Records, a.Charges, a.Calendar, own)
		w("    state = %s, fields = %s, types = %s, foreign = %s,\n", list(a.State), list(a.Fields), list(a.Types), q(a.foreign))
		w("    registry = %d, requests = %d, hash_read = %s, state_at = %d },\n", a.Registry(), a.Requests(), list(a.hashRead()), len(a.hashRead())-len(a.Fields)+1)
	}
	w("}\n")
	w("local REPLY_HASH, REPLY_FULL, REPLY_DEFAULT = %s, %s, %s\n", q(ReplyHash), q(ReplyFull), q(ReplyDefault))
	w("local REPLY_PERCLIENT, REPLY_CALENDAR, REPLY_ADMIN, REPLY_MISSING = %s, %s, %s, %s\n", q(ReplyPerClient), q(ReplyCalendar), q(ReplyAdmin), q(ReplyMissing))
	w("local RESERVE_TAIL = %s\n", q(ReserveTail))
	w("local E_NOT_INITIALIZED, E_ALGORITHM, E_CLOCK, E_PERMITS, E_CORRUPT = %s, %s, %s, %s, %s\n", q(KindNotInitialized), q(KindAlgorithm), q(KindClock), q(KindPermits), q(KindCorrupt))
	// The replies, written from FullFields and DefaultFields.
	full := FullFields[:]
	w("local function reply_full(kind, %s, more)\n", strings.Join(full, ", "))
	w("  if more then\n    return string.format('%%s%s ', kind, %s) .. more\n  end\n", strings.Repeat(" %d", len(full)), strings.Join(full, ", "))
	w("  return string.format('%%s%s', kind, %s)\nend\n", strings.Repeat(" %d", len(full)-1), strings.Join(full[:len(full)-1], ", "))
	var dflt []string
	for _, f := range DefaultFields {
		dflt = append(dflt, FullFields[f])
	}
	w("local function reply_default(%s)\n", strings.Join(dflt, ", "))
	w("  if %s then\n    return string.format('%s%s', %s)\n  end\n", dflt[len(dflt)-1], ReplyDefault, strings.Repeat(" %d", len(dflt)), strings.Join(dflt, ", "))
	w("  return string.format('%s%s', %s)\nend\n", ReplyDefault, strings.Repeat(" %d", len(dflt)-1), strings.Join(dflt[:len(dflt)-1], ", "))
	return b.String()
}

// InFlightHeader declares the in-flight script's contract.
func InFlightHeader() string {
	return fmt.Sprintf("-- The contract, declared by internal/wire.\n"+
		"local OP, NOW, HOLD, CONFIG = %d, %d, %d, %d -- ARGV's\n"+
		"local ALGORITHM, MAX_LIMIT, MIN_TTL, MAX_TTL = %s, %d, %d, %d\n"+
		"local GONE, HELD, EXPIRED = %d, %d, %d -- a hold's state, as refresh and release reply\n",
		InFlightOp, InFlightNow, InFlightHold, InFlightConfig, q(InFlightAlgorithm), MaxInFlightLimit, MinTTLMS, MaxTTLMS,
		HoldGone, HoldHeld, HoldExpired)
}

// q quotes s as a Lua string.
func q[S ~string](s S) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(string(s)) + "'"
}

// list writes a Lua list of strings.
func list(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = q(s)
	}
	return "{ " + strings.Join(quoted, ", ") + " }"
}
