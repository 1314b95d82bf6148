// Package atomicfile replaces files so that a reader, or the same program after a crash, sees
// the old content or the new, never a mix: write a temporary file in the same folder, sync it,
// rename it over the old one, sync the folder. Files are created readable by their owner only
// (they hold BGP passwords and private keys). It decides nothing about what is written.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces dir/name with data, creating dir (mode 0700) if needed. The file is mode 0600.
func Write(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, name+".*") // 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// MoveAside renames dir/name to dir/name.corrupt (replacing an older one), so that a file the
// program cannot read is kept for a human to look at but never read again. It returns the new
// path.
func MoveAside(dir, name string) (string, error) {
	to := filepath.Join(dir, name+".corrupt")
	if err := os.Rename(filepath.Join(dir, name), to); err != nil {
		return "", err
	}
	return to, nil
}
