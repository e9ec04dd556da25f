package bootstrap

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// A job whose ranks all share one host needs no secret from the operator:
// the first rank to arrive writes 32 random bytes to a file only the job's
// user can read, and the others read it. Nobody else (another user, or a
// process on another host that can reach the root's port) can learn it,
// unlike a secret derived from the launch environment.
//
//	<dir>/gocoll-<uid>-<hash of the job key>/secret   dir 0700, file 0600
//
// <dir> is $XDG_RUNTIME_DIR (private to the user on systemd hosts), else
// $TMPDIR, else /tmp. The file holds "<writer pid> <hex secret>\n". Owner
// and mode are checked on the open descriptors, and nothing follows a
// symbolic link, so another user cannot plant or redirect either. A file
// whose writer is gone (a job with this key that died during setup) is
// replaced. The rendezvous root removes the file once every rank joined
// (RemoveOnJoin), or when it stops.

const secretFileName = "secret"

// SecretFile returns the secret of the one-host job named by jobKey (equal
// on every rank) and the file it is kept in, creating both if this is the
// first rank. getenv reads XDG_RUNTIME_DIR and TMPDIR.
func SecretFile(getenv func(string) string, jobKey string) (secret []byte, path string, err error) {
	base := getenv("XDG_RUNTIME_DIR")
	if base == "" {
		base = getenv("TMPDIR")
	}
	if base == "" {
		base = "/tmp"
	}
	sum := sha256.Sum256([]byte("gocoll secret file v1\x00" + jobKey))
	uid := os.Getuid()
	dir := filepath.Join(base, fmt.Sprintf("gocoll-%d-%s", uid, hex.EncodeToString(sum[:12])))
	path = filepath.Join(dir, secretFileName)
	fail := func(err error) ([]byte, string, error) {
		return nil, "", fmt.Errorf("bootstrap: job secret file %s: %w", path, err)
	}
	if err := syscall.Mkdir(dir, 0o700); err != nil && err != syscall.EEXIST {
		return fail(err)
	}
	dfd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	defer syscall.Close(dfd)
	if err := checkPrivate(dfd, uid, syscall.S_IFDIR); err != nil {
		return fail(fmt.Errorf("directory %s: %w", dir, err))
	}
	// One rank at a time decides whether to create or replace the file.
	if err := syscall.Flock(dfd, syscall.LOCK_EX); err != nil {
		return fail(err)
	}
	defer syscall.Flock(dfd, syscall.LOCK_UN)

	secret, err = readSecret(path, uid)
	if err == nil {
		return secret, path, nil
	}
	if !errors.Is(err, errStale) && !errors.Is(err, syscall.ENOENT) {
		return fail(err)
	}
	if errors.Is(err, errStale) {
		if err := syscall.Unlink(path); err != nil && err != syscall.ENOENT {
			return fail(err)
		}
	}
	secret = make([]byte, 32)
	rand.Read(secret)
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fail(err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%d %s\n", os.Getpid(), hex.EncodeToString(secret)); err != nil {
		syscall.Unlink(path)
		return fail(err)
	}
	return secret, path, nil
}

// errStale: the file's writer is gone.
var errStale = errors.New("stale secret file")

func readSecret(path string, uid int) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := checkPrivate(fd, uid, syscall.S_IFREG); err != nil {
		return nil, err
	}
	var buf [128]byte
	n, _ := f.Read(buf[:])
	pidText, secretText, ok := bytes.Cut(bytes.TrimSpace(buf[:n]), []byte(" "))
	pid, perr := strconv.Atoi(string(pidText))
	secret, herr := hex.DecodeString(string(secretText))
	if !ok || perr != nil || herr != nil || len(secret) != 32 || pid <= 0 {
		return nil, errStale // a torn or foreign file: replace it
	}
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return nil, errStale
	}
	return secret, nil
}

// checkPrivate: fd is of the given type, owned by uid, with no access for
// group or others.
func checkPrivate(fd, uid int, typ uint32) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return err
	}
	switch {
	case uint32(st.Mode)&syscall.S_IFMT != typ:
		return errors.New("not the expected kind of file")
	case int(st.Uid) != uid:
		return fmt.Errorf("owned by uid %d, not %d", st.Uid, uid)
	case st.Mode&0o077 != 0:
		return fmt.Errorf("mode %#o lets others in", st.Mode&0o777)
	}
	return nil
}

// RemoveSecretFile removes the job's secret file and its directory (the
// root calls it; other ranks never need to).
func RemoveSecretFile(path string) {
	syscall.Unlink(path)
	syscall.Rmdir(filepath.Dir(path))
}
