//go:build race

package verbs

// copyRacy copies src to dst unseen by the race detector: for the
// responses to a duplicate READ, which re-read memory the application may
// rightly be writing (its READ completed, the target was told), as
// InfiniBand allows; the requester discards them. A loop, since copy
// reports to the detector even here.
//
//go:norace
func copyRacy(dst, src []byte) {
	for i := range src {
		dst[i] = src[i]
	}
}

const raceBuild = true
