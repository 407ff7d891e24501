package wire

import (
	"fmt"
	"strings"
)

// Constant is one name of the contract the scripts use, and its value as
// a Lua literal.
type Constant struct{ Name, Lua string }

// Constants are the contract's values the scripts name: argument positions,
// ops, sources, bounds, reply kinds, error kinds. The assembler writes each
// where a script names it, as a literal: a constant held in a local of the
// chunk would be an upvalue of every function using it, and each upvalue
// costs a script call as it creates the function (Lua 5.1 searches the
// chunk's open upvalues for each), a microsecond or more in all.
func Constants() []Constant {
	var cs []Constant
	num := func(name string, v int64) { cs = append(cs, Constant{name, fmt.Sprint(v)}) }
	str := func(name, v string) { cs = append(cs, Constant{name, q(v)}) }
	for i, name := range []string{"A_NOW", "A_PERMITS", "A_CONFIG", "A_CALENDAR", "A_ID", "A_LOG_WINDOW", "A_CLIENT_ID", "A_LEAST", "A_GRANT_AT", "A_GRANT_SIZE"} {
		num(name, int64(ArgNow+i))
	}
	for i, name := range []string{"AD_ALGORITHM", "AD_OP", "AD_NOW", "AD_VALUE", "AD_CONFIG", "AD_CLIENT_ID", "AD_OTHERS"} {
		num(name, int64(AdminAlgorithm+i))
	}
	num("REQUEST_HEAD", RequestHead)
	for _, op := range []Op{OpAllow, OpCharge, OpReserve, OpRelease, OpGet, OpSet, OpTrySet, OpReset, OpDelete, OpExpire,
		OpPersist, OpTTL, OpClients, OpShadow, OpDiagnose} {
		str("OP_"+strings.ToUpper(string(op)), string(op))
	}
	for _, f := range []string{FieldRate, FieldInterval, FieldType, FieldKeepAlive, FieldAlgorithm, FieldMore, FieldShadow,
		FieldBurst, FieldBuckets, FieldCalendar} {
		str("F_"+strings.ToUpper(f), f)
	}
	// A config hash without an algorithm field is Redisson's: a token bucket's.
	str("UNNAMED_ALGORITHM", TokenBucket.Name)
	str("SOURCE_DEFAULT", string(SourceDefault))
	str("SOURCE_STORED", string(SourceStored))
	str("SOURCE_FIXED", string(SourceFixed))
	str("SOURCE_NEW", string(SourceNew))
	// Sources told apart by their first byte, distinct for each.
	num("BYTE_SOURCE_DEFAULT", int64(SourceDefault[0]))
	num("BYTE_SOURCE_FIXED", int64(SourceFixed[0]))
	str("CONFIG_ARG", configArg)
	str("CONFIG_ARG_COMMON", configArgCommon)
	for i, name := range []string{"H_RATE", "H_INTERVAL", "H_TYPE", "H_KEEPALIVE", "H_ALGORITHM", "H_MORE", "H_SHADOW"} {
		num(name, int64(1+i))
	}
	num("H_OWN", int64(len(HashFields)+1))
	num("MAX_RATES", MaxRates)
	num("DEFAULT_BUCKETS", DefaultBuckets)
	num("MAX_BUCKETS", MaxBuckets)
	num("MAX_DEBT", MaxDebt)
	num("MAX_LOG_RATE", MaxLogRate)
	str("REPLY_HASH", ReplyHash)
	str("REPLY_FULL", ReplyFull)
	str("REPLY_DEFAULT", ReplyDefault)
	str("REPLY_PERCLIENT", ReplyPerClient)
	str("REPLY_CALENDAR", ReplyCalendar)
	str("REPLY_ADMIN", ReplyAdmin)
	str("REPLY_MISSING", ReplyMissing)
	str("REPLY_FULL_SCRIPT", ReplyFullScript)
	str("RESERVE_TAIL", ReserveTail)
	str("E_NOT_INITIALIZED", KindNotInitialized)
	str("E_ALGORITHM", KindAlgorithm)
	str("E_CLOCK", KindClock)
	str("E_PERMITS", KindPermits)
	str("E_CORRUPT", KindCorrupt)
	cs = append(cs, allConstants()...)    // all.go
	cs = append(cs, settleConstants()...) // settle.go
	return cs
}

// LuaHeader begins the decision and admin scripts: the constants' names
// and values (a comment, for readers: the assembler writes the values in),
// and the functions the contract makes, the replies written from
// FullFields and DefaultFields.
func LuaHeader() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("-- The contract, declared by internal/wire, its values written in where named:\n")
	line := "--"
	for _, c := range Constants() {
		item := " " + c.Name + " = " + c.Lua
		if len(line)+len(item) > 100 {
			w("%s\n", line)
			line = "--"
		}
		line += item
	}
	w("%s\n", line)
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

// LuaCatalog declares, for the admin script, what it knows of every
// algorithm: it reads other algorithms' state to name them, and runs
// rarely, so the tables it builds each call cost nothing that matters.
func LuaCatalog() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("local CONFIG_FIELDS = %s\n", list(ConfigFields))
	suffixes := make([]string, MaxRates)
	for i := range suffixes {
		suffixes[i] = RateSuffix(i)
	}
	w("local RATE_SUFFIX = %s\n", list(suffixes))
	w("local STATE_FIELD_LIST = %s\n", list(StateFields()))
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
		w("  %s = { name = %s, in_config = %t, records = %t, calendar = %t, state = %s, fields = %s, types = %s, registry = %d, requests = %d },\n",
			a.Name, q(a.Name), a.InConfig, a.Records, a.Calendar, list(a.State), list(a.Fields), list(a.Types), a.Registry(), a.Requests())
	}
	w("}\n")
	return b.String()
}

// LuaModuleInfo sets, on a's module (m), what the decision script knows of
// a: scalars, and read, which reads the limiter's key as a hash (the config
// fields, then the first rate's state fields) with its field names written
// in, so that a call builds no table for them. lean: for a lean script
// (lean.lua), which reads only the name, own field, state fields, foreign
// shape and read: each field more set on the module costs its call (the
// table grows, and is rebuilt as it does).
func LuaModuleInfo(a *Algorithm, lean bool) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	own, field1, field2 := "nil", "nil", "nil"
	if a.Own != "" {
		own = q(a.Own)
	}
	if len(a.Fields) > 0 {
		field1 = q(a.Fields[0])
	}
	if len(a.Fields) > 1 {
		field2 = q(a.Fields[1])
	}
	read := a.hashRead()
	if lean {
		w("m.NAME, m.OWN, m.FIELD1, m.FIELD2, m.FOREIGN, m.STATE_AT = %s, %s, %s, %s, %s, %d\n",
			q(a.Name), own, field1, field2, q(a.foreign), len(read)-len(a.Fields)+1)
		w("m.read = function(key) return redis.pcall('HMGET', key, %s) end\n", strings.Join(quoted(read), ", "))
		return b.String()
	}
	w("m.NAME, m.IN_CONFIG, m.RECORDS, m.CALENDAR, m.OWN = %s, %t, %t, %t, %s\n", q(a.Name), a.InConfig, a.Records, a.Calendar, own)
	w("m.FIELD1, m.FIELD2, m.FOREIGN, m.REGISTRY, m.REQUESTS, m.STATE_AT = %s, %s, %s, %d, %d, %d\n",
		field1, field2, q(a.foreign), a.Registry(), a.Requests(), len(read)-len(a.Fields)+1)
	w("m.read = function(key) return redis.pcall('HMGET', key, %s) end\n", strings.Join(quoted(read), ", "))
	return b.String()
}

// LuaStateFields is the decision script's list of every algorithm's state
// fields: a function, not a table, as a table is built on every call of
// the script, and this list is for a rare path.
func LuaStateFields() string {
	return fmt.Sprintf("local function STATE_FIELDS() return %s end\n", strings.Join(quoted(StateFields()), ", "))
}

// InFlightHeader declares the in-flight script's contract, and how it
// reads the config hash: its own fields, then what a rate limiter of the
// same name would have left there (a config's fields, each in-config
// algorithm's first state field), so that it names that owner.
func InFlightHeader() string {
	fields := []string{FieldLimit, FieldTTL, FieldAlgorithm, FieldRate, FieldInterval}
	var owners []string
	for _, a := range Algorithms {
		if a.InConfig {
			fields = append(fields, a.Fields[0])
			owners = append(owners, fmt.Sprintf("f[%d] and %s", len(fields), q(a.Name)))
		}
	}
	return fmt.Sprintf("-- The contract, declared by internal/wire.\n"+
		"local OP, NOW, HOLD, CONFIG = %d, %d, %d, %d -- ARGV's\n"+
		"local ALGORITHM, MAX_LIMIT, MIN_TTL, MAX_TTL = %s, %d, %d, %d\n"+
		"local GONE, HELD, EXPIRED = %d, %d, %d -- a hold's state, as refresh and release reply\n"+
		"local E_CORRUPT, F_LIMIT, F_TTL, F_ALGORITHM, UNNAMED_ALGORITHM = %s, %s, %s, %s, %s\n"+
		"local OP_ACQUIRE, OP_REFRESH, OP_RELEASE, OP_HOLDERS = %s, %s, %s, %s\n"+
		"local OP_GET, OP_SET, OP_TRYSET, OP_RESET, OP_DELETE = %s, %s, %s, %s, %s\n"+
		"-- read_config reads the config hash: limit, ttl, algorithm, a rate config's rate and interval, then\n"+
		"-- each in-config algorithm's first state field; state_owner names the algorithm whose state it found.\n"+
		"local function read_config(key) return redis.pcall('HMGET', key, %s) end\n"+
		"local function state_owner(f) return %s end\n",
		InFlightOp, InFlightNow, InFlightHold, InFlightConfig, q(InFlightAlgorithm), MaxInFlightLimit, MinTTLMS, MaxTTLMS,
		HoldGone, HoldHeld, HoldExpired, q(KindCorrupt), q(FieldLimit), q(FieldTTL), q(FieldAlgorithm), q(TokenBucket.Name),
		q(OpAcquire), q(OpRefresh), q(OpHoldRelease), q(OpHolders), q(OpGet), q(OpSet), q(OpTrySet), q(OpReset), q(OpDelete),
		strings.Join(quoted(fields), ", "), strings.Join(owners, " or "))
}

// q quotes s as a Lua string.
func q[S ~string](s S) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(string(s)) + "'"
}

// list writes a Lua list of strings.
func list(items []string) string {
	return "{ " + strings.Join(quoted(items), ", ") + " }"
}

// quoted quotes each item as a Lua string.
func quoted(items []string) []string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = q(s)
	}
	return out
}
