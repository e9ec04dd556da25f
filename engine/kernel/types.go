// Package kernel holds the element types, reduction operators and the loops
// that combine buffers of them. Everything works on byte slices so that the
// same code serves Go slices, C memory and shared-memory segments.
package kernel

import (
	"fmt"
	"strings"
)

// DataType numbers match gocollDataType_t (and NCCL's ncclDataType_t).
type DataType int32

const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	Bfloat16 DataType = 9
	// 10 and 11 are NCCL's ncclFloat8e4m3 and ncclFloat8e5m2: left free
	// (and invalid here) so that a type number still means the same in
	// both libraries.
	Int16 DataType = 12
	// Bool is one byte per element: 0 is false, any other byte true.
	// Reductions read it that way and write 0 or 1 (see Reduce).
	Bool DataType = 13
)

// dtypeNames has "" for the numbers that are no type (10 and 11).
var dtypeNames = [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16", "", "", "int16", "bool"}
var dtypeSizes = [...]int{1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 0, 0, 2, 1}

// Valid reports whether d is one of the defined types.
func (d DataType) Valid() bool { return d >= 0 && int(d) < len(dtypeNames) && dtypeNames[d] != "" }

// IsFloat reports whether d is a floating-point type.
func (d DataType) IsFloat() bool {
	return d == Float16 || d == Float32 || d == Float64 || d == Bfloat16
}

// Size is the width of one element in bytes; 0 for an invalid type.
func (d DataType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeSizes[d]
}

func (d DataType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DataType(%d)", int32(d))
	}
	return dtypeNames[d]
}

// ParseDataType accepts the names String returns (and "half", "bf16", "float", "double").
func ParseDataType(s string) (DataType, error) {
	switch strings.ToLower(s) {
	case "half", "fp16", "f16":
		return Float16, nil
	case "bf16":
		return Bfloat16, nil
	case "float", "fp32", "f32":
		return Float32, nil
	case "double", "fp64", "f64":
		return Float64, nil
	}
	for i, n := range dtypeNames {
		if n != "" && n == strings.ToLower(s) {
			return DataType(i), nil
		}
	}
	return 0, fmt.Errorf("unknown datatype %q", s)
}

// AllDataTypes lists every type, in enum order (for table-driven tests).
func AllDataTypes() []DataType {
	var out []DataType
	for i, n := range dtypeNames {
		if n != "" {
			out = append(out, DataType(i))
		}
	}
	return out
}

// RedOp numbers match gocollRedOp_t (and NCCL's ncclRedOp_t).
type RedOp int32

const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
	// Bitwise and, or and exclusive or, on integer types and Bool only
	// (torch's BAND, BOR, BXOR).
	Band RedOp = 5
	Bor  RedOp = 6
	Bxor RedOp = 7
)

var opNames = [...]string{"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"}

func (o RedOp) Valid() bool { return o >= 0 && int(o) < len(opNames) }

func (o RedOp) String() string {
	if !o.Valid() {
		return fmt.Sprintf("RedOp(%d)", int32(o))
	}
	return opNames[o]
}

func ParseRedOp(s string) (RedOp, error) {
	for i, n := range opNames {
		if n == strings.ToLower(s) {
			return RedOp(i), nil
		}
	}
	return 0, fmt.Errorf("unknown reduction op %q", s)
}

// AllRedOps lists every op, including those not defined on every type
// (see CheckOp).
func AllRedOps() []RedOp { return []RedOp{Sum, Prod, Max, Min, Avg, Band, Bor, Bxor} }

// IsBitwise reports whether o is Band, Bor or Bxor.
func (o RedOp) IsBitwise() bool { return o == Band || o == Bor || o == Bxor }

// CheckOp says why op cannot reduce elements of dt, or returns nil when it
// can. Both must be valid. Undefined: the bitwise ops on floating-point
// types (they have no meaningful bits to combine, and torch refuses them
// too) and Avg on Bool (torch refuses it: a mean of booleans is no
// boolean).
func CheckOp(dt DataType, op RedOp) error {
	switch {
	case !dt.Valid():
		return fmt.Errorf("unknown datatype %d", int32(dt))
	case !op.Valid():
		return fmt.Errorf("unknown reduction op %d", int32(op))
	case op.IsBitwise() && dt.IsFloat():
		return fmt.Errorf("reduction op %v is not defined on %v: bitwise ops take integer and bool types only", op, dt)
	case op == Avg && dt == Bool:
		return fmt.Errorf("reduction op avg is not defined on bool (use sum or max for any, prod or min for all)")
	}
	return nil
}
