"""`python -m zenedge.bench [run|dtypes|merge|pool] [options]`: the same commands as `zenedge bench`."""

import sys

from zenedge.cli.bench_cmds import bench

if __name__ == "__main__":
    sys.exit(bench.main(prog_name="python -m zenedge.bench"))
