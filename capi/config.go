package main

/*
#include <stdlib.h>
#include "gocoll.h"

static gocollConfig_t config_initializer(void) {
  gocollConfig_t c = GOCOLL_CONFIG_INITIALIZER;
  return c;
}
*/
import "C"

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// configLayouts is the size of gocollConfig_t for every layout version this
// library knows (index: version). A later header that adds fields bumps
// GOCOLL_CONFIG_VERSION and appends its size; older versions stay readable.
var configLayouts = [...]uintptr{
	1: unsafe.Offsetof(C.gocollConfig_t{}.shrinkQuorum),
	2: unsafe.Offsetof(C.gocollConfig_t{}.tune),
	3: unsafe.Offsetof(C.gocollConfig_t{}.connect),
	4: unsafe.Sizeof(C.gocollConfig_t{}),
}

// configHeader is how many bytes size, magic and version take: nothing
// else is read before size says the struct is at least that long.
const configHeader = unsafe.Offsetof(C.gocollConfig_t{}.timeoutMs)

// configOptions is a call's options: cfg's fields over the GOCOLL_*
// variables (configSettings, options).
func configOptions(cfg *C.gocollConfig_t) (engine.Options, error) {
	settings, err := configSettings(cfg)
	if err != nil {
		return engine.Options{}, err
	}
	return options(settings...)
}

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
	return configFields(cfg, size)
}

// configFields reads the fields of engine.ConfigFields that the caller's
// layout has (those that end within size bytes): each set one becomes its
// variable's setting, an int given as an int (engine.IntSetting), so the
// engine checks it as it would the variable's text. The fields are found
// by name in gocollConfig_t as cgo reads it from gocoll.h, so the header
// and the engine's table are the only two places a field is declared
// (TestConfigFields checks they agree).
func configFields(cfg *C.gocollConfig_t, size uintptr) ([]engine.Setting, error) {
	const prefix = "gocollConfig_t."
	rv := reflect.ValueOf(cfg).Elem()
	var out []engine.Setting
	for _, f := range engine.ConfigFields() {
		sf, ok := rv.Type().FieldByName(f.Name)
		if !ok {
			return nil, fmt.Errorf("config: gocoll.h's gocollConfig_t has no field %s for %s", f.Name, f.Var)
		}
		if sf.Offset+sf.Type.Size() > size {
			continue // a later layout's field
		}
		v := rv.FieldByIndex(sf.Index)
		switch {
		case f.Int && v.Kind() == reflect.Int32:
			if n := v.Int(); n != C.GOCOLL_CONFIG_UNDEF_INT {
				out = append(out, engine.IntSetting(f.Var, int(n), prefix+f.Name))
			}
		case !f.Int && v.Kind() == reflect.Pointer:
			if p := (*C.char)(v.UnsafePointer()); p != nil {
				out = append(out, engine.Setting{Var: f.Var, Value: C.GoString(p), Field: prefix + f.Name})
			}
		default:
			return nil, fmt.Errorf("config: gocollConfig_t.%s is a %s; the engine's table wants an int %v", f.Name, v.Kind(), f.Int)
		}
	}
	return out, nil
}

// initializedConfig is a gocollConfig_t as GOCOLL_CONFIG_INITIALIZER makes
// it, for TestConfigFields (a test cannot use cgo itself), which checks
// that the initializer leaves every field unset.
func initializedConfig() C.gocollConfig_t { return C.config_initializer() }
