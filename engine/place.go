package engine

// place records where the ranks are: hosts lists the ranks of each host
// (nil: all on one host). The ring algorithms follow the hosts in order,
// each host's ranks adjacent, so that a ring crosses each host boundary
// once; the hierarchical algorithms need every host to hold as many ranks.
func (c *Comm) place(hosts [][]int) {
	if len(hosts) == 0 {
		all := make([]int, c.size)
		for i := range all {
			all[i] = i
		}
		hosts = [][]int{all}
	}
	c.hosts = hosts
	c.evenHosts = true
	var ring []int
	identity := true
	for _, h := range hosts {
		c.evenHosts = c.evenHosts && len(h) == len(hosts[0])
		for _, r := range h {
			identity = identity && r == len(ring)
			ring = append(ring, r)
		}
	}
	c.rings = nil
	if !identity {
		c.rings = [][]int{ring}
	}
}
