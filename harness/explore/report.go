package explore

import (
	"fmt"
	"strings"
)

// String is r on one line, tab-separated: the schedule, the checks broken,
// the payouts' end states, the paths reached and the grants of a restarted
// replica. Two runs of the same seed and budget write the same lines, so a
// report of them can be compared with diff.
func (r Result) String() string {
	return fmt.Sprintf("%s\tchecks=%s\tended=%s\tpaths=%s\trestarted-grants=%d",
		r.Schedule, strings.Join(r.Checks, ","), strings.Join(r.Ended, ","), strings.Join(r.Paths, ","), r.RestartedGrants)
}
