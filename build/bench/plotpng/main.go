// Command plotpng draws build/compare's plot without matplotlib, with the Go
// standard library only: one log-log panel (busbw against size) per op × np,
// one line per library.
//
//	go run ./build/bench/plotpng plotdata.json results.png
//
// plotdata.json is written by build/bench/compare_report.py:
//
//	{"title": "...", "cols": 2, "panels": [{"title": "allreduce np=2",
//	  "series": [{"name": "gocoll", "points": [[4096, 0.08], ...]}, ...]}, ...]}
//
// Text uses a built-in 5×7 pixel font (lower case, digits, a few symbols).
package main

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strings"
)

type series struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"`
}

type panel struct {
	Title  string   `json:"title"`
	Series []series `json:"series"`
}

type plotData struct {
	Title  string  `json:"title"`
	Cols   int     `json:"cols"`
	Panels []panel `json:"panels"`
}

const (
	panelW, panelH = 520, 330
	headH          = 34
	marginL        = 62
	marginR        = 16
	marginT        = 28
	marginB        = 34
)

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{225, 225, 225, 255}
	dark  = color.RGBA{90, 90, 90, 255}
	// fixed colours per library, as in the matplotlib version
	libColor = map[string]color.RGBA{
		"gocoll":            {31, 119, 180, 255},
		"gocoll (MemAlloc)": {31, 119, 180, 255},
		"Gloo":              {255, 127, 14, 255},
		"Open MPI":          {44, 160, 44, 255},
	}
	extra = []color.RGBA{{214, 39, 40, 255}, {148, 103, 189, 255}, {140, 86, 75, 255}}
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: plotpng plotdata.json out.png")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var d plotData
	if err := json.Unmarshal(raw, &d); err != nil {
		fail(err)
	}
	img := render(&d)
	f, err := os.Create(os.Args[2])
	if err != nil {
		fail(err)
	}
	if err := png.Encode(f, img); err != nil {
		fail(err)
	}
	if err := f.Close(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "plotpng:", err)
	os.Exit(1)
}

func render(d *plotData) *image.RGBA {
	cols := max(d.Cols, 1)
	rows := max((len(d.Panels)+cols-1)/cols, 1)
	img := image.NewRGBA(image.Rect(0, 0, cols*panelW, headH+rows*panelH))
	fill(img, img.Bounds(), white)
	text(img, 10, 10, d.Title, 2, black)
	// one x range for every panel: the sizes
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, p := range d.Panels {
		for _, s := range p.Series {
			for _, pt := range s.Points {
				xmin, xmax = math.Min(xmin, pt[0]), math.Max(xmax, pt[0])
			}
		}
	}
	if math.IsInf(xmin, 0) {
		return img
	}
	var ticks []float64
	for _, p := range d.Panels {
		for _, s := range p.Series {
			for _, pt := range s.Points {
				ticks = appendUnique(ticks, pt[0])
			}
		}
	}
	for i, p := range d.Panels {
		ox, oy := (i%cols)*panelW, headH+(i/cols)*panelH
		drawPanel(img, ox, oy, &p, math.Log2(xmin)-0.3, math.Log2(xmax)+0.3, ticks)
	}
	return img
}

func appendUnique(v []float64, x float64) []float64 {
	for _, y := range v {
		if y == x {
			return v
		}
	}
	return append(v, x)
}

func drawPanel(img *image.RGBA, ox, oy int, p *panel, lx0, lx1 float64, xticks []float64) {
	x0, y0 := ox+marginL, oy+marginT
	x1, y1 := ox+panelW-marginR, oy+panelH-marginB
	text(img, x0, oy+8, p.Title, 2, black)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if pt[1] > 0 {
				ymin, ymax = math.Min(ymin, pt[1]), math.Max(ymax, pt[1])
			}
		}
	}
	if math.IsInf(ymin, 0) {
		ymin, ymax = 0.1, 1
	}
	ly0, ly1 := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
	if ly1 <= ly0 {
		ly1 = ly0 + 1
	}
	px := func(x float64) int { return x0 + int(math.Round((math.Log2(x)-lx0)/(lx1-lx0)*float64(x1-x0))) }
	py := func(y float64) int { return y1 - int(math.Round((math.Log10(y)-ly0)/(ly1-ly0)*float64(y1-y0))) }
	// grid and ticks
	for e := ly0; e <= ly1; e++ {
		for m := 1.0; m < 10 && e+math.Log10(m) <= ly1; m++ {
			y := py(m * math.Pow(10, e))
			c := grey
			if m == 1 {
				c = color.RGBA{200, 200, 200, 255}
				lbl := decade(e)
				text(img, x0-6-textWidth(lbl, 1), y-3, lbl, 1, dark)
			}
			hline(img, x0, x1, y, c)
		}
	}
	for _, t := range xticks {
		x := px(t)
		vline(img, x, y0, y1, grey)
		lbl := human(t)
		text(img, x-textWidth(lbl, 1)/2, y1+6, lbl, 1, dark)
	}
	text(img, x0+(x1-x0)/2-textWidth("size", 1)/2, y1+18, "size", 1, dark)
	textV(img, ox+6, y0+(y1-y0)/2+textWidth("busbw gb/s", 1)/2, "busbw gb/s", dark)
	// frame
	hline(img, x0, x1, y0, black)
	hline(img, x0, x1, y1, black)
	vline(img, x0, y0, y1, black)
	vline(img, x1, y0, y1, black)
	// series
	for i, s := range p.Series {
		c, ok := libColor[s.Name]
		if !ok {
			c = extra[i%len(extra)]
		}
		dashed := strings.Contains(s.Name, "MemAlloc")
		var prev *[2]int
		for _, pt := range s.Points {
			if pt[1] <= 0 {
				continue
			}
			cur := [2]int{px(pt[0]), py(pt[1])}
			if prev != nil {
				line(img, prev[0], prev[1], cur[0], cur[1], c, dashed)
			}
			marker(img, cur[0], cur[1], c, i)
			prev = &cur
		}
		// legend, top left
		ly := y0 + 8 + i*12
		line(img, x0+8, ly+3, x0+28, ly+3, c, dashed)
		marker(img, x0+18, ly+3, c, i)
		text(img, x0+34, ly, s.Name, 1, black)
	}
}

func decade(e float64) string {
	v := math.Pow(10, e)
	if e >= 0 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(fmt.Sprintf("%.*f", int(-e), v), "0")
}

func human(b float64) string {
	switch n := int64(b); {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dgib", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dmib", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dkib", n>>10)
	default:
		return fmt.Sprintf("%d", n)
	}
}

// ---------------------------------------------------------------- drawing

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

// line draws a 2-pixel line (Bresenham); dashed lines skip every other 6 pixels.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, dashed bool) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for n := 0; ; n++ {
		if !dashed || (n/6)%2 == 0 {
			img.SetRGBA(x0, y0, c)
			img.SetRGBA(x0+1, y0, c)
			img.SetRGBA(x0, y0+1, c)
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func marker(img *image.RGBA, x, y int, c color.RGBA, kind int) {
	for j := -3; j <= 3; j++ {
		for i := -3; i <= 3; i++ {
			in := true
			switch kind % 3 {
			case 1: // diamond
				in = abs(i)+abs(j) <= 3
			case 2: // triangle
				in = j >= -3 && abs(i) <= (j+3)/2
			}
			if in {
				img.SetRGBA(x+i, y+j, c)
			}
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// ---------------------------------------------------------------- 5×7 font

// glyphs: 7 rows of 5 bits (bit 4 = leftmost column).
var glyphs = map[rune][7]byte{
	'0': {0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e}, '1': {0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e},
	'2': {0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f}, '3': {0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e},
	'4': {0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02}, '5': {0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e},
	'6': {0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e}, '7': {0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
	'8': {0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e}, '9': {0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c},
	'a': {0x00, 0x00, 0x0e, 0x01, 0x0f, 0x11, 0x0f}, 'b': {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1e},
	'c': {0x00, 0x00, 0x0e, 0x10, 0x10, 0x11, 0x0e}, 'd': {0x01, 0x01, 0x0d, 0x13, 0x11, 0x11, 0x0f},
	'e': {0x00, 0x00, 0x0e, 0x11, 0x1f, 0x10, 0x0e}, 'f': {0x06, 0x09, 0x08, 0x1c, 0x08, 0x08, 0x08},
	'g': {0x00, 0x0f, 0x11, 0x11, 0x0f, 0x01, 0x0e}, 'h': {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11},
	'i': {0x04, 0x00, 0x0c, 0x04, 0x04, 0x04, 0x0e}, 'j': {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0c},
	'k': {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}, 'l': {0x0c, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e},
	'm': {0x00, 0x00, 0x1a, 0x15, 0x15, 0x11, 0x11}, 'n': {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11},
	'o': {0x00, 0x00, 0x0e, 0x11, 0x11, 0x11, 0x0e}, 'p': {0x00, 0x00, 0x1e, 0x11, 0x1e, 0x10, 0x10},
	'q': {0x00, 0x00, 0x0d, 0x13, 0x0f, 0x01, 0x01}, 'r': {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10},
	's': {0x00, 0x00, 0x0e, 0x10, 0x0e, 0x01, 0x1e}, 't': {0x08, 0x08, 0x1c, 0x08, 0x08, 0x09, 0x06},
	'u': {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0d}, 'v': {0x00, 0x00, 0x11, 0x11, 0x11, 0x0a, 0x04},
	'w': {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0a}, 'x': {0x00, 0x00, 0x11, 0x0a, 0x04, 0x0a, 0x11},
	'y': {0x00, 0x00, 0x11, 0x11, 0x0f, 0x01, 0x0e}, 'z': {0x00, 0x00, 0x1f, 0x02, 0x04, 0x08, 0x1f},
	'.': {0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c}, ',': {0x00, 0x00, 0x00, 0x00, 0x0c, 0x04, 0x08},
	'-': {0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00}, '=': {0x00, 0x00, 0x1f, 0x00, 0x1f, 0x00, 0x00},
	'/': {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}, '(': {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02},
	')': {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}, ':': {0x00, 0x0c, 0x0c, 0x00, 0x0c, 0x0c, 0x00},
	'%': {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}, '#': {0x0a, 0x0a, 0x1f, 0x0a, 0x1f, 0x0a, 0x0a},
	'_': {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1f}, '+': {0x00, 0x04, 0x04, 0x1f, 0x04, 0x04, 0x00},
}

func textWidth(s string, scale int) int { return len([]rune(s)) * 6 * scale }

// text draws s (upper case is drawn as lower case) with its top left at (x, y).
func text(img *image.RGBA, x, y int, s string, scale int, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		g := glyphs[r]
		for row := 0; row < 7; row++ {
			for col := 0; col < 5; col++ {
				if g[row]&(0x10>>col) == 0 {
					continue
				}
				for dy := 0; dy < scale; dy++ {
					for dx := 0; dx < scale; dx++ {
						img.SetRGBA(x+col*scale+dx, y+row*scale+dy, c)
					}
				}
			}
		}
		x += 6 * scale
	}
}

// textV draws s rotated by 90° (reading upwards), starting at (x, y) going up.
func textV(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		g := glyphs[r]
		for row := 0; row < 7; row++ {
			for col := 0; col < 5; col++ {
				if g[row]&(0x10>>col) != 0 {
					img.SetRGBA(x+row, y-col, c)
				}
			}
		}
		y -= 6
	}
}
