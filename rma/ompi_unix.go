//go:build unix

package rma

import (
	"io/fs"
	"os"
	"syscall"
)

// syscallNoFollow keeps open from following a symbolic link.
const syscallNoFollow = syscall.O_NOFOLLOW

// ownedByMe tells whether this process's user owns the file.
func ownedByMe(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == os.Getuid()
}
