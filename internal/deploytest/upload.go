package deploytest

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// IgnoreFile is a parsed .gcloudignore: gitignore syntax plus gcloud's
// "#!include:FILE" directive (cloud.google.com/sdk/gcloud/reference/topic/gcloudignore).
// It implements what the lab's file uses: comments, negation, a leading
// "/" or an inner "/" anchoring to the root, "**/" for any depth, a
// trailing "/" for directories, and the shell globs of path.Match.
type IgnoreFile struct {
	rules []ignoreRule
}

type ignoreRule struct {
	pattern  string
	negate   bool
	dirOnly  bool
	anchored bool
}

// LoadIgnoreFile reads root/name and the files it includes.
func LoadIgnoreFile(root, name string) (*IgnoreFile, error) {
	f := &IgnoreFile{}
	if err := f.read(root, name, 0); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *IgnoreFile) read(root, name string, depth int) error {
	if depth > 4 {
		return fmt.Errorf("%w: %s: includes nested too deep", ErrDecode, name)
	}
	fh, err := os.Open(filepath.Join(root, name))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDecode, err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if inc, ok := strings.CutPrefix(line, "#!include:"); ok {
			if err := f.read(root, inc, depth+1); err != nil {
				return err
			}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{}
		if p, ok := strings.CutPrefix(line, "!"); ok {
			r.negate, line = true, p
		}
		if p, ok := strings.CutSuffix(line, "/"); ok {
			r.dirOnly, line = true, p
		}
		if p, ok := strings.CutPrefix(line, "/"); ok {
			r.anchored, line = true, p
		} else if strings.Contains(line, "/") && !strings.HasPrefix(line, "**/") {
			r.anchored = true
		}
		line = strings.TrimPrefix(line, "**/")
		r.pattern = line
		f.rules = append(f.rules, r)
	}
	return sc.Err()
}

// Ignored reports whether rel (slash-separated, relative to the root) is
// left out of the upload: it or one of its parent directories matches
// the last rule that decides on it.
func (f *IgnoreFile) Ignored(rel string) bool {
	parts := strings.Split(path.Clean(rel), "/")
	for i := 1; i <= len(parts); i++ {
		if f.decides(strings.Join(parts[:i], "/"), i < len(parts)) {
			return true
		}
	}
	return false
}

func (f *IgnoreFile) decides(p string, isDir bool) bool {
	ignored := false
	for _, r := range f.rules {
		if r.dirOnly && !isDir {
			continue
		}
		if r.match(p) {
			ignored = !r.negate
		}
	}
	return ignored
}

func (r ignoreRule) match(p string) bool {
	if r.anchored {
		ok, _ := path.Match(r.pattern, p)
		return ok
	}
	// Unanchored: the pattern matches the path's last elements.
	n := strings.Count(r.pattern, "/") + 1
	parts := strings.Split(p, "/")
	if len(parts) < n {
		return false
	}
	ok, _ := path.Match(r.pattern, strings.Join(parts[len(parts)-n:], "/"))
	return ok
}

// CheckUpload returns the problems of an ignore file against what must be
// left out of the upload and what must be kept (paths relative to the
// root, files or directories' contents).
func CheckUpload(f *IgnoreFile, leftOut, kept []string) []string {
	var out []string
	for _, p := range leftOut {
		if !f.Ignored(p) {
			out = append(out, fmt.Sprintf("%s would be uploaded with the build's source", p))
		}
	}
	for _, p := range kept {
		if f.Ignored(p) {
			out = append(out, fmt.Sprintf("%s is left out of the upload, but the build reads it", p))
		}
	}
	return out
}
