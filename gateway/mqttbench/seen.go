package mqttbench

// Seen is a growable bitset of the sequence numbers (or store positions)
// a receiver got, to tell a first delivery from a duplicate. Not safe for
// concurrent use.
type Seen []uint64

// Add marks n and reports whether it was not marked before.
func (s *Seen) Add(n uint64) bool {
	word, bit := n/64, uint64(1)<<(n%64)
	if word >= uint64(len(*s)) {
		*s = append(*s, make([]uint64, int(word)+1-len(*s)+len(*s)/2)...)
	}
	if (*s)[word]&bit != 0 {
		return false
	}
	(*s)[word] |= bit
	return true
}

// Has reports whether n is marked.
func (s Seen) Has(n uint64) bool {
	word := n / 64
	return word < uint64(len(s)) && s[word]&(1<<(n%64)) != 0
}
