#!/usr/bin/env bash
# Before (e223ad9, /work/wt-base) against after (/work/main), one run each, ABBA order, on a quiet
# machine; the backend sweep's own ratio (inagg backend / gloo, interleaved in the same processes)
# and the data plane's CPU per contribution.
set -u
out=/tmp/bench_ab; mkdir -p $out
run() {  # tree label
  local tree=$1 tag=$2
  echo "== $tag $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/log
  (cd $tree && timeout 900 .venv/bin/python benchmarks/backend_sweep.py --workers 4 --sizes 4 262144 4194304 \
      --jobs 2 --seconds 2 --name ab_sweep_$tag > $out/sweep_$tag.txt 2>&1; tail -8 $out/sweep_$tag.txt | tee -a $out/log)
  (cd $tree && timeout 600 .venv/bin/python benchmarks/dataplane_bench.py --only cpu > $out/dp_$tag.txt 2>&1; tail -6 $out/dp_$tag.txt | tee -a $out/log)
}
run /work/wt-base before1
run /work/main after1
run /work/main after2
run /work/wt-base before2
