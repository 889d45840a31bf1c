//go:build race

package rma

// raceEnabled: the race detector's pools drop objects at random, so
// allocation counts do not hold under it.
const raceEnabled = true
