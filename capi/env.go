package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// The Go runtime of a c-shared library copies the environment once, when
// the library is loaded. C and Python programs often set launcher variables
// after that (os.environ[...] = ... before init), so every entry point that
// reads settings reads them from the C environment at the time of the call.

// cGetenv reads a variable from the C environment.
func cGetenv(key string) string {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	v := C.getenv(ck)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}

// options reads the GOCOLL_* settings, and later the launcher's variables,
// from the C environment; settings (a gocollConfig_t's) win over the
// variables they name.
func options(settings ...engine.Setting) (engine.Options, error) {
	opts, err := engine.OptionsFromSettings(cGetenv, settings...)
	if err != nil {
		return opts, err
	}
	opts.LockedCallers = true // every call comes from a C thread
	return withMetrics(opts, cGetenv)
}
