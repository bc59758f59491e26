// Package rendezvous places keys on nodes by rendezvous (highest random
// weight) hashing: every node scores every key, and a key goes to the node
// with the highest score. Anyone who knows the same nodes computes the
// same placement without asking anyone, and when a node joins or leaves
// only the keys it wins or held move (about 1/N of them), where a modulo
// placement would move almost all.
//
// The score is FNV-1a over node, a zero byte and key, finished with
// splitmix64's mixer: FNV-1a alone leaves the scores of names that differ
// only in their last bytes (ports, device numbers) correlated. The
// function is part of the cluster's behaviour: nodes of one cluster must
// agree on it.
package rendezvous

import (
	"hash/fnv"
	"slices"
)

// Score is node's weight for key.
func Score(node, key string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(key))
	return mix64(h.Sum64())
}

// Pick returns the node key is placed on ("" when there are none); ties,
// which need equal 64-bit scores, go to the smaller name.
func Pick(nodes []string, key string) string {
	best, bestScore := "", uint64(0)
	for _, n := range nodes {
		s := Score(n, key)
		if best == "" || s > bestScore || s == bestScore && n < best {
			best, bestScore = n, s
		}
	}
	return best
}

// Rank returns nodes ordered for key, the one Pick returns first: where a
// key goes next when the nodes before fail. nodes is not changed.
func Rank(nodes []string, key string) []string {
	out := slices.Clone(nodes)
	slices.SortFunc(out, func(a, b string) int {
		sa, sb := Score(a, key), Score(b, key)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		case a < b:
			return -1
		case a > b:
			return 1
		}
		return 0
	})
	return out
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
