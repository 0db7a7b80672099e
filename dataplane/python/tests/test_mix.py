"""Sources mixed by weight (`data.sources[].weight`): three Parquet sources at 0.5/0.3/0.2 through
`sluice run` on two nodes, one of them small and passed through again and again (`next_pass`). Over
the run every source gets its share of the rows within 1%, the source whose pass ends each epoch
is delivered exactly once per epoch, and every pass of every source draws each of its rows once."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pyarrow
import pyarrow.parquet

from conftest import run_example, sluice_run

EPOCHS = 3
TASK_ROWS = 100
# (rows, weight, on_exhausted). Source 0 runs out after 8,000 rows drawn (4,000 at 0.5), first in
# every epoch, so it ends each; source 1 is drawn 2,400 rows an epoch, a pass and most of another;
# source 2, 1,600 an epoch, its one pass going on across the epochs (it would end one after 30,000).
SOURCES = [(4000, 0.5, "end_epoch"), (1500, 0.3, "next_pass"), (6000, 0.2, "end_epoch")]

# Each rank reads every epoch of its ring and writes, per epoch, the (source, id) of its rows.
TRAINER = r"""
import json, os, sys
import sluice

out, epochs = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["SLUICE_RANK"])
reader = sluice.Reader()
seen = []
for epoch in range(epochs):
    rows = []
    for batch in reader:
        rows.extend(zip(batch.column("source").to_pylist(), batch.column("id").to_pylist()))
    seen.append(rows)
with open(os.path.join(out, f"rank-{rank}.json.tmp"), "w") as file:
    json.dump(seen, file)
os.replace(os.path.join(out, f"rank-{rank}.json.tmp"), os.path.join(out, f"rank-{rank}.json"))
"""


def write_source(path, source: int, rows: int) -> None:
    table = pyarrow.table(
        {
            "id": pyarrow.array(range(rows), pyarrow.int64()),
            "source": pyarrow.array([source] * rows, pyarrow.int32()),
            "value": pyarrow.array([float(row) * 0.5 for row in range(rows)], pyarrow.float32()),
        }
    )
    path.mkdir(parents=True)
    pyarrow.parquet.write_table(table, path / "part-0.parquet", row_group_size=500)


def test_three_sources_mixed_by_weight_get_their_shares_and_each_pass_draws_every_row_once(sluice_bin, tmp_path):
    sources = []
    for index, (rows, weight, on_exhausted) in enumerate(SOURCES):
        path = tmp_path / f"source-{index}"
        write_source(path, index, rows)
        sources.append(
            f'    - {{ uri: "file://{path}", format: parquet, weight: {weight}, on_exhausted: {on_exhausted} }}'
        )
    out = tmp_path / "out"
    out.mkdir()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    spec = tmp_path / "job.yaml"
    newline = "\n"
    spec.write_text(
        f"""
name: mix-{os.getpid()}
data:
  sources:
{newline.join(sources)}
  task_rows: {TASK_ROWS}
  batch_size: 64
  epochs: {EPOCHS}
  shuffle: {{ seed: 5 }}
nodes: 2
roles:
  - {{ name: worker, num: 2, command: ["{sys.executable}", "{trainer}", "{out}", "{EPOCHS}"] }}
"""
    )
    sluice_run(sluice_bin, tmp_path, spec, os.environ)
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    epochs = [[tuple(row) for rank in ranks for row in rank[epoch]] for epoch in range(EPOCHS)]

    run_rows = collections.Counter(source for epoch in epochs for source, _ in epoch)
    total = sum(run_rows.values())
    weights = sum(weight for _, weight, _ in SOURCES)
    for index, (_, weight, _) in enumerate(SOURCES):
        share = run_rows[index] / total
        assert abs(share - weight / weights) <= 0.01, f"source {index}: {share:.4f} of {total} rows, not {weight}"

    # Source 0 ends every epoch: each epoch is one pass of it, every row once.
    for epoch, rows in enumerate(epochs):
        ids = sorted(row for source, row in rows if source == 0)
        assert ids == list(range(SOURCES[0][0])), f"epoch {epoch}: source 0 exactly once"

    # Every pass draws each row once: over the run, a source of n rows drawn d rows had d // n
    # full passes, and the d % n rows of the pass under way once more.
    for index, (rows, _, _) in enumerate(SOURCES):
        times = collections.Counter(row for epoch in epochs for source, row in epoch if source == index)
        assert set(times) <= set(range(rows)), f"source {index}: rows it does not have"
        passes, partial = divmod(run_rows[index], rows)
        drawn = collections.Counter(times[row] for row in range(rows))
        expected = {count: ids for count, ids in {passes: rows - partial, passes + 1: partial}.items() if ids}
        assert drawn == expected, f"source {index}: {run_rows[index]} rows drawn over {passes} passes and {partial} more"
    assert run_rows[1] > 4 * SOURCES[1][0], "source 1 passed through more than four times"
    assert run_rows[2] < SOURCES[2][0], "source 2's pass goes on across the epochs"


def test_the_mix_example_draws_its_sources_by_weight(sluice_bin, tmp_path):
    """`examples/mix.yaml` with `examples/count_sources.py`, as its comment runs it, on a tenth of
    its rows."""
    data = tmp_path / "data"
    for name, rows, files, seed in [("web", 40000, 4, 0), ("books", 10000, 1, 1), ("code", 50000, 2, 2)]:
        subprocess.run(
            [
                str(sluice_bin), "gen", "--out", str(data / name / f"origin={name}"), "--rows", str(rows),
                "--files", str(files), "--seed", str(seed),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    env = dict(os.environ, SLUICE_EXAMPLE_DATA=str(data))
    printed = run_example(sluice_bin, tmp_path, "mix.yaml", env, 2)
    assert sorted((line["rank"], line["epoch"]) for line in printed) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    per_epoch = [collections.Counter(), collections.Counter()]
    for line in printed:
        per_epoch[line["epoch"]].update(line["rows"])
    for epoch, rows in enumerate(per_epoch):
        assert rows["web"] == 40000, f"epoch {epoch}: one pass of web ends it: {rows}"
    run_rows = per_epoch[0] + per_epoch[1]
    total = sum(run_rows.values())
    for name, share in [("web", 0.5), ("books", 0.3), ("code", 0.2)]:
        assert abs(run_rows[name] / total - share) <= 0.02, f"{name}: {run_rows[name]} of {total} rows"
    assert run_rows["books"] > 4 * 10000, "books passed through more than four times"
