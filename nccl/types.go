package nccl

import (
	"encoding/hex"
	"fmt"
	"strconv"
)

// Result is an ncclResult_t. The values are those of nccl.h 2.x.
type Result int32

// The results of nccl.h 2.x.
const (
	ResultSuccess            Result = 0 // ncclSuccess
	ResultUnhandledCudaError Result = 1 // ncclUnhandledCudaError
	ResultSystemError        Result = 2 // ncclSystemError
	ResultInternalError      Result = 3 // ncclInternalError
	ResultInvalidArgument    Result = 4 // ncclInvalidArgument
	ResultInvalidUsage       Result = 5 // ncclInvalidUsage
	ResultRemoteError        Result = 6 // ncclRemoteError
	ResultInProgress         Result = 7 // ncclInProgress
	ResultTimeout            Result = 8 // ncclTimeout (newer 2.x headers)
)

var resultNames = [...]string{
	"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout",
}

// String returns the C name of r ("ncclInvalidUsage"), or "ncclResult(N)".
func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "ncclResult(" + strconv.Itoa(int(r)) + ")"
}

// DataType is an ncclDataType_t. The values are those of nccl.h 2.x.
type DataType int32

// The data types of nccl.h 2.x (ncclBfloat16 needs NCCL ≥ 2.10 built with
// CUDA ≥ 11).
const (
	Int8     DataType = 0 // ncclInt8, ncclChar
	Uint8    DataType = 1 // ncclUint8
	Int32    DataType = 2 // ncclInt32, ncclInt
	Uint32   DataType = 3 // ncclUint32
	Int64    DataType = 4 // ncclInt64
	Uint64   DataType = 5 // ncclUint64
	Float16  DataType = 6 // ncclFloat16, ncclHalf
	Float32  DataType = 7 // ncclFloat32, ncclFloat
	Float64  DataType = 8 // ncclFloat64, ncclDouble
	Bfloat16 DataType = 9 // ncclBfloat16
)

var dataTypes = [...]struct {
	name string
	size int
}{
	{"ncclInt8", 1}, {"ncclUint8", 1}, {"ncclInt32", 4}, {"ncclUint32", 4}, {"ncclInt64", 8},
	{"ncclUint64", 8}, {"ncclFloat16", 2}, {"ncclFloat32", 4}, {"ncclFloat64", 8}, {"ncclBfloat16", 2},
}

func (t DataType) valid() bool { return t >= 0 && int(t) < len(dataTypes) }

// Size returns the size of one element in bytes, 0 for an unknown type.
func (t DataType) Size() int {
	if !t.valid() {
		return 0
	}
	return dataTypes[t].size
}

// String returns the C name of t ("ncclFloat32"), or "ncclDataType(N)".
func (t DataType) String() string {
	if !t.valid() {
		return "ncclDataType(" + strconv.Itoa(int(t)) + ")"
	}
	return dataTypes[t].name
}

// RedOp is a built-in ncclRedOp_t. The values are those of nccl.h 2.x.
type RedOp int32

// The built-in reductions of nccl.h 2.x (ncclAvg needs NCCL ≥ 2.10).
const (
	Sum  RedOp = 0 // ncclSum
	Prod RedOp = 1 // ncclProd
	Max  RedOp = 2 // ncclMax
	Min  RedOp = 3 // ncclMin
	Avg  RedOp = 4 // ncclAvg
)

var redOpNames = [...]string{"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"}

func (o RedOp) valid() bool { return o >= 0 && int(o) < len(redOpNames) }

// String returns the C name of o ("ncclSum"), or "ncclRedOp(N)".
func (o RedOp) String() string {
	if !o.valid() {
		return "ncclRedOp(" + strconv.Itoa(int(o)) + ")"
	}
	return redOpNames[o]
}

// UniqueIDBytes is the size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: made once by one rank (GetUniqueID) and
// handed to every rank of the communicator before InitRank, over any
// channel: a comm.Comm broadcast, an environment variable, a file. Its
// zero value is not a valid id.
type UniqueID [UniqueIDBytes]byte

// MarshalBinary returns the id's 128 bytes. It never fails.
func (id UniqueID) MarshalBinary() ([]byte, error) { return id[:], nil }

// UnmarshalBinary sets id from exactly 128 bytes.
func (id *UniqueID) UnmarshalBinary(b []byte) error {
	if len(b) != UniqueIDBytes {
		return fmt.Errorf("nccl: unique id: got %d bytes, want %d", len(b), UniqueIDBytes)
	}
	copy(id[:], b)
	return nil
}

// MarshalText returns the id as 256 lower-case hex digits. It never fails.
func (id UniqueID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText sets id from 256 hex digits (either case).
func (id *UniqueID) UnmarshalText(b []byte) error {
	parsed, err := ParseUniqueID(string(b))
	if err != nil {
		return err
	}
	*id = parsed
	return nil
}

// String returns the id as 256 lower-case hex digits.
func (id UniqueID) String() string { return hex.EncodeToString(id[:]) }

// ParseUniqueID parses the 256 hex digits String produces.
func ParseUniqueID(s string) (UniqueID, error) {
	var id UniqueID
	if len(s) != 2*UniqueIDBytes {
		return id, fmt.Errorf("nccl: unique id: got %d hex digits, want %d", len(s), 2*UniqueIDBytes)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("nccl: unique id: %v", err)
	}
	return id, nil
}

// IsZero reports whether id is the zero value (never made by GetUniqueID).
func (id UniqueID) IsZero() bool { return id == UniqueID{} }

// Version is a library version, as ncclGetVersion reports it.
type Version struct {
	Major, Minor, Patch int
	Code                int // the raw code: 22703 for 2.27.3 (2708 for 2.7.8 before 2.9)
}

// VersionFromCode decodes ncclGetVersion's code: major·10000 + minor·100 +
// patch from 2.9 on (NCCL_VERSION_CODE ≥ 20900), major·1000 + minor·100 +
// patch before.
func VersionFromCode(code int) Version {
	if code >= 10000 {
		return Version{Major: code / 10000, Minor: code % 10000 / 100, Patch: code % 100, Code: code}
	}
	return Version{Major: code / 1000, Minor: code % 1000 / 100, Patch: code % 100, Code: code}
}

// String returns "major.minor.patch".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }
