package topology

import "fmt"

// DoubleBinaryTree returns two binary trees over ranks 0..n-1 as parent
// arrays (parent -1 at the root), NCCL-style: in the first, a rank's
// children are rank ± half its lowest set bit, so every odd rank is a leaf;
// the second is the first mirrored (n even) or shifted by one rank (n
// odd), which makes those leaves its inner nodes. So every rank is an inner
// node of at most one tree (with n odd, rank 0 is also the one-child root
// of the first), and a tree allreduce that sends half the data
// down each tree keeps every rank's links busy both ways.
func DoubleBinaryTree(n int) [2][]int {
	t0 := make([]int, n)
	for r := range t0 {
		t0[r] = btreeParent(r, n)
	}
	t1 := make([]int, n)
	for r := range t1 {
		// Rank r of tree 1 plays position m(r) of tree 0.
		m := func(x int) int {
			if n%2 == 1 {
				return (x + n - 1) % n
			}
			return n - 1 - x
		}
		inv := func(x int) int {
			if n%2 == 1 {
				return (x + 1) % n
			}
			return n - 1 - x
		}
		if p := t0[m(r)]; p >= 0 {
			t1[r] = inv(p)
		} else {
			t1[r] = -1
		}
	}
	return [2][]int{t0, t1}
}

// btreeParent: the root is rank 0, whose only child is the largest power of
// two below n; below it, ranks 1..n-1 form an in-order tree in which a rank
// with lowest set bit b has children r-b/2 and r+b/2, the latter replaced by
// r+b/4, r+b/8… while it is not below n. Found by walking down from the top.
func btreeParent(r, n int) int {
	if r == 0 {
		return -1
	}
	top := 1
	for top*2 < n {
		top *= 2
	}
	if r == top {
		return 0
	}
	// Walk down from top toward r.
	at, step := top, top/2
	for step > 0 {
		child := at - step
		if r > at {
			child = at + step
			for child >= n && step > 0 {
				step /= 2
				child = at + step
			}
			if step == 0 {
				break
			}
		}
		if child == r {
			return at
		}
		at, step = child, step/2
	}
	panic(fmt.Sprintf("topology: rank %d not found in the binary tree of %d", r, n))
}

// CheckTree verifies a parent array: one root, every rank reaches it, at
// most two children each.
func CheckTree(parent []int) error {
	n := len(parent)
	roots, kids := 0, make([]int, n)
	for r, p := range parent {
		switch {
		case p == -1:
			roots++
		case p < 0 || p >= n || p == r:
			return fmt.Errorf("topology: rank %d has parent %d", r, p)
		default:
			kids[p]++
		}
	}
	if n > 0 && roots != 1 {
		return fmt.Errorf("topology: %d roots", roots)
	}
	for r, k := range kids {
		if k > 2 {
			return fmt.Errorf("topology: rank %d has %d children", r, k)
		}
	}
	for r := range parent {
		at, steps := r, 0
		for parent[at] != -1 {
			at = parent[at]
			if steps++; steps > n {
				return fmt.Errorf("topology: rank %d is on a cycle", r)
			}
		}
	}
	return nil
}
