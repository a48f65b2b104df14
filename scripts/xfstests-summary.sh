#!/bin/bash
# The summary of a scripts/xfstests.sh run: the tests that passed, failed
# and did not run, from ./check's output (check.out, complete even when
# TIME_LIMIT cut the run short), and every not-run reason (the .notrun
# files in results/) with the number of tests that gave it.
#   scripts/xfstests-summary.sh .xfstests/20261127-030000-ganesha
set -euo pipefail
dir=${1:?usage: xfstests-summary.sh RUN_DIR}
out=$dir/check.out
[ -f "$out" ] || { echo "xfstests-summary: no $out" >&2; exit 1; }

# check prints one line per test: "generic/001 3s ...  4s" when it passed,
# "generic/002 [not run] why", "generic/003 - output mismatch (...)" or
# "[failed, exit status N]" or "_check_dmesg: ..." when it failed; a test
# still running when the run was stopped has no time at the end.
awk -v notrun_dir="$dir/results" '
/^[a-z0-9]+\/[0-9]+( |$)/ {
	t = $1
	if ($0 ~ /\[not run\]/) { st[t] = "notrun" }
	else if ($0 ~ /\[expunged\]/) { st[t] = "expunged" }
	else if ($0 ~ /output mismatch|\[failed|_check_dmesg|_check_.*fs|\[dumped core\]|no qualified output/) { st[t] = "failed" }
	else if ($0 ~ / [0-9]+s$/) { st[t] = "passed" }
	else { st[t] = "unfinished" }
	order[++n] = t
}
END {
	for (i = 1; i <= n; i++) { t = order[i]; if (!(t in seen)) { seen[t] = 1; c[st[t]]++; l[st[t]] = l[st[t]] " " t } }
	printf "tests %d\n", length(seen)
	split("passed failed notrun expunged unfinished", kinds, " ")
	for (k = 1; k <= 5; k++) printf "%s %d\n", kinds[k], c[kinds[k]] + 0
	# Not-run tests are listed by reason below, not by name.
	for (k = 2; k <= 5; k++) if (k != 3 && c[kinds[k]] > 0) printf "%s:%s\n", kinds[k], l[kinds[k]]
}' "$out"

# Not-run reasons, most frequent first (the run's PID taken out of the
# device names xfstests.sh gives, so that runs compare).
echo "not-run reasons (count, reason):"
find "$dir/results" -name '*.notrun' -print0 2>/dev/null |
	xargs -0 -r -n 50 cat | sed -E 's/[[:space:]]*$//; s/(test|scratch)-[0-9]+/\1-PID/g' | sort | uniq -c | sort -rn
