export ZENEDGE_HOME=/tmp/q135/home ZENEDGE_CONFIG=/tmp/q135/config.toml
for r in 1 2 3; do
 for tree in /tmp/old5aa /work/main; do
  for c in 1 0; do
   echo "== $tree counts=$c"; (cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python /tmp/ab.py smollm2-135m 128 1 $c 2>&1 | grep round)
  done
 done
done
