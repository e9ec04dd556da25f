package main

/*
#include <stdlib.h>
extern char** environ;
static char* capi_environ_at(size_t i) { return environ[i]; }
*/
import "C"

import (
	"os"
	"strings"
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

// launcherVar reports whether the engine may read key while joining a job.
func launcherVar(key string) bool {
	switch key {
	case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK":
		return true
	}
	for _, p := range []string{"GOCOLL_", "MASTER_", "TORCHELASTIC_", "OMPI_", "PMIX_", "PMI_", "SLURM_"} {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// syncEnv makes the Go environment agree with the C one for the variables
// the engine reads through os.Getenv (engine.NewCommFromEnv has no getenv
// parameter). Only variables whose value differs are touched.
func syncEnv() {
	c := map[string]string{}
	for i := C.size_t(0); ; i++ {
		p := C.capi_environ_at(i)
		if p == nil {
			break
		}
		kv := C.GoString(p)
		if k, v, ok := strings.Cut(kv, "="); ok && launcherVar(k) {
			c[k] = v
		}
	}
	for k, v := range c {
		if gv, ok := os.LookupEnv(k); !ok || gv != v {
			os.Setenv(k, v)
		}
	}
	for _, kv := range os.Environ() {
		if k, _, ok := strings.Cut(kv, "="); ok && launcherVar(k) {
			if _, in := c[k]; !in {
				os.Unsetenv(k)
			}
		}
	}
}

// options reads the GOCOLL_* settings from the C environment.
func options() (engine.Options, error) {
	return engine.OptionsFromEnv(cGetenv)
}
