"""Counts, per epoch, the rows a trainer got from each source of a mixed job: the trainer of
``examples/mix.yaml``, whose sources carry their name in the partition column ``origin``.

Run it as that spec's comment says; its one argument is the number of epochs to read. Each trainer
prints one JSON line per epoch.
"""

import collections
import json
import os
import sys

import sluice


def main():
    epochs = int(sys.argv[1])
    rank = int(os.environ["SLUICE_RANK"])
    reader = sluice.Reader()
    for epoch in range(epochs):
        rows = collections.Counter()
        for batch in reader:
            origins = batch.column("origin").value_counts()
            for entry in origins.to_pylist():
                rows[entry["values"]] += entry["counts"]
        print(json.dumps({"rank": rank, "epoch": epoch, "rows": dict(rows)}), flush=True)


if __name__ == "__main__":
    main()
