package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// idxBytes encodes an IDX file of unsigned bytes.
func idxBytes(dims []int, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	return b.Bytes()
}

func gzipBytes(t *testing.T, raw []byte) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// writeSplit writes a small Fashion-MNIST-shaped split of n 2×3 images.
func writeSplit(t *testing.T, dir, split string, n int, gz bool) {
	t.Helper()
	img := make([]byte, n*6)
	for i := range img {
		img[i] = byte(i * 7)
	}
	lab := make([]byte, n)
	for i := range lab {
		lab[i] = byte(i % 10)
	}
	for i, raw := range [][]byte{idxBytes([]int{n, 2, 3}, img), idxBytes([]int{n}, lab)} {
		name := fashionFiles[split][i]
		if gz {
			raw, name = gzipBytes(t, raw), name+".gz"
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIDXReadPlainAndGzip(t *testing.T) {
	for _, gz := range []bool{false, true} {
		dir := t.TempDir()
		writeSplit(t, dir, "train", 5, gz)
		d, err := LoadFashionMNIST(dir, "train", 0)
		if err != nil {
			t.Fatalf("gzip=%v: %v", gz, err)
		}
		if d.N != 5 || d.Features != 6 || d.Classes != 10 {
			t.Fatalf("gzip=%v: got %d examples of %d features", gz, d.N, d.Features)
		}
		row := make([]float64, 6)
		d.Row(3, row)
		for j, v := range row {
			if want := float64(byte((3*6+j)*7)) / 255; v != want {
				t.Fatalf("gzip=%v: pixel %d of image 3 = %v, want %v", gz, j, v, want)
			}
		}
		if d.Labels[3] != 3 {
			t.Fatalf("label 3 = %d", d.Labels[3])
		}
		if lim, err := LoadFashionMNIST(dir, "train", 2); err != nil || lim.N != 2 {
			t.Fatalf("limit 2: %v, %v", lim, err)
		}
	}
}

func assertInstallHint(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one about %q", want)
	}
	msg := err.Error()
	if !errors.Is(err, errDataset) || !strings.Contains(msg, want) || !strings.Contains(msg, "apt-get install -y dataset-fashion-mnist") {
		t.Fatalf("error %q: want errDataset, %q and how to install the data", msg, want)
	}
}

func TestIDXMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadFashionMNIST(dir, "test", 0)
	assertInstallHint(t, err, "t10k-images-idx3-ubyte")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%v: want fs.ErrNotExist", err)
	}
	assertInstallHint(t, probeFashionMNIST(dir), "no such file")
	// Images there, labels missing.
	writeSplit(t, dir, "test", 3, true)
	os.Remove(filepath.Join(dir, "t10k-labels-idx1-ubyte.gz"))
	_, err = LoadFashionMNIST(dir, "test", 0)
	assertInstallHint(t, err, "t10k-labels-idx1-ubyte")
}

func TestIDXTruncated(t *testing.T) {
	full := idxBytes([]int{4, 2, 3}, make([]byte, 24))
	cases := map[string][]byte{
		"data":   full[:len(full)-5],
		"header": full[:9],
		"empty":  nil,
	}
	for _, raw := range cases {
		for _, gz := range []bool{false, true} {
			dir := t.TempDir()
			writeSplit(t, dir, "train", 4, false)
			file := filepath.Join(dir, "train-images-idx3-ubyte")
			data := raw
			if gz {
				os.Remove(file)
				file += ".gz"
				data = gzipBytes(t, raw)
			}
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadFashionMNIST(dir, "train", 0)
			assertInstallHint(t, err, "truncated")
		}
	}
	// A gzip stream cut short.
	dir := t.TempDir()
	writeSplit(t, dir, "train", 4, true)
	file := filepath.Join(dir, "train-images-idx3-ubyte.gz")
	z, _ := os.ReadFile(file)
	os.WriteFile(file, z[:len(z)/2], 0o644)
	_, err := LoadFashionMNIST(dir, "train", 0)
	assertInstallHint(t, err, "train-images-idx3-ubyte.gz")
}

func TestIDXMalformed(t *testing.T) {
	cases := map[string]struct {
		images, labels []byte
		want           string
	}{
		"magic":    {[]byte("PK\x03\x04 not idx"), idxBytes([]int{1}, []byte{0}), "not an IDX file"},
		"type":     {[]byte{0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0}, idxBytes([]int{1}, []byte{0}), "element type"},
		"count":    {idxBytes([]int{2, 1, 1}, []byte{1, 2}), idxBytes([]int{3}, []byte{0, 1, 2}), "2 images but 3 labels"},
		"label":    {idxBytes([]int{1, 1, 1}, []byte{1}), idxBytes([]int{1}, []byte{10}), "not a class"},
		"shape":    {idxBytes([]int{2}, []byte{1, 2}), idxBytes([]int{2}, []byte{0, 1}), "dimensions"},
		"zero dim": {idxBytes([]int{0, 28, 28}, nil), idxBytes([]int{0}, nil), "size 0"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "train-images-idx3-ubyte"), tc.images, 0o644)
			os.WriteFile(filepath.Join(dir, "train-labels-idx1-ubyte"), tc.labels, 0o644)
			_, err := LoadFashionMNIST(dir, "train", 0)
			assertInstallHint(t, err, tc.want)
		})
	}
}
