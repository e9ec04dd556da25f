package main

/*
#include <stdlib.h>
#include "gocoll.h"
*/
import "C"

import (
	"strconv"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// configLayouts is the size of gocollConfig_t for every layout version this
// library knows (index: version). A later header that adds fields bumps
// GOCOLL_CONFIG_VERSION and appends its size; older versions stay readable.
var configLayouts = [...]uintptr{1: unsafe.Sizeof(C.gocollConfig_t{})}

// configHeader is how many bytes size, magic and version take: nothing
// else is read before size says the struct is at least that long.
const configHeader = unsafe.Offsetof(C.gocollConfig_t{}.timeoutMs)

// configSettings turns a gocollConfig_t into the engine's per-communicator
// settings: each set field replaces its GOCOLL_* variable, and the
// engine's one parsing path checks the values (naming the field when one
// is bad). NULL is a config with nothing set.
func configSettings(cfg *C.gocollConfig_t) ([]engine.Setting, error) {
	if cfg == nil {
		return nil, nil
	}
	size := uintptr(cfg.size)
	if size < configHeader {
		return nil, argErr("config: size %d is not sizeof(gocollConfig_t) (%d); initialise it with GOCOLL_CONFIG_INITIALIZER", size, configLayouts[C.GOCOLL_CONFIG_VERSION])
	}
	if cfg.magic != C.GOCOLL_CONFIG_MAGIC {
		return nil, argErr("config: magic %#x is not GOCOLL_CONFIG_MAGIC (%#x); initialise it with GOCOLL_CONFIG_INITIALIZER", uint32(cfg.magic), uint32(C.GOCOLL_CONFIG_MAGIC))
	}
	version := uint64(cfg.version)
	if version == 0 || version >= uint64(len(configLayouts)) {
		return nil, argErr("config: version %d is unknown to this library (it reads versions 1 to %d: is gocoll.h newer than libgocoll?)", version, len(configLayouts)-1)
	}
	if want := configLayouts[version]; size != want {
		return nil, argErr("config: size %d does not match version %d's %d bytes; initialise it with GOCOLL_CONFIG_INITIALIZER", size, version, want)
	}
	const field = "gocollConfig_t."
	var out []engine.Setting
	str := func(v, name string, p *C.char) {
		if p != nil {
			out = append(out, engine.Setting{Var: v, Value: C.GoString(p), Field: field + name})
		}
	}
	num := func(v, name string, n C.int) {
		if n != C.GOCOLL_CONFIG_UNDEF_INT {
			out = append(out, engine.Setting{Var: v, Value: strconv.Itoa(int(n)), Field: field + name})
		}
	}
	if ms := cfg.timeoutMs; ms != C.GOCOLL_CONFIG_UNDEF_INT {
		if ms <= 0 {
			return nil, argErr("config: timeoutMs %d: want a positive number of milliseconds, or GOCOLL_CONFIG_UNDEF_INT for GOCOLL_TIMEOUT", int(ms))
		}
		out = append(out, engine.Setting{Var: "GOCOLL_TIMEOUT", Value: strconv.Itoa(int(ms)) + "ms", Field: field + "timeoutMs"})
	}
	str("GOCOLL_ALGO", "algo", cfg.algo)
	str("GOCOLL_DEBUG", "debug", cfg.debug)
	str("GOCOLL_DEBUG_FILE", "debugFile", cfg.debugFile)
	str("GOCOLL_TRANSPORT", "transport", cfg.transport)
	str("GOCOLL_SOCKET_IFNAME", "socketIfname", cfg.socketIfname)
	str("GOCOLL_NET_BANDWIDTH", "netBandwidth", cfg.netBandwidth)
	str("GOCOLL_DUMP_DIR", "dumpDir", cfg.dumpDir)
	num("GOCOLL_CMA", "cma", cfg.cma)
	num("GOCOLL_BRUCK_RADIX", "bruckRadix", cfg.bruckRadix)
	num("GOCOLL_HD_SEGMENTS", "hdSegments", cfg.hdSegments)
	num("GOCOLL_FLIGHT_RECORDS", "flightRecords", cfg.flightRecords)
	return out, nil
}
