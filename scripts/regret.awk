# The regret of weft-perf's tuned picks in a table run with --algos LIST (awk -v algos=LIST -f
# scripts/regret.awk table.txt): per row, the pick's own forced time over the fastest forced time,
# and the fastest; last, the worst. Rows of size 0 (empty calls) are skipped. The table must be
# run without --compare, whose two columns would come before the forced ones.
BEGIN { n = split(algos, a, ","); worst = 1 }
/^ +[0-9]/ && $1 > 0 {
  pick = $14; sub(/\/.*/, "", pick)
  best = 0; bi = 0; mine = 0
  for (k = 1; k <= n; k++) {
    t = $(15 + 3 * (k - 1))
    if (t == "n/a") continue
    t += 0
    if (bi == 0 || t < best) { best = t; bi = k }
    if (a[k] == pick) mine = t
  }
  r = (mine > 0 && best > 0) ? mine / best : 0
  if (r > worst) worst = r
  printf "%12s %-16s tuned %9s pick %9s best %9s %-9s regret %.3f\n", $1, $14, $6, mine, best, a[bi], r
}
END { printf "worst regret %.3f\n", worst }
