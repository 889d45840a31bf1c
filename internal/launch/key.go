package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// A job's key authenticates its control plane: the rendezvous and the
// connection manager admit only processes that hold it. The launcher makes
// one per job and passes it in the environment (never on a command line,
// which every user of the host can read); launchers that cannot (Slurm,
// Open MPI) name a file instead, readable by its owner only.
const (
	// EnvKey holds the job's key, hex-encoded.
	EnvKey = "RVMA_KEY"
	// EnvKeyFile names a file holding the key, hex-encoded on its first
	// line; the file must not be readable by group or others.
	EnvKeyFile = "RVMA_KEY_FILE"
	// KeySize is the size of the keys NewKey makes.
	KeySize = 32
	// minKeySize is the shortest key accepted from outside.
	minKeySize = 16
)

// ErrNoKey reports that neither RVMA_KEY nor RVMA_KEY_FILE is set.
var ErrNoKey = errors.New("launch: no job key (set " + EnvKeyFile + " to a file made by `rvmarun --make-key FILE`)")

// NewKey returns a fresh random key.
func NewKey() []byte {
	k := make([]byte, KeySize)
	rand.Read(k)
	return k
}

// EncodeKey is the form a key takes in RVMA_KEY and in key files.
func EncodeKey(k []byte) string { return hex.EncodeToString(k) }

// DecodeKey parses EncodeKey's form.
func DecodeKey(s string) ([]byte, error) {
	k, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("launch: a key is hex digits: %w", err)
	}
	if len(k) < minKeySize {
		return nil, fmt.Errorf("launch: a key of %d bytes; at least %d", len(k), minKeySize)
	}
	return k, nil
}

// KeyFromEnv returns the job's key from RVMA_KEY, else from the file that
// RVMA_KEY_FILE names, or ErrNoKey. It removes RVMA_KEY from the
// environment, so that the processes a rank starts do not inherit it.
func KeyFromEnv() ([]byte, error) {
	if s, ok := os.LookupEnv(EnvKey); ok {
		os.Unsetenv(EnvKey)
		k, err := DecodeKey(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvKey, err)
		}
		return k, nil
	}
	if p := os.Getenv(EnvKeyFile); p != "" {
		return ReadKeyFile(p)
	}
	return nil, ErrNoKey
}

// ReadKeyFile reads a key file, refusing one that group or others may
// read or write (as ssh refuses such a private key).
func ReadKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("launch: key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("launch: key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("launch: key file %s has mode %v: it must be readable by its owner only (chmod 600)", path, st.Mode().Perm())
	}
	buf := make([]byte, 4096)
	n, _ := f.Read(buf)
	line, _, _ := strings.Cut(string(buf[:n]), "\n")
	k, err := DecodeKey(line)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return k, nil
}

// WriteKeyFile writes a new key to path, readable by its owner only; it
// does not overwrite an existing file.
func WriteKeyFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("launch: key file: %w", err)
	}
	if _, err := fmt.Fprintln(f, EncodeKey(NewKey())); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("launch: key file: %w", err)
	}
	return f.Close()
}
