package bootstrap

import (
	"crypto/rand"
	"errors"
	"fmt"
)

// UniqueID names a job's root and carries its secret, in the 128 bytes of
// gocollUniqueId (NCCL's ncclUniqueId shape). Layout:
//
//	[0:4]   magic "GCID"
//	[4]     version (1)
//	[5]     length L of the root address
//	[6:22]  secret (16 random bytes)
//	[22:22+L] root address "host:port"
//	rest    zero
type UniqueID [128]byte

const (
	idVersion   = 1
	idSecretOff = 6
	idAddrOff   = idSecretOff + 16
	// MaxRootAddr is the longest root address a UniqueID can carry.
	MaxRootAddr = len(UniqueID{}) - idAddrOff
)

var idMagic = [4]byte{'G', 'C', 'I', 'D'}

// NewSecret returns 16 random bytes for NewUniqueID.
func NewSecret() [16]byte {
	var s [16]byte
	rand.Read(s[:])
	return s
}

// NewUniqueID packs rootAddr ("host:port", at most MaxRootAddr bytes) and
// secret into a UniqueID.
func NewUniqueID(rootAddr string, secret [16]byte) (UniqueID, error) {
	var id UniqueID
	if rootAddr == "" {
		return id, errors.New("bootstrap: unique id needs a root address")
	}
	if len(rootAddr) > MaxRootAddr {
		return id, fmt.Errorf("bootstrap: root address %q is longer than the %d bytes a unique id holds", rootAddr, MaxRootAddr)
	}
	copy(id[0:4], idMagic[:])
	id[4] = idVersion
	id[5] = byte(len(rootAddr))
	copy(id[idSecretOff:idAddrOff], secret[:])
	copy(id[idAddrOff:], rootAddr)
	return id, nil
}

// Parse returns the root address and the 16-byte secret of id.
func (id UniqueID) Parse() (rootAddr string, secret []byte, err error) {
	if [4]byte(id[0:4]) != idMagic {
		return "", nil, errors.New("bootstrap: not a gocoll unique id (bad magic; was it made by gocollGetUniqueId and copied whole?)")
	}
	if id[4] != idVersion {
		return "", nil, fmt.Errorf("bootstrap: unique id version %d, this library reads version %d", id[4], idVersion)
	}
	n := int(id[5])
	if n == 0 || n > MaxRootAddr {
		return "", nil, fmt.Errorf("bootstrap: unique id has a bad address length %d", n)
	}
	return string(id[idAddrOff : idAddrOff+n]), append([]byte(nil), id[idSecretOff:idAddrOff]...), nil
}
