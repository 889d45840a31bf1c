package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// output is the receiver's side of a transfer: the partial file
// (PATH.haul.part, mapped), its state file, and the final name it is
// renamed to once its SHA-256 checks out. Nothing is written to PATH
// itself before then, so PATH never looks complete when it is not.
type output struct {
	path string
	f    *os.File
	mm   []byte
	st   *stateFile
	log  *slog.Logger
	mu   sync.Mutex // the state's Have and its saving, as regions land
	// direct writes regions past the page cache (direct.go); nil: not
	// opened yet (tried unset), or the file system does not allow it.
	// refused: a direct write failed, and the others go through the page
	// cache (direct stays open until close: another worker may be using
	// it).
	direct  *os.File
	tried   bool
	refused bool
	// hooked: a test's state file hook wraps st's writes already.
	hooked bool
}

// checkOut checks --out before anything waits for a sender: its directory
// exists and is writable, and PATH is not a directory or a special file.
func checkOut(out string) error {
	dir := filepath.Dir(out)
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("--out %s: %w", out, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--out %s: %s is not a directory", out, dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("--out %s: cannot create files in %s: %w", out, dir, err)
	}
	for _, p := range []string{out, partPath(out), statePath(out)} {
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("--out %s: %w", out, err)
		case fi.IsDir():
			return fmt.Errorf("--out %s: %s is a directory", out, p)
		case !fi.Mode().IsRegular():
			return fmt.Errorf("--out %s: %s exists and is not a regular file", out, p)
		}
	}
	return nil
}

// loadResume opens what an earlier run left, if it is usable: the state
// file, valid, and the partial file of its size. The regions it claims are
// hashed again against the sender's region hashes, so that a partial file
// changed since (a bad disk, a stray write, a crash before the page cache
// reached the disk) is repaired by the sender rather than trusted. It
// returns nil, with a warning, when there is nothing to resume, and an
// error only if ctx ends meanwhile.
func loadResume(ctx context.Context, out string, log *slog.Logger) (*output, error) {
	b, err := os.ReadFile(statePath(out))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		log.Warn("cannot read the state file; starting over", "path", statePath(out), "err", err)
		return nil, nil
	}
	st, err := decodeState(b)
	if err != nil {
		log.Warn("discarding the state file; starting over", "path", statePath(out), "err", err)
		return nil, nil
	}
	f, err := os.OpenFile(partPath(out), os.O_RDWR, 0)
	if err != nil {
		log.Warn("the partial output is gone; starting over", "err", err)
		return nil, nil
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != st.Size {
		f.Close()
		log.Warn("the partial output is not of the transfer's size; starting over", "path", partPath(out), "want", st.Size)
		return nil, nil
	}
	sf, err := openState(statePath(out), st)
	if err != nil {
		f.Close()
		log.Warn("cannot reopen the state file; starting over", "err", err)
		return nil, nil
	}
	o := &output{path: out, f: f, st: sf, log: log}
	if k := countRegions(st.Have, regions(st.Size, st.Region)); k > 0 {
		log.Info("checking the regions an earlier run kept", "regions", k, "path", partPath(out))
	}
	bad, err := o.verifyHave(ctx)
	if err != nil {
		o.close()
		return nil, err
	}
	if bad > 0 {
		log.Warn("regions of the partial output do not match their hashes; they will be fetched again", "regions", bad)
		if err := o.st.save(); err != nil {
			o.close()
			log.Warn("starting over", "err", err)
			return nil, nil
		}
	}
	return o, nil
}

// verifyHave hashes each region the state claims, from the file, and
// clears those that do not match; it returns how many it cleared.
func (o *output) verifyHave(ctx context.Context) (int, error) {
	s := &o.st.st
	bad := 0
	buf := make([]byte, 1<<20)
	for i := range regions(s.Size, s.Region) {
		if !hasRegion(s.Have, i) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return bad, err
		}
		lo := int64(i) * s.Region
		d := o.hashing().start(i, s.Region, s.Hashes)
		_, err := io.CopyBuffer(d, io.NewSectionReader(o.f, lo, min(s.Region, s.Size-lo)), buf)
		if err != nil || !o.hashing().ends(d, i, regions(s.Size, s.Region), s.Hashes) {
			clearRegion(s.Have, i)
			bad++
		}
	}
	return bad, nil
}

// matches says whether the output belongs to the transfer off offers.
func (o *output) matches(off *offer) bool {
	s := &o.st.st
	return s.Size == off.Size && s.Digest == off.Digest && s.Hashing == off.Hashing && s.Region == off.Region && s.Manifest == off.Manifest
}

// createOutput starts the transfer off offers from nothing: the partial
// file with its space reserved, then the state file.
func createOutput(out string, off *offer, log *slog.Logger) (*output, error) {
	f, err := os.OpenFile(partPath(out), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	if err := reserve(f, off.Size, log); err != nil {
		f.Close()
		os.Remove(partPath(out))
		return nil, err
	}
	n := regions(off.Size, off.Region)
	st := state{Version: stateVersion, Size: off.Size, Digest: off.Digest, Hashing: off.Hashing, Region: off.Region, Manifest: off.Manifest,
		Have: make([]byte, (n+7)/8)}
	sf, err := createState(statePath(out), st)
	if err != nil {
		f.Close()
		os.Remove(partPath(out))
		os.Remove(statePath(out))
		if errors.Is(err, unix.ENOSPC) {
			return nil, fmt.Errorf("not enough space for the state file on %s: %w", filepath.Dir(out), err)
		}
		return nil, err
	}
	return &output{path: out, f: f, st: sf, log: log}, nil
}

// reserve allocates the file's blocks up front, so that a full disk is an
// error now rather than a SIGBUS when a chunk lands in the mapping.
func reserve(f *os.File, size int64, log *slog.Logger) error {
	if size == 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return nil
	}
	dir := filepath.Dir(f.Name())
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("not enough space for %d bytes on %s: %w", size, dir, err)
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("reserve %d bytes for %s: %w", size, f.Name(), err)
	}
	// No fallocate here: check the free space at least.
	var fs unix.Statfs_t
	if unix.Fstatfs(int(f.Fd()), &fs) == nil && int64(fs.Bavail)*int64(fs.Bsize) < size {
		return fmt.Errorf("not enough space for %d bytes on %s: %d free", size, dir, int64(fs.Bavail)*int64(fs.Bsize))
	}
	log.Warn("the file system cannot reserve space; a disk that fills during the transfer will stop it", "dir", dir)
	return f.Truncate(size)
}

// mapFile maps the partial file for the chunks to land in.
func (o *output) mapFile() error {
	if o.mm != nil || o.st.st.Size == 0 {
		return nil
	}
	mm, err := unix.Mmap(int(o.f.Fd()), 0, int(o.st.st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map %s: %w", o.f.Name(), err)
	}
	o.mm = mm
	return nil
}

func (o *output) regions() int { return regions(o.st.st.Size, o.st.st.Region) }

// span is region i's bytes in the mapping.
func (o *output) span(i int) []byte {
	s := &o.st.st
	lo := int64(i) * s.Region
	return o.mm[lo:min(lo+s.Region, s.Size)]
}

func (o *output) have() []byte { return o.st.st.Have }

// needHashes says whether the sender must send its region hashes first.
func (o *output) needHashes() bool { return o.regions() > 0 && !o.st.st.Hashed }

// setHashes takes the sender's region hashes, checked against the offer's
// manifest, and records them.
func (o *output) setHashes(h []byte) error {
	n := o.regions()
	s := &o.st.st
	if len(h) != n*hashLen || sha256Hex(h) != s.Manifest || o.hashing().digest(s.Size, s.Region, h) != s.Digest {
		return errors.New("the sender's region hashes do not match its offer")
	}
	return o.st.saveHashes(h)
}

// complete records region i if its bytes match the sender's hash, and
// says whether they did.
func (o *output) complete(i int) (bool, error) {
	return o.land(i, o.span(i), false)
}

// land checks region i's bytes in b against the sender's hash and, if
// they match, writes them into place (unless b is the mapping's span
// already) and records the region. Chunks land in a staging buffer
// rather than the mapping because a first store to a page of the
// mapping faults it in zeroed (the blocks are reserved but unwritten),
// which cost more than the transfer's own copies; a write of whole pages
// skips that, and a region that does not check out never reaches the
// file. It is safe for concurrent use on distinct regions.
func (o *output) land(i int, b []byte, write bool) (bool, error) {
	s := &o.st.st
	if !regionOK(o.hashing(), b, i, o.regions(), s.Region, s.Hashes) {
		o.log.Warn("a region arrived corrupted; it will be fetched again", "region", i)
		return false, nil
	}
	if write {
		ok, err := writeRegion(o.f, o.directFile(), b, int64(i)*s.Region)
		if !ok {
			o.noDirect()
		}
		if err != nil {
			return true, fmt.Errorf("write region %d of %s: %w", i, o.f.Name(), err)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	setRegion(s.Have, i)
	if err := o.st.save(); err != nil {
		clearRegion(s.Have, i) // as on disk, for the count of what is kept
		return true, err
	}
	return true, nil
}

// verify says whether the file is complete and verified, with its
// digest. Each region was checked against its hash as it arrived (or,
// resumed, when the run began), and the hashes make the offer's digest
// (setHashes): a file whose every region checked out has it, and is not
// hashed again. The mapping takes no writes to a region once checked
// (its receive is over). An empty file has no regions: its digest is
// computed.
func (o *output) verify() (string, error) {
	s := &o.st.st
	if o.regions() == 0 {
		sum := o.hashing().digest(0, s.Region, nil)
		if sum != s.Digest {
			return sum, fmt.Errorf("%s mismatch: the sender's file is empty, and its digest is not that of nothing", o.hashing().label())
		}
		return sum, nil
	}
	missing := 0
	for i := range o.regions() {
		if !hasRegion(s.Have, i) {
			missing++
		}
	}
	if missing > 0 {
		return "", fmt.Errorf("%d regions are missing or did not match the sender's hashes; the next run fetches them again", missing)
	}
	return s.Digest, nil
}

// hashing is the scheme of the transfer's region hashes.
func (o *output) hashing() hashing {
	h, _ := hashingNamed(o.st.st.Hashing) // validated with the state
	return h
}

// finish syncs the verified file, gives it its final name and removes
// the state file.
func (o *output) finish() error {
	if o.mm != nil {
		if err := unix.Msync(o.mm, unix.MS_SYNC); err != nil {
			return fmt.Errorf("sync %s: %w", o.f.Name(), err)
		}
	}
	if err := o.f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", o.f.Name(), err)
	}
	if err := os.Rename(partPath(o.path), o.path); err != nil {
		return err
	}
	o.st.close()
	return os.Remove(statePath(o.path))
}

// directFile is the partial file opened for direct writes, or nil.
func (o *output) directFile() *os.File {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.tried {
		o.tried = true
		o.direct = openDirect(o.f.Name())
	}
	if o.refused {
		return nil
	}
	return o.direct
}

// noDirect stops direct writes (the file system refused one).
func (o *output) noDirect() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refused = true
}

// close unmaps and closes the files (but keeps them). Every device that
// could write into the mapping must be closed before.
func (o *output) close() {
	if o.mm != nil {
		unix.Munmap(o.mm)
		o.mm = nil
	}
	if o.direct != nil {
		o.direct.Close()
		o.direct, o.tried = nil, false
	}
	o.f.Close()
	o.st.close()
}

// kept says what a failed run leaves for the next.
func (o *output) kept() string {
	n := o.regions()
	return fmt.Sprintf("%d of %d regions are kept in %s (run again to resume)", countRegions(o.have(), n), n, partPath(o.path))
}
