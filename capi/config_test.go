package main

import (
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// TestConfigFields: gocollConfig_t (as cgo reads gocoll.h) is its header
// (size, magic, version) and then exactly the engine's settings table's
// config fields (in the header's order: the table's is that of its
// checks), each an int or a string as the table says;
// GOCOLL_CONFIG_INITIALIZER leaves every one unset; and each field, once
// set, becomes its variable's setting, named after the field, while
// fields past the caller's size are not read. A field added to the header
// or to the table alone fails here.
func TestConfigFields(t *testing.T) {
	cfg := initializedConfig()
	typ := reflect.TypeOf(cfg)
	fields := engine.ConfigFields()
	var names []string
	for i := range typ.NumField() {
		names = append(names, typ.Field(i).Name)
	}
	want := []string{"size", "magic", "version"}
	for _, f := range fields {
		want = append(want, f.Name)
	}
	slices.Sort(names[3:])
	slices.Sort(want[3:])
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("gocollConfig_t fields %v (sorted after the header); engine.ConfigFields makes %v", names, want)
	}
	if settings, err := configSettings(&cfg); err != nil || len(settings) != 0 {
		t.Fatalf("GOCOLL_CONFIG_INITIALIZER: settings %+v, %v; want none set", settings, err)
	}
	text := []byte("some value\x00")
	for _, f := range fields {
		sf, _ := typ.FieldByName(f.Name)
		c := initializedConfig()
		at := unsafe.Add(unsafe.Pointer(&c), sf.Offset)
		var want engine.Setting
		switch {
		case f.Int && sf.Type.Kind() == reflect.Int32:
			*(*int32)(at) = 42
			want = engine.IntSetting(f.Var, 42, "gocollConfig_t."+f.Name)
		case !f.Int && sf.Type.Kind() == reflect.Pointer && sf.Type.Size() == unsafe.Sizeof(uintptr(0)):
			*(*unsafe.Pointer)(at) = unsafe.Pointer(&text[0])
			want = engine.Setting{Var: f.Var, Value: "some value", Field: "gocollConfig_t." + f.Name}
		default:
			t.Errorf("gocollConfig_t.%s is a %v; the table wants an int: %v", f.Name, sf.Type, f.Int)
			continue
		}
		got, err := configSettings(&c)
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("gocollConfig_t.%s set: settings %+v, %v; want %+v", f.Name, got, err, want)
		}
		if got, err := configFields(&c, sf.Offset); err != nil || len(got) != 0 {
			t.Errorf("gocollConfig_t.%s past the caller's size: settings %+v, %v; want none", f.Name, got, err)
		}
	}
}
