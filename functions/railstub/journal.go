package railstub

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// journal is the append-only JSON Lines file of the records: one
// rail.Submission per line, each line ending with '\n' and fsynced before the
// submission is answered. It is used under Stub.mu only.
type journal struct {
	f    *os.File
	path string
}

// openJournal opens (creating) the journal at path and returns it with its
// records. A last line without its '\n' is the trace of a write whose fsync
// never completed, so whose answer was never sent: it is cut off, with a
// warning. Any other malformed line, or a sequence gap, is an error
// wrapping ErrJournal: the stub refuses to start rather than forget or
// invent a movement of money.
func openJournal(path string, log *slog.Logger) (*journal, []rail.Submission, error) {
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: open: %v", ErrJournal, err)
	}
	fail := func(err error) (*journal, []rail.Submission, error) {
		_ = f.Close()
		return nil, nil, err
	}
	if created {
		// Make the new file's directory entry durable too.
		if err := syncDir(filepath.Dir(path)); err != nil {
			return fail(fmt.Errorf("%w: sync directory: %v", ErrJournal, err))
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fail(fmt.Errorf("%w: read %s: %v", ErrJournal, path, err))
	}
	var recs []rail.Submission
	good := 0 // length of the prefix made of complete lines
	for lineNo := 1; good < len(data); lineNo++ {
		nl := bytes.IndexByte(data[good:], '\n')
		if nl < 0 {
			torn := len(data) - good
			log.Warn("rail stub journal ends with a torn record; cutting it off (its answer was never sent)",
				"event", EventJournalTorn, "path", path, "line", lineNo, "bytes", torn)
			if err := f.Truncate(int64(good)); err != nil {
				return fail(fmt.Errorf("%w: cut torn record: %v", ErrJournal, err))
			}
			if err := f.Sync(); err != nil {
				return fail(fmt.Errorf("%w: sync: %v", ErrJournal, err))
			}
			break
		}
		line := data[good : good+nl]
		var rec rail.Submission
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return fail(fmt.Errorf("%w: %s line %d: %v", ErrJournal, path, lineNo, err))
		}
		if dec.More() {
			return fail(fmt.Errorf("%w: %s line %d: trailing data", ErrJournal, path, lineNo))
		}
		if want := int64(len(recs)) + 1; rec.Seq != want {
			return fail(fmt.Errorf("%w: %s line %d: seq %d, want %d", ErrJournal, path, lineNo, rec.Seq, want))
		}
		recs = append(recs, rec)
		good += nl + 1
	}
	return &journal{f: f, path: path}, recs, nil
}

// append writes rec as one line and fsyncs the file. An error wraps
// ErrJournal; the line may then be partly or wholly on disk.
func (j *journal) append(rec rail.Submission) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("%w: encode record %d: %v", ErrJournal, rec.Seq, err)
	}
	line = append(line, '\n')
	if _, err := j.f.Write(line); err != nil {
		return fmt.Errorf("%w: write %s: %v", ErrJournal, j.path, err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("%w: sync %s: %v", ErrJournal, j.path, err)
	}
	return nil
}

func (j *journal) close() error {
	if err := j.f.Close(); err != nil {
		return fmt.Errorf("%w: close %s: %v", ErrJournal, j.path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
