//go:build !linux

package shmsync

import (
	"errors"
	"fmt"
)

var errNoMemfd = fmt.Errorf("shmsync: memory files: %w on this platform", errors.ErrUnsupported)

// OpenProcFd is unsupported off Linux.
func OpenProcFd(pid, fd, flags int) (int, error) { return -1, errNoMemfd }

// NewProbe is unsupported off Linux.
func NewProbe() (FileRef, int, error) { return FileRef{}, -1, errNoMemfd }

// Open is unsupported off Linux.
func (r FileRef) Open(open Opener, flags int) (int, error) { return -1, errNoMemfd }
