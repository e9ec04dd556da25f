package engine

import "github.com/gocoll/gocoll/engine/kernel"

// DataType and RedOp are the kernel's; re-exported so users import one package.
type (
	DataType = kernel.DataType
	RedOp    = kernel.RedOp
)

const (
	Int8     = kernel.Int8
	Uint8    = kernel.Uint8
	Int32    = kernel.Int32
	Uint32   = kernel.Uint32
	Int64    = kernel.Int64
	Uint64   = kernel.Uint64
	Float16  = kernel.Float16
	Float32  = kernel.Float32
	Float64  = kernel.Float64
	Bfloat16 = kernel.Bfloat16
	Int16    = kernel.Int16
	Bool     = kernel.Bool

	Sum  = kernel.Sum
	Prod = kernel.Prod
	Max  = kernel.Max
	Min  = kernel.Min
	Avg  = kernel.Avg
	Band = kernel.Band
	Bor  = kernel.Bor
	Bxor = kernel.Bxor
)
