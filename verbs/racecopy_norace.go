//go:build !race

package verbs

func copyRacy(dst, src []byte) { copy(dst, src) }

// raceBuild says whether the race detector is on.
const raceBuild = false
