package main

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// DefaultDataDir is where Debian's dataset-fashion-mnist package puts the
// IDX files.
const DefaultDataDir = "/usr/share/datasets/fashion-mnist"

// installHint ends every error about a missing or damaged data file.
const installHint = "install Fashion-MNIST with `apt-get install -y dataset-fashion-mnist` " +
	"(reinstall with `apt-get install --reinstall dataset-fashion-mnist` if it is damaged), " +
	"or point -data at a directory holding the four IDX files"

// errDataset marks a data file that is missing, truncated or malformed.
var errDataset = errors.New("fashion-mnist data")

// idxArray is the content of one IDX file of unsigned bytes: its dimensions
// and its data in row-major order.
type idxArray struct {
	dims []int
	data []byte
}

// openIDX opens name in dir, or name+".gz" (decompressed on the fly).
func openIDX(dir, name string) (io.ReadCloser, string, error) {
	var firstErr error
	for _, cand := range []string{name, name + ".gz"} {
		path := filepath.Join(dir, cand)
		f, err := os.Open(path)
		if err != nil {
			if firstErr == nil || !errors.Is(err, fs.ErrNotExist) {
				firstErr = err
			}
			continue
		}
		if filepath.Ext(cand) != ".gz" {
			return f, path, nil
		}
		zr, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<16))
		if err != nil {
			f.Close()
			return nil, path, fmt.Errorf("%w: %s: not a gzip file (%v); %s", errDataset, path, err, installHint)
		}
		return struct {
			io.Reader
			io.Closer
		}{zr, f}, path, nil
	}
	return nil, "", fmt.Errorf("%w: %s (or %s.gz) in %s: %w; %s", errDataset, name, name, dir, firstErr, installHint)
}

// readIDX reads the IDX file name (or name.gz) from dir. Only the unsigned
// byte element type (0x08) is accepted: that is what (Fashion-)MNIST uses.
func readIDX(dir, name string) (*idxArray, error) {
	rc, path, err := openIDX(dir, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	a, err := parseIDX(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v; %s", errDataset, path, err, installHint)
	}
	return a, nil
}

// parseIDX decodes an IDX stream: two zero bytes, the element type, the
// number of dimensions, one big-endian uint32 per dimension, then the data.
func parseIDX(r io.Reader) (*idxArray, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, fmt.Errorf("truncated header: %v", eofAsTruncated(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("bad magic %x: not an IDX file", magic)
	}
	if magic[2] != 0x08 {
		return nil, fmt.Errorf("element type %#x: only unsigned bytes (0x08) are supported", magic[2])
	}
	nd := int(magic[3])
	if nd < 1 || nd > 4 {
		return nil, fmt.Errorf("%d dimensions: want 1 to 4", nd)
	}
	dims := make([]int, nd)
	total := 1
	for i := range dims {
		var d uint32
		if err := binary.Read(r, binary.BigEndian, &d); err != nil {
			return nil, fmt.Errorf("truncated header: %v", eofAsTruncated(err))
		}
		if d == 0 || d > 1<<24 {
			return nil, fmt.Errorf("dimension %d has size %d", i, d)
		}
		dims[i] = int(d)
		total *= int(d)
		if total > 1<<32 {
			return nil, fmt.Errorf("dimensions %v are too large", dims[:i+1])
		}
	}
	data := make([]byte, total)
	if n, err := io.ReadFull(r, data); err != nil {
		return nil, fmt.Errorf("truncated: dimensions %v need %d data bytes, found %d (%v)", dims, total, n, eofAsTruncated(err))
	}
	return &idxArray{dims: dims, data: data}, nil
}

func eofAsTruncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("unexpected end of file")
	}
	return err
}

// Fashion-MNIST file names (the Debian package ships them gzipped).
var fashionFiles = map[string][2]string{
	"train": {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
	"test":  {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"},
}

// LoadFashionMNIST reads the "train" or "test" split from dir. limit > 0
// keeps only the first limit examples.
func LoadFashionMNIST(dir, split string, limit int) (*Dataset, error) {
	files, ok := fashionFiles[split]
	if !ok {
		return nil, fmt.Errorf("unknown split %q", split)
	}
	img, err := readIDX(dir, files[0])
	if err != nil {
		return nil, err
	}
	lab, err := readIDX(dir, files[1])
	if err != nil {
		return nil, err
	}
	if len(img.dims) != 3 || len(lab.dims) != 1 {
		return nil, fmt.Errorf("%w: %s: images have dimensions %v and labels %v, want [n rows cols] and [n]; %s", errDataset, dir, img.dims, lab.dims, installHint)
	}
	n := img.dims[0]
	if lab.dims[0] != n {
		return nil, fmt.Errorf("%w: %s: %d images but %d labels; %s", errDataset, dir, n, lab.dims[0], installHint)
	}
	for i, l := range lab.data {
		if l >= 10 {
			return nil, fmt.Errorf("%w: %s: label %d of example %d is not a class 0..9; %s", errDataset, files[1], l, i, installHint)
		}
	}
	feat := img.dims[1] * img.dims[2]
	if limit > 0 && limit < n {
		n = limit
	}
	return &Dataset{
		N: n, Features: feat, Classes: 10,
		Labels: lab.data[:n],
		pixels: img.data[:n*feat],
	}, nil
}

// probeFashionMNIST checks that the four files are there and start with an
// IDX header, without reading them whole.
func probeFashionMNIST(dir string) error {
	for _, split := range []string{"train", "test"} {
		for _, name := range fashionFiles[split] {
			rc, path, err := openIDX(dir, name)
			if err != nil {
				return err
			}
			var head [4]byte
			_, err = io.ReadFull(rc, head[:])
			rc.Close()
			if err != nil || head[0] != 0 || head[1] != 0 || head[2] != 0x08 {
				return fmt.Errorf("%w: %s: not an IDX file of bytes; %s", errDataset, path, installHint)
			}
		}
	}
	return nil
}
